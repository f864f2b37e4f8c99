//! Pause and resume in memory (docs/state.md): a paused sandbox's
//! processes are stopped by the cgroup freezer (no CPU, memory kept) and go
//! on exactly where they stopped. Every call that needs the sandbox running
//! (exec, files, PTYs, ports, fork) resumes it first; an idle sandbox may be
//! paused by the server (`--idle-pause-seconds`).

use std::sync::Arc;

use axum::extract::{Path, State};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};

use crate::error::ApiError;
use crate::lifecycle::Lifecycle;
use crate::sandbox::SandboxEntry;
use crate::state::AppState;

pub(crate) async fn set_paused(entry: &Arc<SandboxEntry>, pause: bool) -> Result<(), ApiError> {
    let engine = Arc::clone(&entry.engine);
    tokio::task::spawn_blocking(move || if pause { engine.pause() } else { engine.resume() })
        .await
        .map_err(|e| ApiError::engine("pause task failed", e))?
        .map_err(|e| ApiError::engine(if pause { "could not pause the sandbox" } else { "could not resume the sandbox" }, e))
}

/// Resume `entry` if it is paused (before anything that needs it running).
pub async fn ensure_running(entry: &Arc<SandboxEntry>) -> Result<(), ApiError> {
    if entry.engine.is_paused() {
        set_paused(entry, false).await?;
        tracing::info!(sandbox = %entry.id, "resumed");
    }
    Ok(())
}

/// Pause `entry` unless an exec runs or waits (it would stall mid-call).
pub async fn pause_idle(entry: &Arc<SandboxEntry>) -> Result<(), ApiError> {
    let Ok(_slot) = entry.slot.try_lock() else {
        return Err(ApiError::Conflict("an exec is running or queued; pause after it".into()));
    };
    match entry.lifecycle() {
        Lifecycle::Running => Err(ApiError::Conflict("an exec is running or queued; pause after it".into())),
        Lifecycle::Destroyed => Err(ApiError::NotFound(format!("sandbox `{}` was destroyed", entry.id))),
        // Idempotent.
        Lifecycle::Paused => Ok(()),
        Lifecycle::Ready => {
            set_paused(entry, true).await?;
            tracing::info!(sandbox = %entry.id, "paused");
            Ok(())
        }
    }
}

#[utoipa::path(post, path = "/v1/sandboxes/{id}/pause", params(("id" = String, Path)),
    responses((status = 200, body = protocol::SandboxInfo), (status = 404, body = protocol::ErrorBody), (status = 409, body = protocol::ErrorBody)))]
pub async fn pause(State(state): State<AppState>, caller: crate::keys::Caller, Path(id): Path<String>) -> Result<Response, ApiError> {
    let entry = state.get(&caller, &id).await?;
    pause_idle(&entry).await?;
    Ok((StatusCode::OK, axum::Json(entry.info())).into_response())
}

#[utoipa::path(post, path = "/v1/sandboxes/{id}/resume", params(("id" = String, Path)),
    responses((status = 200, body = protocol::SandboxInfo), (status = 404, body = protocol::ErrorBody)))]
pub async fn resume(State(state): State<AppState>, caller: crate::keys::Caller, Path(id): Path<String>) -> Result<Response, ApiError> {
    let entry = state.get(&caller, &id).await?;
    ensure_running(&entry).await?;
    entry.touch();
    Ok((StatusCode::OK, axum::Json(entry.info())).into_response())
}
