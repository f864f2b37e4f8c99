//! Wire types of the forkbox HTTP API, shared by the server, the CLI and tests.
//!
//! The request and response shapes follow the HTTP contract of the published
//! `podflare` Python SDK (docs/api.md); fields that SDK does not know are
//! additions it ignores.

pub mod api;
pub mod e2b_routing;
pub mod egress;
pub mod event;
pub mod files;
pub mod keys;
pub mod state;
pub mod templates;

pub use api::*;
pub use egress::{Egress, EgressAllow, EgressBody};
pub use event::{Event, EventKind};
pub use files::*;
pub use state::*;
pub use templates::*;
