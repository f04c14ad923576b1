//! The fast JSON reader of kube-overcommit's hot path. It knows JSON, not Kubernetes: what to
//! read from a review, and where reading may stop, is decided by the caller.
//!
//! - [`scan`]: walk an object's members and step over values without building them.
//! - [`plain`]: plainly written strings and objects of strings, read without serde_json
//!   (anything else is left to serde_json, so answers and errors stay serde_json's).
//! - [`borrowed`]: serde adapters that borrow strings from the body where serde would copy.
//! - [`map`]: [`StrMap`], the sorted-vector map those readers fill.

pub mod borrowed;
pub mod map;
pub mod plain;
pub mod scan;
mod swar;
#[doc(hidden)]
pub mod testing;
pub mod write;

pub use map::{StrMap, VecMap};
pub use write::write_str;
