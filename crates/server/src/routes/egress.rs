//! A sandbox's egress policy (docs/network.md).

use axum::extract::{Path, State};
use axum::http::StatusCode;
use axum::response::Response;
use protocol::EgressBody;

use crate::error::ApiError;
use crate::http::{json, Json, Key};
use crate::AppState;

#[utoipa::path(get, path = "/v1/sandboxes/{id}/egress", params(("id" = String, Path)), responses((status = 200, body = EgressBody), (status = 404, body = protocol::ErrorBody)))]
pub async fn get(State(state): State<AppState>, Key(caller): Key, Path(id): Path<String>) -> Result<Response, ApiError> {
    let egress = state.egress(&caller, &id).await?;
    Ok(json(StatusCode::OK, &EgressBody { egress }))
}

#[utoipa::path(patch, path = "/v1/sandboxes/{id}/egress", params(("id" = String, Path)), request_body = EgressBody,
    responses((status = 200, body = EgressBody), (status = 400, body = protocol::ErrorBody), (status = 404, body = protocol::ErrorBody)))]
pub async fn patch(State(state): State<AppState>, Key(caller): Key, Path(id): Path<String>, Json(body): Json<EgressBody>) -> Result<Response, ApiError> {
    state.set_egress(&caller, &id, &body.egress).await?;
    Ok(json(StatusCode::OK, &EgressBody { egress: body.egress }))
}
