//! The host's side of a sandbox's Python REPL (docs/repl-protocol.md),
//! free of HTTP and of the registry: every front end that runs code in a
//! REPL goes through it.
//!
//! - `control`: length-prefixed frames on the REPL's control socket;
//! - `journal`: the REPL's record of output it wrote but the host may not
//!   have read, recovered after the REPL dies;
//! - `session`: one REPL process, and the pump that merges its control
//!   frames with its raw stdout/stderr into one ordered stream;
//! - `events`: that stream cut into numbered, timestamped protocol events,
//!   with the replay buffer.

pub mod control;
pub mod events;
/// A stand-in REPL for tests without Python or root (feature `fake`).
#[cfg(any(test, feature = "fake"))]
pub mod fake;
pub mod journal;
pub mod session;

pub use events::{now_ms, EventSink, Replay};
pub use session::{ReplItem, ReplSession, SessionError, REPL_BOOTSTRAP, REPL_SOURCE};
