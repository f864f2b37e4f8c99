//! A sandbox's way out through an operator's HTTP proxy
//! (`forkbox serve --egress-proxy`, docs/network.md#upstream-proxies).
//!
//! The server gives each sandbox with egress a proxy of its own (`serve`),
//! listening inside the sandbox's network namespace, and points the
//! sandbox's `HTTP_PROXY` / `HTTPS_PROXY` at it. The sandbox has no other
//! way out. Every request is checked against the sandbox's policy *before*
//! anything is sent upstream, so a name the policy does not allow never
//! reaches the operator's proxy; allowed requests go upstream with the
//! operator's credentials, which the sandbox never sees.

mod proxy;
mod target;
mod upstream;

pub use proxy::{serve, Limits, Policy};
pub use target::{Host, Target};
pub use upstream::{Upstream, UpstreamError};
