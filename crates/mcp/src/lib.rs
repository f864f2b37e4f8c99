//! forkbox's MCP server: sandbox tools for models (run Python and bash, fork,
//! diff, merge, checkpoint, files), built on the official Rust SDK `rmcp`.
//!
//! It is a client of a running forkbox server (its HTTP API), not a second
//! server: `forkbox mcp` speaks MCP over stdio, or over streamable HTTP with
//! `--http`. See docs/mcp.md.

mod api;
mod render;
mod session;
mod tools;

use std::net::SocketAddr;
use std::sync::Arc;

use rmcp::transport::streamable_http_server::{session::local::LocalSessionManager, StreamableHttpServerConfig, StreamableHttpService};
use rmcp::ServiceExt;
use tokio_util::sync::CancellationToken;

pub use api::ApiError;

/// How long an idle streamable-HTTP session lives.
const HTTP_SESSION_KEEP_ALIVE: std::time::Duration = std::time::Duration::from_secs(24 * 3600);
pub use tools::ForkboxMcp;

/// How to reach the forkbox server, and the default sandboxes' template.
#[derive(Debug, Clone)]
pub struct Config {
    pub url: String,
    pub api_key: Option<String>,
    pub template: Option<String>,
}

#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("MCP over stdio: {0}")]
    Stdio(String),
    #[error(
        "--http {0}: listening beyond loopback would hand sandboxes to anyone who can connect; listen on 127.0.0.1 and put an authenticating proxy in front"
    )]
    NotLoopback(SocketAddr),
    #[error("listen on {addr}: {source}")]
    Listen { addr: SocketAddr, source: std::io::Error },
    #[error("serve HTTP: {0}")]
    Serve(std::io::Error),
}

fn shared(config: Config) -> Arc<tools::Shared> {
    Arc::new(tools::Shared {
        api: api::Api::new(&config.url, config.api_key.filter(|k| !k.is_empty())),
        template: config.template.filter(|t| !t.is_empty()),
        sessions: session::Sessions::default(),
    })
}

/// Resolves on SIGINT or SIGTERM.
async fn stop_signal() {
    let term = async {
        match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
            Ok(mut s) => {
                s.recv().await;
            }
            Err(_) => std::future::pending().await,
        }
    };
    tokio::select! {
        _ = tokio::signal::ctrl_c() => {}
        _ = term => {}
    }
}

/// Serve one MCP session over stdin/stdout until the client closes it (or a
/// signal); then destroy the sandboxes the session made.
pub async fn serve_stdio(config: Config) -> Result<(), Error> {
    let shared = shared(config);
    tracing::info!(url = shared.api.url(), "MCP over stdio");
    let result = async {
        let running = ForkboxMcp::new(shared.clone()).serve(rmcp::transport::stdio()).await.map_err(|e| Error::Stdio(e.to_string()))?;
        tokio::select! {
            r = running.waiting() => r.map(drop).map_err(|e| Error::Stdio(e.to_string())),
            _ = stop_signal() => Ok(()),
        }
    }
    .await;
    shared.sessions.close_all(&shared.api).await;
    result
}

/// Serve MCP over streamable HTTP at `http://{addr}/mcp` until SIGINT or
/// SIGTERM; then destroy every session's sandboxes.
pub async fn serve_http(config: Config, addr: SocketAddr) -> Result<(), Error> {
    if !addr.ip().is_loopback() {
        return Err(Error::NotLoopback(addr));
    }
    let shared = shared(config);
    let stop = CancellationToken::new();
    let factory = {
        let shared = shared.clone();
        move || Ok(ForkboxMcp::new(shared.clone()))
    };
    // The SDK ends a session after 5 idle minutes, which would destroy its
    // sandboxes while a model thinks; let the sandboxes' own idle timeout
    // (the server's, 600 s by default) decide instead.
    let mut sessions = LocalSessionManager::default();
    sessions.session_config.keep_alive = Some(HTTP_SESSION_KEEP_ALIVE);
    let service: StreamableHttpService<ForkboxMcp, LocalSessionManager> =
        StreamableHttpService::new(factory, Arc::new(sessions), StreamableHttpServerConfig::default().with_cancellation_token(stop.child_token()));
    let app = axum::Router::new().nest_service("/mcp", service);
    let listener = tokio::net::TcpListener::bind(addr).await.map_err(|source| Error::Listen { addr, source })?;
    let local = listener.local_addr().map_err(|source| Error::Listen { addr, source })?;
    tracing::info!(url = shared.api.url(), "MCP over streamable HTTP at http://{local}/mcp");
    let served = axum::serve(listener, app)
        .with_graceful_shutdown({
            let stop = stop.clone();
            async move {
                stop_signal().await;
                stop.cancel();
            }
        })
        .await
        .map_err(Error::Serve);
    shared.sessions.close_all(&shared.api).await;
    served
}
