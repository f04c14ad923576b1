//! probes (issue 3)
