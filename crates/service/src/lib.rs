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
pub mod contexts;
pub mod cpu_boost;
pub mod create;
pub mod custom_templates;
pub mod destroy;
pub mod directory;
pub mod disk;
pub mod drain;
pub mod egress;
pub mod engine;
pub mod error;
pub mod exec;
pub mod fork;
pub mod fork_steps;
pub mod hibernate;
pub mod ids;
pub mod keys;
pub mod lifecycle;
pub mod merged;
pub mod metrics;
pub mod pause;
pub mod pool;
pub mod process_fork;
pub mod process_spaces;
pub mod records;
pub mod sandbox;
pub mod scrape;
pub mod setup;
pub mod space_store;
pub mod spaces;
pub mod start;
pub mod state;
pub mod templates;
pub mod timers;
pub mod warm;
pub mod watch;
pub mod write_behind;

pub use config::{SandboxLimits, ServerConfig};
pub use error::Error;
/// One sandbox's files and terminals, where front ends have always found them.
pub use sandbox::{files, pty};
pub use state::Service;
pub use templates::Templates;

#[cfg(test)]
mod tests;
