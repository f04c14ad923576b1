//! metrics (issue 3)
