//! The forkbox HTTP server: the podflare-compatible API over the sandbox
//! service (crates/service). It only translates: extract, call the
//! service, map its errors to status codes (`error`), stream events.
//!
//! Data path: request → `routes` (parse, validate) → `service::Service`
//! (registry, lifecycle) → `SandboxEntry` (exec queue) → the REPL's frames
//! → `repl_host::EventSink` → NDJSON response.

pub mod error;
pub mod front_door;
pub mod http;
pub mod keepalive;
pub mod openapi;
pub mod routes;
pub mod trace;

use std::net::SocketAddr;

use axum::extract::DefaultBodyLimit;
use axum::routing::{any, delete, get, post};
use axum::Router;
use service::start::Exit;

/// The state every handler gets: the service.
pub use service::Service as AppState;
pub use service::{keys, SandboxLimits, ServerConfig, Templates};

/// The runtime `serve` runs on. Its threads, this one included, get the
/// REPLs' short scheduler slice (`sandbox::REPL_TIME_SLICE`): an exec wakes
/// a server thread twice, for the request and for the REPL's answer, and
/// beside CPU hogs each wake-up would otherwise wait out a hog's slice
/// (bench/noisy.py, docs/reliability.md#noisy-neighbours). What the server
/// starts (shims, pasta) gets the default slice back.
pub fn runtime() -> std::io::Result<tokio::runtime::Runtime> {
    fn short_slice() {
        if let Err(e) = jail::sys::set_thread_time_slice(0, service::sandbox::REPL_TIME_SLICE) {
            tracing::debug!(err = %e, "could not shorten a server thread's time slice");
        }
    }
    short_slice();
    tokio::runtime::Builder::new_multi_thread().enable_all().on_thread_start(short_slice).build()
}

/// The router, separate from any socket so tests can drive it directly:
/// forkbox's API, and E2B's in front of it (front_door.rs).
pub fn app(state: AppState) -> Router {
    let door = front_door::FrontDoor::new(state.clone());
    let secret = state.inner.config.cluster_secret_sha256;
    let app = forkbox_api(state).layer(axum::middleware::from_fn_with_state(door, front_door::dispatch));
    match secret {
        // Outermost: no route, E2B's included, answers without it.
        Some(sha256) => app.layer(axum::middleware::from_fn_with_state(sha256, cluster_gate)),
        None => app,
    }
}

/// The header a cluster's gateways show the cluster secret in.
pub const CLUSTER_HEADER: &str = "x-forkbox-cluster";

/// A cluster node answers its gateways only: every request shows the
/// cluster secret (compared by hash, in constant time).
async fn cluster_gate(
    axum::extract::State(sha256): axum::extract::State<[u8; 32]>,
    req: axum::extract::Request,
    next: axum::middleware::Next,
) -> axum::response::Response {
    use sha2::Digest;
    let shown = req.headers().get(CLUSTER_HEADER).map(|v| sha2::Sha256::digest(v.as_bytes()));
    let ok = shown.is_some_and(|h| h.iter().zip(sha256.iter()).fold(0u8, |acc, (a, b)| acc | (a ^ b)) == 0);
    if !ok {
        let body = protocol::ErrorBody { error: "this node serves its cluster's gateways only (missing or wrong cluster secret)".into(), progress: None };
        return axum::response::IntoResponse::into_response((axum::http::StatusCode::UNAUTHORIZED, axum::Json(body)));
    }
    next.run(req).await
}

