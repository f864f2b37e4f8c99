//! A sandbox's family: fork, merge_into and diff.

use axum::extract::{Path, State};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};

use crate::error::ApiError;
use crate::http::{json, Json, Key};

use crate::AppState;

#[utoipa::path(post, path = "/v1/sandboxes/{id}/fork", params(("id" = String, Path)), request_body = protocol::ForkRequest,
    responses((status = 200, body = protocol::Forked), (status = 400, body = protocol::ErrorBody), (status = 404, body = protocol::ErrorBody),
        (status = 429, body = protocol::ErrorBody), (status = 500, body = protocol::ErrorBody), (status = 507, body = protocol::ErrorBody)))]
pub async fn fork(
    State(state): State<AppState>,
    Key(caller): Key,
    Path(id): Path<String>,
    Json(req): Json<protocol::ForkRequest>,
) -> Result<Response, ApiError> {
    let n = usize::try_from(req.n).unwrap_or(0);
    let children = state.fork(&caller, &id, n).await?;
    Ok(json(StatusCode::OK, &protocol::Forked { children }))
}

#[utoipa::path(post, path = "/v1/sandboxes/{id}/merge_into/{winner}", params(("id" = String, Path), ("winner" = String, Path)),
    responses((status = 204), (status = 400, body = protocol::ErrorBody), (status = 404, body = protocol::ErrorBody), (status = 409, body = protocol::ErrorBody)))]
pub async fn merge_into(State(state): State<AppState>, Key(caller): Key, Path((id, winner)): Path<(String, String)>) -> Result<Response, ApiError> {
    state.merge_into(&caller, &id, &winner).await?;
    Ok(StatusCode::NO_CONTENT.into_response())
}

/// Query of `GET /v1/sandboxes/{id}/diff/{other}`.
#[derive(serde::Deserialize, utoipa::IntoParams)]
pub struct DiffQuery {
    /// Comma-separated absolute paths (default `/root,/tmp`).
    pub paths: Option<String>,
}

#[utoipa::path(get, path = "/v1/sandboxes/{id}/diff/{other}", params(("id" = String, Path), ("other" = String, Path), DiffQuery),
    responses((status = 200, body = protocol::DiffResult), (status = 400, body = protocol::ErrorBody), (status = 404, body = protocol::ErrorBody)))]
pub async fn diff(
    State(state): State<AppState>,
    Key(caller): Key,
    Path((id, other)): Path<(String, String)>,
    query: Result<axum::extract::Query<DiffQuery>, axum::extract::rejection::QueryRejection>,
) -> Result<Response, ApiError> {
    let axum::extract::Query(q) = query.map_err(|e| ApiError::BadRequest(e.body_text()))?;
    let paths: Vec<String> = q.paths.unwrap_or_default().split(',').filter(|p| !p.is_empty()).map(str::to_string).collect();
    Ok(json(StatusCode::OK, &state.diff(&caller, &id, &other, paths).await?))
}
