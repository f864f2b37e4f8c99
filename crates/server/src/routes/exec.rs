//! Running code: exec (a streaming NDJSON answer) and the replay of past
//! events.

use axum::body::Body;
use axum::extract::{Path, State};
use axum::response::Response;
use protocol::ExecRequest;

use crate::error::ApiError;
use crate::http::{ndjson, ndjson_stream, Json, Key};
use crate::AppState;

#[utoipa::path(post, path = "/v1/sandboxes/{id}/exec", params(("id" = String, Path)), request_body = ExecRequest,
    responses((status = 200, description = "NDJSON stream of events", body = protocol::Event, content_type = "application/x-ndjson"),
        (status = 400, body = protocol::ErrorBody), (status = 404, body = protocol::ErrorBody), (status = 413, body = protocol::ErrorBody)))]
pub async fn exec(State(state): State<AppState>, Key(caller): Key, Path(id): Path<String>, Json(req): Json<ExecRequest>) -> Result<Response, ApiError> {
    Ok(ndjson_stream(state.exec(&caller, &id, req).await?))
}

#[utoipa::path(get, path = "/v1/sandboxes/{id}/replay", params(("id" = String, Path)),
    responses((status = 200, description = "NDJSON of the last 1000 events", content_type = "application/x-ndjson"), (status = 404, body = protocol::ErrorBody)))]
pub async fn replay(State(state): State<AppState>, Key(caller): Key, Path(id): Path<String>) -> Result<Response, ApiError> {
    let events = state.replay(&caller, &id).await?;
    let mut out = Vec::new();
    for ev in events {
        out.extend(serde_json::to_vec(&ev).unwrap_or_default());
        out.push(b'\n');
    }
    Ok(ndjson(Body::from(out)))
}
