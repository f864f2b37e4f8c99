//! The forkbox HTTP server: the podflare-compatible API over the jail engine.
//!
//! Data path: request → `routes` (parse, validate) → `state::AppState`
//! (registry, lifecycle) → `sandbox::SandboxEntry` (exec queue) →
//! `repl_host::ReplSession` (the REPL's frames) → `repl_host::EventSink` →
//! NDJSON response.

pub mod adopt;
pub mod checkpoints;
pub mod config;
pub mod cpu_boost;
pub mod disk;
pub mod drain;
pub mod egress;
pub mod error;
pub mod files;
pub mod fork;
pub mod http;
pub mod keepalive;
pub mod keys;
pub mod lifecycle;
pub mod metrics;
pub mod openapi;
pub mod pause;
pub mod pool;
pub mod ports;
pub mod pty;
pub mod records;
pub mod routes;
pub mod sandbox;
pub mod setup;
pub mod spaces;
pub mod state;
pub mod templates;
pub mod trace;
pub mod watch;

use std::net::SocketAddr;

use axum::extract::DefaultBodyLimit;
use axum::routing::{any, delete, get, post};
use axum::Router;

pub use config::{SandboxLimits, ServerConfig};
pub use state::AppState;
pub use templates::Templates;

/// The runtime `serve` runs on. Its threads, this one included, get the
/// REPLs' short scheduler slice (`sandbox::REPL_TIME_SLICE`): an exec wakes
/// a server thread twice, for the request and for the REPL's answer, and
/// beside CPU hogs each wake-up would otherwise wait out a hog's slice
/// (bench/noisy.py, docs/reliability.md#noisy-neighbours). What the server
/// starts (shims, pasta) gets the default slice back.
pub fn runtime() -> std::io::Result<tokio::runtime::Runtime> {
    fn short_slice() {
        if let Err(e) = jail::sys::set_thread_time_slice(0, sandbox::REPL_TIME_SLICE) {
            tracing::debug!(err = %e, "could not shorten a server thread's time slice");
        }
    }
    short_slice();
    tokio::runtime::Builder::new_multi_thread().enable_all().on_thread_start(short_slice).build()
}

