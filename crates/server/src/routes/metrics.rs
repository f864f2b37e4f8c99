//! `GET /metrics`, and the route layer that counts and times requests.

use std::time::Instant;

use axum::extract::{MatchedPath, Request, State};
use axum::http::{header, StatusCode};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};

use crate::AppState;

/// Count and time every routed request.
pub async fn track(State(state): State<AppState>, req: Request, next: Next) -> Response {
    let started = Instant::now();
    let method = req.method().to_string();
    let route = req.extensions().get::<MatchedPath>().map(|p| p.as_str().to_string()).unwrap_or_else(|| "unmatched".into());
    let response = next.run(req).await;
    state.inner.metrics.observe_request(method, route, response.status().as_u16(), started);
    response
}

/// `GET /metrics`.
pub async fn scrape(State(state): State<AppState>) -> Response {
    match state.metrics_text().await {
        Ok(body) => ([(header::CONTENT_TYPE, service::metrics::CONTENT_TYPE)], body).into_response(),
        Err(_) => StatusCode::INTERNAL_SERVER_ERROR.into_response(),
    }
}
