//! Sandboxes as a resource: create, list, info, destroy, and the health
//! check and warm pool beside them.

use axum::extract::{Path, State};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use protocol::{CreateSandbox, Created, SandboxInfo, SandboxList};

use crate::error::ApiError;
use crate::http::{json, optional_body, Key};
use crate::AppState;

#[utoipa::path(get, path = "/v1/healthz", responses((status = 200, description = "`ok` once the default template is ready"), (status = 503, body = protocol::ErrorBody)))]
pub async fn healthz(State(state): State<AppState>) -> Response {
    match state.health() {
        Ok(()) => (StatusCode::OK, "ok").into_response(),
        Err(e) => ApiError::from(e).into_response(),
    }
}

#[utoipa::path(post, path = "/v1/sandboxes", request_body = CreateSandbox,
    responses((status = 200, body = Created), (status = 400, body = protocol::ErrorBody), (status = 404, body = protocol::ErrorBody),
        (status = 429, body = protocol::ErrorBody), (status = 501, body = protocol::ErrorBody), (status = 503, body = protocol::ErrorBody),
        (status = 507, body = protocol::ErrorBody)))]
pub async fn create(
    State(state): State<AppState>,
    Key(caller): Key,
    body: Result<bytes::Bytes, axum::extract::rejection::BytesRejection>,
) -> Result<Response, ApiError> {
    let req: CreateSandbox = optional_body(body)?;
    let entry = state.create(&caller, req).await?;
    Ok(json(StatusCode::OK, &Created { id: entry.id.clone(), state: "ready".into() }))
}

#[utoipa::path(get, path = "/v1/sandboxes", responses((status = 200, body = SandboxList)))]
pub async fn list(State(state): State<AppState>, Key(caller): Key) -> Response {
    let mut sandboxes: Vec<SandboxInfo> = state.list(&caller).await.iter().map(|e| e.info()).collect();
    // Hibernating ones too (`state: "hibernated"`), looked at, not woken.
    sandboxes.extend(state.hibernating_all(&caller).await.into_iter().map(|meta| meta.sandbox));
    sandboxes.sort_by_key(|s| s.created_at);
    json(StatusCode::OK, &SandboxList { sandboxes })
}

#[utoipa::path(get, path = "/v1/sandboxes/{id}", params(("id" = String, Path)), responses((status = 200, body = SandboxInfo), (status = 404, body = protocol::ErrorBody)))]
pub async fn info(State(state): State<AppState>, Key(caller): Key, Path(id): Path<String>) -> Result<Response, ApiError> {
    Ok(json(StatusCode::OK, &state.info(&caller, &id).await?))
}

#[utoipa::path(delete, path = "/v1/sandboxes/{id}", params(("id" = String, Path)), responses((status = 204), (status = 404, body = protocol::ErrorBody)))]
pub async fn destroy(State(state): State<AppState>, Key(caller): Key, Path(id): Path<String>) -> Result<Response, ApiError> {
    state.destroy(&caller, &id).await?;
    Ok(StatusCode::NO_CONTENT.into_response())
}

#[utoipa::path(get, path = "/v1/pool", responses((status = 200, body = service::pool::PoolInfo, description = "The warm pool's hidden sandboxes by template")))]
pub async fn pool(State(state): State<AppState>, Key(caller): Key) -> Response {
    json(StatusCode::OK, &state.pool_info(&caller).await)
}
