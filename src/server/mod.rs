//! TLS listener, certificate resolver and reload, routes, limits, shutdown (issue 3).
