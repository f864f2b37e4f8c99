//! The `jail` engine: sandboxes made of Linux namespaces, cgroups, seccomp and
//! an overlay root on a copy-on-write volume (docs/architecture.md#processes-and-namespaces).
//!
//! Layout: `engine` is the API the server uses; `shim` is the per-family
//! supervisor process (and the member init it forks), `supervisor` the
//! server's connection to one; `channel` carries typed
//! messages between them; `cgroup`, `volume`, `ids` and `policy` are the
//! resources and rules each sandbox gets; `sys` wraps raw syscalls.

pub mod cgroup;
pub mod channel;
pub mod diff;
pub mod engine;
pub mod error;
pub mod forkplan;
pub mod fs;
pub mod ids;
pub mod layer_copy;
pub mod net;
pub mod notify;
pub mod policy;
pub mod ports;
pub mod pty;
pub mod shim;
mod supervisor;
pub mod sys;
pub mod tools;
pub mod trust;
pub mod volume;

pub use cgroup::Limits;
pub use engine::{
    Adopted, CommandControl, CommandProcess, ForkChild, Jail, JailConfig, Kept, MemberRecord, ReplProcess, Sandbox, SandboxSpec, TerminalProcess,
};
pub use error::{Error, Result};
pub use shim::messages::ExitStatus;
