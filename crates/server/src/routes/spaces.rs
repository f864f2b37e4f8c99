//! Spaces: sandboxes frozen to disk, and resumed; hibernation (docs/state.md).

use axum::extract::{Path, State};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use protocol::{ResumeSpace, SandboxInfo, SpaceInfo, SpaceList};

use crate::error::ApiError;
use crate::http::{json, Key};
use crate::AppState;

#[utoipa::path(post, path = "/v1/sandboxes/{id}/freeze", params(("id" = String, Path)),
    responses((status = 200, body = SpaceInfo), (status = 404, body = protocol::ErrorBody), (status = 409, body = protocol::ErrorBody),
        (status = 507, body = protocol::ErrorBody)))]
pub async fn freeze(State(state): State<AppState>, Key(caller): Key, Path(id): Path<String>) -> Result<Response, ApiError> {
    Ok(json(StatusCode::OK, &state.freeze(&caller, &id).await?.info))
}

/// Send a sandbox to disk keeping its id; the next call to it wakes it
/// (docs/state.md#hibernation).
#[utoipa::path(post, path = "/v1/sandboxes/{id}/hibernate", params(("id" = String, Path)),
    responses((status = 200, body = SandboxInfo), (status = 404, body = protocol::ErrorBody), (status = 409, body = protocol::ErrorBody),
        (status = 507, body = protocol::ErrorBody)))]
pub async fn hibernate(State(state): State<AppState>, Key(caller): Key, Path(id): Path<String>) -> Result<Response, ApiError> {
    Ok(json(StatusCode::OK, &state.hibernate(&caller, &id).await?))
}

#[utoipa::path(get, path = "/v1/spaces", responses((status = 200, body = SpaceList), (status = 503, body = protocol::ErrorBody)))]
pub async fn list(State(state): State<AppState>, Key(caller): Key) -> Result<Response, ApiError> {
    Ok(json(StatusCode::OK, &SpaceList { spaces: state.spaces(&caller).await? }))
}

#[utoipa::path(get, path = "/v1/spaces/{id}", params(("id" = String, Path)),
    responses((status = 200, body = SpaceInfo), (status = 404, body = protocol::ErrorBody)))]
pub async fn get(State(state): State<AppState>, Key(caller): Key, Path(id): Path<String>) -> Result<Response, ApiError> {
    Ok(json(StatusCode::OK, &state.space(&caller, &id).await?))
}

#[utoipa::path(delete, path = "/v1/spaces/{id}", params(("id" = String, Path)),
    responses((status = 204), (status = 404, body = protocol::ErrorBody)))]
pub async fn delete(State(state): State<AppState>, Key(caller): Key, Path(id): Path<String>) -> Result<Response, ApiError> {
    state.delete_space(&caller, &id).await?;
    Ok(StatusCode::NO_CONTENT.into_response())
}

#[utoipa::path(post, path = "/v1/spaces/{id}/resume", params(("id" = String, Path)), request_body = ResumeSpace,
    responses((status = 200, body = SandboxInfo), (status = 400, body = protocol::ErrorBody), (status = 404, body = protocol::ErrorBody),
        (status = 429, body = protocol::ErrorBody), (status = 507, body = protocol::ErrorBody)))]
pub async fn resume(
    State(state): State<AppState>,
    Key(caller): Key,
    Path(id): Path<String>,
    body: Result<bytes::Bytes, axum::extract::rejection::BytesRejection>,
) -> Result<Response, ApiError> {
    let req: ResumeSpace = crate::http::optional_body(body)?;
    let entry = state.resume_space(&caller, &id, req).await?;
    Ok(json(StatusCode::OK, &entry.info()))
}
