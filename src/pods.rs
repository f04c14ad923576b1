//! pods (issue 3)
