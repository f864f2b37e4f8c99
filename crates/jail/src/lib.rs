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
pub mod egress;
mod engine;
mod error;
pub mod fork_fds;
mod forkplan;
pub mod fs;
pub mod host_addrs;
mod ids;
mod layer_copy;
pub mod net;
pub mod notify;
mod policy;
pub mod ports;
pub mod pty;
mod shim;
mod supervisor;
pub mod sys;
mod tools;
pub mod trust;
pub mod volume;

pub use cgroup::Limits;
pub use engine::{
    Adopted, AfterDump, CommandControl, CommandProcess, ForkChild, Jail, JailConfig, Kept, MemberRecord, ReplProcess, Rooting, Sandbox, SandboxSpec,
    TerminalProcess,
};
pub use error::{Error, Result};
/// What a REPL's fork must carry over, read from `/proc` (docs/fork.md).
pub use forkplan::plan_for as fork_plan;
/// How many families (sandboxes) one server's block of host ids holds.
pub use ids::SLOT_BLOCKS;
pub use layer_copy::Copied;
pub use shim::messages::{Edges, ExitStatus, RunAs};
pub use tools::require_tool;

/// The processes the engine runs as the server's own executable under
/// other names: its `main` hands over to these first thing.
pub mod entry {
    /// A sandbox's init (argv[0] `INIT_ARGV0`).
    pub use crate::shim::init::{main as init_main, INIT_ARGV0};
    /// A family's supervisor (`forkbox __shim '<json>'`).
    pub use crate::shim::main as shim_main;
}
