//! Pause and resume in memory (docs/state.md).

use axum::extract::{Path, State};
use axum::http::StatusCode;
use axum::response::Response;

use crate::error::ApiError;
use crate::http::{json, Key};
use crate::AppState;

#[utoipa::path(post, path = "/v1/sandboxes/{id}/pause", params(("id" = String, Path)),
    responses((status = 200, body = protocol::SandboxInfo), (status = 404, body = protocol::ErrorBody), (status = 409, body = protocol::ErrorBody)))]
pub async fn pause(State(state): State<AppState>, Key(caller): Key, Path(id): Path<String>) -> Result<Response, ApiError> {
    let entry = state.pause(&caller, &id).await?;
    Ok(json(StatusCode::OK, &entry.info()))
}

#[utoipa::path(post, path = "/v1/sandboxes/{id}/resume", params(("id" = String, Path)),
    responses((status = 200, body = protocol::SandboxInfo), (status = 404, body = protocol::ErrorBody)))]
pub async fn resume(State(state): State<AppState>, Key(caller): Key, Path(id): Path<String>) -> Result<Response, ApiError> {
    let entry = state.resume(&caller, &id).await?;
    Ok(json(StatusCode::OK, &entry.info()))
}
