//! inflate (issue 3)
