//! One listener, two protocols: every request is the podflare/forkbox
//! API's unless it is E2B's (docs/e2b.md). E2B sandbox traffic names its
//! sandbox and port in headers or the Host (`e2b::routed`) and goes to
//! envd, the code interpreter or the port proxy; E2B's control-plane paths
//! (`/sandboxes`, `/v2/...`) go to its control plane. The two share
//! nothing but the service underneath.

use axum::extract::{Request, State};
use axum::http::{StatusCode, Uri};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use axum::Router;
use tower::ServiceExt;

use crate::AppState;

/// The E2B routers, built once.
#[derive(Clone)]
pub struct FrontDoor {
    pub state: AppState,
    pub e2b: e2b::E2b,
    envd: Router,
    interpreter: Router,
    control: Router,
}

impl FrontDoor {
    pub fn new(state: AppState) -> FrontDoor {
        let tokens = e2b::Tokens::load(&state.inner.config.state_dir).unwrap_or_else(|err| {
            // E2B access tokens then last only as long as this server.
            tracing::warn!(%err, "could not keep the E2B token secret in the state directory");
            e2b::Tokens::from_secret(rand::random())
        });
        let e2b = e2b::E2b::new(state.clone(), tokens);
        let wrap = |r: Router| r.route_layer(axum::middleware::from_fn(crate::trace::layer)).route_layer(axum::middleware::from_fn(crate::http::detach));
        FrontDoor {
            envd: wrap(e2b::envd_router(e2b.clone())),
            interpreter: wrap(e2b::interpreter_router(e2b.clone())),
            control: wrap(e2b::control_router(e2b.clone())),
            state,
            e2b,
        }
    }
}

/// Send E2B's requests to E2B's routers; the rest on to forkbox's.
pub async fn dispatch(State(door): State<FrontDoor>, mut req: Request, next: Next) -> Response {
    let mut routed = e2b::routed(req.headers());
    if routed.is_none() && req.uri().path() == "/files" {
        // forkbox's own API has no `/files`: this is a signed E2B link
        // that names no sandbox, or nothing it may reach.
        routed = door.e2b.signed_link(req.method(), req.uri()).await;
        if routed.is_none() {
            return e2b::error::ApiError::new(StatusCode::UNAUTHORIZED, "invalid signature, or no sandbox signed this link").into_response();
        }
    }
    if let Some(routed) = routed {
        if door.state.inner.drain.is_draining() {
            return e2b::error::ApiError::new(StatusCode::SERVICE_UNAVAILABLE, "the server is shutting down").into_response();
        }
        req.extensions_mut().insert(routed.clone());
        let router = match routed.port {
            e2b::ENVD_PORT => door.envd.clone(),
            e2b::INTERPRETER_PORT => door.interpreter.clone(),
            port => return proxy(&door, &routed.sandbox, port, req).await,
        };
        return router.oneshot(req).await.unwrap_or_else(|e| match e {});
    }
    if e2b::is_control_path(req.uri().path()) {
        if door.state.inner.drain.is_draining() {
            return e2b::error::ApiError::new(StatusCode::SERVICE_UNAVAILABLE, "the server is shutting down").into_response();
        }
        return door.control.clone().oneshot(req).await.unwrap_or_else(|e| match e {});
    }
    next.run(req).await
}

/// A sandbox port reached by E2B's routing: open when the sandbox's ports
/// are public (E2B's default), else only with its traffic token.
async fn proxy(door: &FrontDoor, id: &str, port: u16, req: Request) -> Response {
    let not_found = || e2b::error::ApiError::new(StatusCode::BAD_GATEWAY, format!("The sandbox {id} was not found")).into_response();
    let Ok(entry) = door.state.get(&service::keys::Caller::anonymous(), id).await else { return not_found() };
    let token_ok = e2b::auth::presented(req.headers()).is_some_and(|t| door.e2b.tokens.check(&entry.id, t));
    if !entry.settings.public_ports && !token_ok {
        // The same answer as for no sandbox: its ports are not public.
        return not_found();
    }
    let target: Uri = match req.uri().path_and_query().map(|p| p.as_str()).unwrap_or("/").parse() {
        Ok(t) => t,
        Err(_) => return e2b::error::ApiError::bad_request("invalid path").into_response(),
    };
    match crate::routes::ports::forward(&door.state, entry, port, req, "", target).await {
        Ok(r) => r,
        Err(e) => {
            // E2B's proxy words a closed port so the SDKs recognise it.
            let status = e.status();
            let message = if status == StatusCode::BAD_GATEWAY { format!("{e}: port is not open") } else { e.to_string() };
            e2b::error::ApiError::new(status, message).into_response()
        }
    }
}
