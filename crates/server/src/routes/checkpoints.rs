//! Checkpoints of a sandbox, and restoring one (docs/state.md).

use axum::extract::{Path, State};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use protocol::{CheckpointInfo, CheckpointList, RestoreRequest};

use crate::error::ApiError;
use crate::http::{json, Json, Key};
use crate::AppState;

#[utoipa::path(post, path = "/v1/sandboxes/{id}/checkpoints", params(("id" = String, Path)),
    responses((status = 200, body = CheckpointInfo), (status = 404, body = protocol::ErrorBody), (status = 429, body = protocol::ErrorBody),
        (status = 507, body = protocol::ErrorBody)))]
pub async fn create(State(state): State<AppState>, Key(caller): Key, Path(id): Path<String>) -> Result<Response, ApiError> {
    Ok(json(StatusCode::OK, &state.checkpoint(&caller, &id).await?))
}

#[utoipa::path(get, path = "/v1/sandboxes/{id}/checkpoints", params(("id" = String, Path)),
    responses((status = 200, body = CheckpointList), (status = 404, body = protocol::ErrorBody)))]
pub async fn list(State(state): State<AppState>, Key(caller): Key, Path(id): Path<String>) -> Result<Response, ApiError> {
    Ok(json(StatusCode::OK, &state.checkpoints(&caller, &id).await?))
}

#[utoipa::path(delete, path = "/v1/sandboxes/{id}/checkpoints/{checkpoint}", params(("id" = String, Path), ("checkpoint" = String, Path)),
    responses((status = 204), (status = 404, body = protocol::ErrorBody)))]
pub async fn delete(State(state): State<AppState>, Key(caller): Key, Path((id, checkpoint)): Path<(String, String)>) -> Result<Response, ApiError> {
    state.delete_checkpoint(&caller, &id, &checkpoint).await?;
    Ok(StatusCode::NO_CONTENT.into_response())
}

#[utoipa::path(post, path = "/v1/sandboxes/{id}/restore", params(("id" = String, Path)), request_body = RestoreRequest,
    responses((status = 200, body = protocol::SandboxInfo), (status = 400, body = protocol::ErrorBody), (status = 404, body = protocol::ErrorBody),
        (status = 429, body = protocol::ErrorBody), (status = 507, body = protocol::ErrorBody)))]
pub async fn restore(State(state): State<AppState>, Key(caller): Key, Path(id): Path<String>, Json(req): Json<RestoreRequest>) -> Result<Response, ApiError> {
    let restored = state.restore(&caller, &id, &req.checkpoint).await?;
    Ok(json(StatusCode::OK, &restored.info()))
}