/// The podflare/forkbox API alone.
pub fn forkbox_api(state: AppState) -> Router {
    Router::new()
        .route("/v1/healthz", get(routes::healthz))
        .route("/metrics", get(routes::metrics::scrape))
        .route("/v1/openapi.json", get(openapi::openapi_json))
        .route("/v1/templates", get(routes::templates::list).post(routes::templates::build).layer(DefaultBodyLimit::max(routes::templates::MAX_RECIPE_BODY)))
        .route("/v1/templates/{name}", get(routes::templates::get).delete(routes::templates::delete))
        .route("/v1/sandboxes/{id}/template", post(routes::templates::save))
        .route("/v1/pool", get(routes::pool))
        .route("/v1/sandboxes", post(routes::create).get(routes::list))
        .route("/v1/sandboxes/{id}", get(routes::info).delete(routes::destroy))
        .route("/v1/sandboxes/{id}/exec", post(routes::exec))
        .route("/v1/sandboxes/{id}/replay", get(routes::replay))
        .route("/v1/sandboxes/{id}/fork", post(routes::fork))
        .route("/v1/sandboxes/{id}/pause", post(routes::pause::pause))
        .route("/v1/sandboxes/{id}/resume", post(routes::pause::resume))
        .route("/v1/sandboxes/{id}/checkpoints", post(routes::checkpoints::create).get(routes::checkpoints::list))
        .route("/v1/sandboxes/{id}/checkpoints/{checkpoint}", delete(routes::checkpoints::delete))
        .route("/v1/sandboxes/{id}/restore", post(routes::checkpoints::restore))
        .route("/v1/sandboxes/{id}/freeze", post(routes::spaces::freeze))
        .route("/v1/sandboxes/{id}/hibernate", post(routes::spaces::hibernate))
        .route("/v1/spaces", get(routes::spaces::list))
        .route("/v1/spaces/{id}", get(routes::spaces::get).delete(routes::spaces::delete))
        .route("/v1/spaces/{id}/resume", post(routes::spaces::resume))
        .route("/v1/sandboxes/{id}/merge_into/{winner}", post(routes::merge_into))
        .route("/v1/sandboxes/{id}/diff/{other}", get(routes::diff))
        .route("/v1/sandboxes/{id}/files", get(routes::files::get).put(routes::files::put).delete(routes::files::delete))
        .route("/v1/sandboxes/{id}/files/watch", get(routes::watch::watch))
        .route("/v1/sandboxes/{id}/files/mkdir", post(routes::files::mkdir))
        .route("/v1/sandboxes/{id}/egress", get(routes::egress::get).patch(routes::egress::patch))
        .route("/v1/sandboxes/{id}/pty", post(routes::pty::create).get(routes::pty::list))
        .route("/v1/sandboxes/{id}/pty/{pty}/attach", get(routes::pty::attach))
        .route("/v1/sandboxes/{id}/pty/{pty}/input", post(routes::pty::input))
        .route("/v1/sandboxes/{id}/pty/{pty}/resize", post(routes::pty::resize))
        .route("/v1/sandboxes/{id}/pty/{pty}/kill", post(routes::pty::kill))
        .route("/v1/sandboxes/{id}/pty/{pty}/read", post(routes::pty::read))
        .route("/v1/sandboxes/{id}/files/rename", post(routes::files::rename))
        .route("/v1/sandboxes/{id}/files/chmod", post(routes::files::chmod))
        .route("/v1/sandboxes/{id}/ports/{port}", any(routes::ports::proxy))
        .route("/v1/sandboxes/{id}/ports/{port}/", any(routes::ports::proxy))
        .route("/v1/sandboxes/{id}/ports/{port}/{*path}", any(routes::ports::proxy))
        .route_layer(axum::middleware::from_fn_with_state(state.clone(), routes::metrics::track))
        .route_layer(axum::middleware::from_fn(trace::layer))
        .route_layer(axum::middleware::from_fn(http::detach))
        .fallback(http::not_found)
        .method_not_allowed_fallback(http::method_not_allowed)
        .layer(axum::middleware::from_fn_with_state(state.clone(), http::auth))
        .layer(axum::middleware::from_fn_with_state(state.clone(), http::refuse_while_draining))
        .layer(DefaultBodyLimit::max(http::MAX_BODY))
        .layer(axum::middleware::from_fn(keepalive::close_if_body_unread))
        .with_state(state)
}

/// Refuse to serve beyond loopback without API keys.
pub fn check_exposure(listen: &SocketAddr, has_keys: bool) -> Result<(), String> {
    if !listen.ip().is_loopback() && !has_keys {
        return Err(format!(
            "refusing to listen on {listen} without API keys: set --api-key / FORKBOX_API_KEYS or add one with `forkbox key add`, or listen on 127.0.0.1"
        ));
    }
    Ok(())
}

/// Run the server until SIGTERM/SIGINT, then destroy every sandbox.
pub async fn serve(config: ServerConfig) -> anyhow::Result<()> {
    serve_then(config, |_| {}).await
}

/// `serve`, calling `started` with the service once it runs (a cluster
/// node starts following its cluster there).
pub async fn serve_then(config: ServerConfig, started: impl FnOnce(AppState)) -> anyhow::Result<()> {
    // A keys file that cannot be read stops the start rather than being
    // taken for no keys (service::keys).
    let key_file = keys::KeyFile::load(&keys::key_file_path(&config.state_dir))?;
    // A cluster node answers only requests that show the cluster secret.
    let guarded = !config.api_keys.is_empty() || !key_file.keys.is_empty() || config.cluster_secret_sha256.is_some();
    check_exposure(&config.listen, guarded).map_err(anyhow::Error::msg)?;
    let state = AppState::start(config.clone()).await?;
    started(state.clone());
    use axum::serve::ListenerExt;
    // Events are small writes: without TCP_NODELAY, Nagle and delayed ACKs
    // add ~40 ms to every exec.
    let listener = tokio::net::TcpListener::bind(config.listen).await?.tap_io(|tcp| {
        let _ = tcp.set_nodelay(true);
    });
    tracing::info!(listen = %config.listen, state_dir = %config.state_dir.display(), "forkbox serving");
    let shutdown_state = state.clone();
    // Connect info: the port proxy's X-Forwarded-For.
    axum::serve(listener, app(state.clone()).into_make_service_with_connect_info::<SocketAddr>())
        .with_graceful_shutdown(async move { shutdown_state.begin_exit(shutdown_signal().await).await })
        .await?;
    state.finish().await?;
    Ok(())
}

/// SIGTERM, SIGINT: every sandbox goes with the server. SIGUSR2 (an
/// upgrade): the sandboxes keep running for the next server on this state
/// directory (docs/state.md#restarts).
async fn shutdown_signal() -> Exit {
    use tokio::signal::unix::{signal, SignalKind};
    let (Ok(mut term), Ok(mut usr2)) = (signal(SignalKind::terminate()), signal(SignalKind::user_defined2())) else {
        return std::future::pending().await;
    };
    tokio::select! {
        _ = term.recv() => Exit::DestroyAll,
        _ = tokio::signal::ctrl_c() => Exit::DestroyAll,
        _ = usr2.recv() => Exit::LeaveRunning,
    }
}
