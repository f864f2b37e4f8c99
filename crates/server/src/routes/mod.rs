//! The handlers of the core resources, one file each; every handler
//! extracts, calls `AppState` and answers (`crate::http` holds what they
//! share). The other resources' handlers sit beside their modules.

mod exec;
mod forks;
mod sandboxes;

pub use exec::*;
pub use forks::*;
pub use sandboxes::*;
