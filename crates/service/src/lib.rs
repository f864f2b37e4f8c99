//! The forkbox sandbox service: everything a front end calls, with no HTTP
//! in it. The podflare/forkbox HTTP routes (crates/server) translate into
//! it today; the E2B routes and a cluster gateway will tomorrow.
//!
//! Data path: a front end → [`Service`] (registry, lifecycle, caps and
//! quotas) → [`sandbox::SandboxEntry`] (its exec queue) →
//! `repl_host::ReplSession` (the REPL's frames) → `repl_host::EventSink` →
//! the front end's answer. The engine (`jail`) makes, forks, pauses and
//! destroys the sandboxes underneath.
//!
//! Errors are [`Error`]: kinds a front end maps to its protocol, with
//! messages a client may see (what is not for it is logged).

pub mod adopt;
pub mod capacity;
pub mod checkpoints;
pub mod config;
pub mod cpu_boost;
pub mod disk;
pub mod drain;
pub mod egress;
pub mod engine;
pub mod error;
pub mod exec;
pub mod files;
pub mod fork;
pub mod keys;
pub mod lifecycle;
pub mod metrics;
pub mod pause;
pub mod pool;
pub mod pty;
pub mod records;
pub mod sandbox;
pub mod setup;
pub mod spaces;
pub mod start;
pub mod state;
pub mod templates;
pub mod watch;

pub use config::{SandboxLimits, ServerConfig};
pub use error::Error;
pub use state::Service;
pub use templates::Templates;

#[cfg(test)]
mod tests;
