//! Handlers of `/v1/templates` and `POST /v1/sandboxes/{id}/template`.

use axum::extract::{Path, Query, State};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use protocol::{BuildEvent, SaveTemplate, TemplateInfo, TemplateRecipe};
use serde::Deserialize;
use tokio::sync::mpsc;

use crate::error::ApiError;
use crate::http::flag;
use crate::http::{json, ndjson_stream, Json, Key};

use crate::AppState;

/// Largest `POST /v1/templates` body: a recipe's files travel in it.
pub const MAX_RECIPE_BODY: usize = 96 << 20;

#[utoipa::path(get, path = "/v1/templates", responses((status = 200, body = [TemplateInfo]), (status = 503, body = protocol::ErrorBody)))]
pub async fn list(State(state): State<AppState>, Key(caller): Key) -> Result<Response, ApiError> {
    Ok(json(StatusCode::OK, &state.template_list(&caller).await?))
}

#[utoipa::path(get, path = "/v1/templates/{name}", params(("name" = String, Path)),
    responses((status = 200, body = TemplateInfo), (status = 404, body = protocol::ErrorBody)))]
pub async fn get(State(state): State<AppState>, Key(caller): Key, Path(name): Path<String>) -> Result<Response, ApiError> {
    Ok(json(StatusCode::OK, &state.template_info(&caller, &name).await?))
}

#[derive(Debug, Deserialize, utoipa::IntoParams)]
pub struct DeleteQuery {
    /// Delete even while sandboxes or Spaces use it (`1`/`true`).
    pub force: Option<String>,
}

#[utoipa::path(delete, path = "/v1/templates/{name}", params(("name" = String, Path), DeleteQuery),
    responses((status = 204), (status = 400, body = protocol::ErrorBody), (status = 404, body = protocol::ErrorBody), (status = 409, body = protocol::ErrorBody)))]
pub async fn delete(State(state): State<AppState>, Key(caller): Key, Path(name): Path<String>, Query(q): Query<DeleteQuery>) -> Result<Response, ApiError> {
    let force = flag(&q.force, "force", false)?;
    state.delete_template(&caller, &name, force).await?;
    Ok(StatusCode::NO_CONTENT.into_response())
}

#[utoipa::path(post, path = "/v1/templates", request_body = TemplateRecipe,
    responses((status = 200, description = "NDJSON stream: step, log, … then done {template} or error {error}", body = BuildEvent, content_type = "application/x-ndjson"),
        (status = 400, body = protocol::ErrorBody), (status = 404, body = protocol::ErrorBody), (status = 409, body = protocol::ErrorBody),
        (status = 413, body = protocol::ErrorBody), (status = 503, body = protocol::ErrorBody)))]
pub async fn build(State(state): State<AppState>, Key(caller): Key, Json(recipe): Json<TemplateRecipe>) -> Result<Response, ApiError> {
    let plan = state.plan_build(&caller, recipe)?;
    let (tx, rx) = mpsc::channel(256);
    tokio::spawn(async move { state.build_template(plan, tx).await });
    Ok(ndjson_stream(rx))
}

#[utoipa::path(post, path = "/v1/sandboxes/{id}/template", params(("id" = String, Path)), request_body = SaveTemplate,
    responses((status = 200, body = TemplateInfo), (status = 400, body = protocol::ErrorBody), (status = 404, body = protocol::ErrorBody),
        (status = 409, body = protocol::ErrorBody), (status = 507, body = protocol::ErrorBody)))]
pub async fn save(State(state): State<AppState>, Key(caller): Key, Path(id): Path<String>, Json(req): Json<SaveTemplate>) -> Result<Response, ApiError> {
    Ok(json(StatusCode::OK, &state.save_template(&caller, &id, req).await?))
}
