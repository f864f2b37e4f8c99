//! The E2B front end (docs/e2b.md): the HTTP contract of the unchanged
//! `e2b` and `e2b-code-interpreter` SDKs, translated into the same
//! `service::Service` the podflare routes use. Three faces, one listener:
//!
//! - the control plane (`control`): `/sandboxes`, `/v2/sandboxes`,
//!   `/snapshots`, `/templates`, authenticated by `X-API-KEY`;
//! - envd, a sandbox's port 49983 (`envd`): Connect RPCs for processes
//!   (`process`) and files (`filesystem`), and REST `/files`, `/health`;
//! - the code interpreter, port 49999 (`interpreter`), on forkbox's REPL.
//!
//! Sandbox traffic names its sandbox and port in the `E2b-Sandbox-Id` and
//! `E2b-Sandbox-Port` headers (with `E2B_SANDBOX_URL` set) or in the Host
//! (`{port}-{id}.{domain}`); the server's front door (crates/server) reads
//! them with [`routed`] and hands the request to [`envd_router`],
//! [`interpreter_router`] or its port proxy.

pub mod auth;
pub mod connect;
pub mod control;
pub mod envd;
pub mod error;
pub mod filesystem;
pub mod interpreter;
pub mod process;
pub mod wire;

use std::sync::Arc;

use axum::extract::{FromRequestParts, Request, State};
use axum::http::{request::Parts, HeaderMap};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use service::keys::Caller;
use service::sandbox::SandboxEntry;
use service::Service;

pub use protocol::e2b_routing::{is_control_path, Routed, ENVD_PORT, INTERPRETER_PORT};

pub use auth::Tokens;

/// The envd version forkbox answers as. The SDKs switch features on by it
/// (docs/design/e2b-wire-contract.md §2.6): 0.6.4 turns on all of them —
/// octet-stream, gzip and streamed uploads, `CloseStdin`, metrics, file
/// metadata, `include_entry` and `allow_network_mounts` watches (forkbox
/// sandboxes mount no network filesystems, so that flag changes nothing).
pub const ENVD_VERSION: &str = "0.6.4";

/// What every E2B handler gets.
#[derive(Clone)]
pub struct E2b {
    pub service: Service,
    pub tokens: Arc<Tokens>,
    /// envd's polled watchers (filesystem.rs).
    pub watchers: Arc<filesystem::Watchers>,
}

impl E2b {
    pub fn new(service: Service, tokens: Tokens) -> E2b {
        E2b { service, tokens: Arc::new(tokens), watchers: Default::default() }
    }
}

/// The sandbox and port a request is for (E2B's routing headers or Host).
pub fn routed(headers: &HeaderMap) -> Option<Routed> {
    protocol::e2b_routing::routed(|name| headers.get(name).and_then(|v| v.to_str().ok()))
}

impl E2b {
    /// The sandbox a signed `/files` link is for when it names none: the
    /// SDKs build those links from `E2B_SANDBOX_URL` alone, with no id in
    /// host or headers, so the sandbox is the one whose token signed it.
    pub async fn signed_link(&self, method: &axum::http::Method, uri: &axum::http::Uri) -> Option<Routed> {
        let operation = envd::FilesQuery::operation(method)?;
        let q = envd::FilesQuery::signed_link(uri)?;
        let entry = self.service.list(&Caller::anonymous()).await.into_iter().find(|e| q.signed_by(operation, &self.tokens.token(&e.id)))?;
        Some(Routed { sandbox: entry.id.clone(), port: ENVD_PORT })
    }
}

/// The sandbox an envd or interpreter request is for, its access token
/// checked (`authorize`); handlers take it as an argument.
#[derive(Clone)]
pub struct Sandbox(pub Arc<SandboxEntry>);

impl<S: Send + Sync> FromRequestParts<S> for Sandbox {
    type Rejection = error::ApiError;

    async fn from_request_parts(parts: &mut Parts, _: &S) -> Result<Self, Self::Rejection> {
        parts.extensions.get::<Sandbox>().cloned().ok_or_else(|| error::ApiError::new(axum::http::StatusCode::UNAUTHORIZED, "no access token"))
    }
}

/// The answer E2B's own proxy gives for a sandbox that is not there; the
/// SDKs read "was not found" as "the sandbox is not running".
fn not_running(id: &str) -> Response {
    error::ApiError::new(axum::http::StatusCode::BAD_GATEWAY, format!("The sandbox {id} was not found")).into_response()
}

/// Look the routed sandbox up and check the request's access token (a
/// signed `/files` link stands in for it: envd::files checks those).
async fn authorize(State(e2b): State<E2b>, mut req: Request, next: Next) -> Response {
    let Some(routed) = req.extensions().get::<Routed>().cloned() else {
        return not_running("?");
    };
    // Any caller first: the token, not the key, says who may use it.
    let entry = match e2b.service.get(&Caller::anonymous(), &routed.sandbox).await {
        Ok(e) => e,
        Err(_) => return not_running(&routed.sandbox),
    };
    let token_ok = auth::presented(req.headers()).is_some_and(|t| e2b.tokens.check(&entry.id, t));
    let signed = envd::FilesQuery::signed_link(req.uri()).is_some();
    let open = req.uri().path() == "/health";
    if !token_ok && !signed && !open {
        return error::ApiError::new(axum::http::StatusCode::UNAUTHORIZED, "missing or invalid access token (X-Access-Token)").into_response();
    }
    if token_ok {
        req.extensions_mut().insert(Sandbox(Arc::clone(&entry)));
    } else {
        req.extensions_mut().insert(envd::Unverified(entry));
    }
    next.run(req).await
}

/// envd (port 49983): processes, files, health.
pub fn envd_router(e2b: E2b) -> axum::Router {
    envd::router()
        .route("/process.Process/{method}", axum::routing::post(process::call))
        .route("/filesystem.Filesystem/{method}", axum::routing::post(filesystem::call))
        .fallback(|| async { error::RpcError::new(error::Code::Unimplemented, "no such envd method") })
        .layer(axum::middleware::from_fn_with_state(e2b.clone(), authorize))
        .with_state(e2b)
}

/// The code interpreter (port 49999).
pub fn interpreter_router(e2b: E2b) -> axum::Router {
    interpreter::router().layer(axum::middleware::from_fn_with_state(e2b.clone(), authorize)).with_state(e2b)
}

/// The control plane.
pub fn control_router(e2b: E2b) -> axum::Router {
    control::router().with_state(e2b)
}
