//! `GET /v1/sandboxes/{id}/files/watch`: `service::watch`'s change events
//! as an NDJSON stream.

use axum::extract::{Path, Query, State};
use axum::response::Response;
use protocol::FileEvent;
use serde::Deserialize;

use crate::error::ApiError;
use crate::http::flag;
use crate::http::Key;
use crate::AppState;

#[derive(Debug, Deserialize, utoipa::IntoParams)]
pub struct WatchQuery {
    /// Directory to watch (relative paths start at /root).
    pub path: String,
    /// Watch the whole tree below `path` (default true).
    pub recursive: Option<String>,
}

#[utoipa::path(get, path = "/v1/sandboxes/{id}/files/watch", params(("id" = String, Path), WatchQuery),
    responses((status = 200, description = "NDJSON stream of FileEvent", body = FileEvent, content_type = "application/x-ndjson"),
        (status = 400, body = protocol::ErrorBody), (status = 404, body = protocol::ErrorBody), (status = 429, body = protocol::ErrorBody)))]
pub async fn watch(
    State(state): State<AppState>,
    Key(caller): Key,
    Path(id): Path<String>,
    q: Result<Query<WatchQuery>, axum::extract::rejection::QueryRejection>,
) -> Result<Response, ApiError> {
    let entry = state.get(&caller, &id).await?;
    let Query(q) = q.map_err(|e| ApiError::BadRequest(e.body_text()))?;
    let path = service::files::sandbox_path(&q.path)?;
    let recursive = flag(&q.recursive, "recursive", true)?;
    let events = service::watch::watch(&entry, path, recursive).await?;
    Ok(crate::http::ndjson_stream::<FileEvent>(events))
}