/// The router, separate from any socket so tests can drive it directly.
pub fn app(state: AppState) -> Router {
    Router::new()
        .route("/v1/healthz", get(routes::healthz))
        .route("/metrics", get(metrics::scrape))
        .route("/v1/openapi.json", get(openapi::openapi_json))
        .route("/v1/templates", get(templates::routes::list).post(templates::routes::build).layer(DefaultBodyLimit::max(templates::routes::MAX_RECIPE_BODY)))
        .route("/v1/templates/{name}", get(templates::routes::get).delete(templates::routes::delete))
        .route("/v1/sandboxes/{id}/template", post(templates::routes::save))
        .route("/v1/pool", get(routes::pool))
        .route("/v1/sandboxes", post(routes::create).get(routes::list))
        .route("/v1/sandboxes/{id}", get(routes::info).delete(routes::destroy))
        .route("/v1/sandboxes/{id}/exec", post(routes::exec))
        .route("/v1/sandboxes/{id}/replay", get(routes::replay))
        .route("/v1/sandboxes/{id}/fork", post(routes::fork))
        .route("/v1/sandboxes/{id}/pause", post(pause::pause))
        .route("/v1/sandboxes/{id}/resume", post(pause::resume))
        .route("/v1/sandboxes/{id}/checkpoints", post(checkpoints::create).get(checkpoints::list))
        .route("/v1/sandboxes/{id}/checkpoints/{checkpoint}", delete(checkpoints::delete))
        .route("/v1/sandboxes/{id}/restore", post(checkpoints::restore))
        .route("/v1/sandboxes/{id}/freeze", post(spaces::freeze))
        .route("/v1/spaces", get(spaces::list))
        .route("/v1/spaces/{id}", get(spaces::get).delete(spaces::delete))
        .route("/v1/spaces/{id}/resume", post(spaces::resume))
        .route("/v1/sandboxes/{id}/merge_into/{winner}", post(routes::merge_into))
        .route("/v1/sandboxes/{id}/diff/{other}", get(routes::diff))
        .route("/v1/sandboxes/{id}/files", get(files::get).put(files::put).delete(files::delete))
        .route("/v1/sandboxes/{id}/files/watch", get(watch::watch))
        .route("/v1/sandboxes/{id}/files/mkdir", post(files::mkdir))
        .route("/v1/sandboxes/{id}/egress", get(egress::get).patch(egress::patch))
        .route("/v1/sandboxes/{id}/pty", post(pty::create).get(pty::list))
        .route("/v1/sandboxes/{id}/pty/{pty}/attach", get(pty::attach))
        .route("/v1/sandboxes/{id}/pty/{pty}/input", post(pty::input))
        .route("/v1/sandboxes/{id}/pty/{pty}/resize", post(pty::resize))
        .route("/v1/sandboxes/{id}/pty/{pty}/kill", post(pty::kill))
        .route("/v1/sandboxes/{id}/pty/{pty}/read", post(pty::read))
        .route("/v1/sandboxes/{id}/files/rename", post(files::rename))
        .route("/v1/sandboxes/{id}/files/chmod", post(files::chmod))
        .route("/v1/sandboxes/{id}/ports/{port}", any(ports::proxy))
        .route("/v1/sandboxes/{id}/ports/{port}/", any(ports::proxy))
        .route("/v1/sandboxes/{id}/ports/{port}/{*path}", any(ports::proxy))
        .route_layer(axum::middleware::from_fn_with_state(state.clone(), metrics::track))
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
    // A keys file that cannot be read stops the start rather than being
    // taken for no keys (src/keys.rs).
    let key_file = keys::KeyFile::load(&keys::key_file_path(&config.state_dir))?;
    check_exposure(&config.listen, !config.api_keys.is_empty() || !key_file.keys.is_empty()).map_err(anyhow::Error::msg)?;
    if config.limits.max_sandboxes > jail::SLOT_BLOCKS as usize {
        anyhow::bail!("--max-sandboxes can be at most {} (the host ids one server owns)", jail::SLOT_BLOCKS);
    }
    if config.build_templates {
        template::check_tools().map_err(|e| anyhow::anyhow!("{e}"))?;
    }
    if config.default_egress && config.egress_proxy.is_none() {
        for (tool, package) in [("pasta", "passt"), ("nft", "nftables")] {
            jail::require_tool(tool, package).map_err(|e| anyhow::anyhow!("{e} (or start with --default-egress false)"))?;
        }
    }
    let jail = jail::Jail::open(jail::JailConfig {
        orphan_grace: config.orphan_grace,
        volume: config.volume,
        ..jail::JailConfig::new(config.state_dir.clone(), config.shim_exe.clone(), 0)
    })?;
    let templates = Templates::new(config.templates_dir.clone(), &config.state_dir.join("custom-templates"), config.debian);
    tracing::info!(debian = %config.debian, python = config.debian.python(), "built-in templates are made from this release");
    templates.scan();
    if !config.build_templates {
        templates.mark_unbuilt();
    }
    let state = AppState::new(config.clone(), jail, templates.clone());
    match &config.host_cas {
        // Logs which CAs sandboxes trust.
        Some(_) => drop(state.inner.trust.refresh()),
        None => tracing::info!("sandboxes trust only their template's CAs (--no-host-cas)"),
    }
    if let Some(proxy) = &config.egress_proxy {
        tracing::info!(proxy = %proxy, "sandboxes with egress reach the network only through the upstream proxy");
    }
    state.inner.spaces.recover().map_err(|e| anyhow::anyhow!("recover the spaces in {}: {e}", config.state_dir.display()))?;
    let (adopted, lost) = state.adopt_survivors().await?;
    if adopted + lost > 0 {
        tracing::info!(adopted, lost, "took back the sandboxes a previous server left running");
    }
    state.mount_template_stacks().await;
    state.sweep_trust_layers().await;
    if config.build_templates {
        std::thread::Builder::new().name("template-builder".into()).spawn(move || templates.build_all())?;
    }
    tokio::spawn(state.clone().expire_loop());
    tokio::spawn(state.clone().pool_loop());
    tokio::spawn(state.clone().quota_sweep_loop());
    tokio::spawn(state.clone().cpu_boost_loop());
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
        .with_graceful_shutdown(async move {
            match shutdown_signal().await {
                Exit::DestroyAll => {
                    shutdown_state.drain(shutdown_state.inner.config.drain).await;
                    tracing::info!("shutting down: destroying all sandboxes");
                    shutdown_state.destroy_all().await;
                }
                Exit::LeaveRunning => {
                    tracing::info!("exiting for an upgrade: the sandboxes keep running for the next server");
                    shutdown_state.leave_running().await;
                }
            }
        })
        .await?;
    if state.inner.jail.is_left_running() {
        return Ok(());
    }
    state.destroy_all().await;
    state.inner.jail.close()?;
    Ok(())
}

/// How the server ends.
enum Exit {
    /// SIGTERM, SIGINT: every sandbox goes with the server.
    DestroyAll,
    /// SIGUSR2 (an upgrade): the sandboxes keep running, for the next
    /// server on this state directory to adopt (docs/state.md#restarts).
    LeaveRunning,
}

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
