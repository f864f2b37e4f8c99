//! The routes, one file per resource. Every handler extracts, calls the
//! service (`service::Service`) and answers; `crate::http` holds what they
//! share and `crate::error` maps the service's errors to status codes.

pub mod checkpoints;
pub mod egress;
mod exec;
pub mod files;
mod forks;
pub mod metrics;
pub mod pause;
pub mod ports;
pub mod pty;
mod sandboxes;
pub mod spaces;
pub mod templates;
pub mod watch;

pub use exec::*;
pub use forks::*;
pub use sandboxes::*;
