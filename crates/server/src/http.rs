//! The HTTP plumbing every resource's handlers share: JSON bodies whose
//! rejections are JSON errors, NDJSON streams, the fallbacks, and the
//! middleware (auth, drain, detach). No handler lives here.

use std::convert::Infallible;

use axum::body::Body;
use axum::extract::rejection::JsonRejection;
use axum::extract::{FromRequest, FromRequestParts, Request, State};
use axum::http::{header, HeaderMap, StatusCode};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use futures::StreamExt;
use protocol::MAX_CODE_BYTES;
use tokio::sync::mpsc;
use tokio_stream::wrappers::ReceiverStream;

use crate::error::ApiError;

use crate::AppState;
use service::keys::Caller;

/// `Json<T>` whose rejections are JSON errors with the right status.
pub struct Json<T>(pub T);

impl<S: Send + Sync, T: serde::de::DeserializeOwned> FromRequest<S> for Json<T> {
    type Rejection = ApiError;

    async fn from_request(req: Request, state: &S) -> Result<Self, Self::Rejection> {
        match axum::Json::<serde_json::Value>::from_request(req, state).await {
            Ok(axum::Json(v)) => parse_object(v).map(Json),
            Err(JsonRejection::BytesRejection(e)) if e.status() == StatusCode::PAYLOAD_TOO_LARGE => {
                Err(ApiError::TooLarge(format!("request body is larger than {} bytes", MAX_BODY)))
            }
            Err(JsonRejection::MissingJsonContentType(_)) => Err(ApiError::BadRequest("expected `Content-Type: application/json`".into())),
            Err(e) => Err(ApiError::BadRequest(e.body_text())),
        }
    }
}

/// A request body must be a JSON object (serde would also map an array
/// onto a struct's fields by position).
fn parse_object<T: serde::de::DeserializeOwned>(v: serde_json::Value) -> Result<T, ApiError> {
    if !v.is_object() {
        return Err(ApiError::BadRequest("the request body must be a JSON object".into()));
    }
    // The error names the field it is about (`output: unknown variant ...`).
    serde_path_to_error::deserialize(v).map_err(|e| ApiError::BadRequest(format!("invalid request body: {e}")))
}

/// A JSON object body that may be left out: empty (or only whitespace)
/// means all defaults (handy with curl).
pub(crate) fn optional_body<T: serde::de::DeserializeOwned + Default>(
    body: Result<bytes::Bytes, axum::extract::rejection::BytesRejection>,
) -> Result<T, ApiError> {
    let body = body.map_err(|e| {
        if e.status() == StatusCode::PAYLOAD_TOO_LARGE {
            ApiError::TooLarge(format!("request body is larger than {MAX_BODY} bytes"))
        } else {
            ApiError::BadRequest(e.body_text())
        }
    })?;
    if body.iter().all(u8::is_ascii_whitespace) {
        return Ok(T::default());
    }
    let v = serde_json::from_slice(&body).map_err(|e| ApiError::BadRequest(format!("invalid request body: {e}")))?;
    parse_object(v)
}

/// Largest request body: the biggest `code` plus room for JSON escaping.
pub const MAX_BODY: usize = MAX_CODE_BYTES * 2 + 64 * 1024;

/// A boolean query flag: absent → `default`; `1`/`true`/`yes` or `0`/`false`/`no`.
pub fn flag(value: &Option<String>, name: &str, default: bool) -> Result<bool, ApiError> {
    match value.as_deref() {
        None => Ok(default),
        Some("" | "1" | "true" | "yes") => Ok(true),
        Some("0" | "false" | "no") => Ok(false),
        Some(other) => Err(ApiError::BadRequest(format!("`{name}` must be true or false, not `{other}`"))),
    }
}

pub(crate) fn json<T: serde::Serialize>(status: StatusCode, v: &T) -> Response {
    (status, axum::Json(v)).into_response()
}

/// A streaming NDJSON response: one line per value received.
/// At most this many events in one body chunk of an NDJSON stream.
const NDJSON_BATCH: usize = 256;

pub fn ndjson_stream<T: serde::Serialize + Send + 'static>(rx: mpsc::Receiver<T>) -> Response {
    // The events already waiting go out in one body chunk: a cell printing
    // 100,000 lines is then a few thousand writes, not 100,000, and an event
    // that comes alone still goes at once.
    let body = ReceiverStream::new(rx).ready_chunks(NDJSON_BATCH).map(|events| {
        let mut lines = Vec::new();
        for ev in events {
            if serde_json::to_writer(&mut lines, &ev).is_ok() {
                lines.push(b'\n');
            }
        }
        Ok::<_, Infallible>(bytes::Bytes::from(lines))
    });
    ndjson(Body::from_stream(body))
}

pub(crate) fn ndjson(body: Body) -> Response {
    Response::builder()
        .status(StatusCode::OK)
        .header(header::CONTENT_TYPE, "application/x-ndjson")
        .header(header::CACHE_CONTROL, "no-cache")
        .body(body)
        .unwrap_or_else(|_| StatusCode::INTERNAL_SERVER_ERROR.into_response())
}

pub async fn not_found() -> ApiError {
    ApiError::NotFound("no such route".into())
}

pub async fn method_not_allowed() -> Response {
    (StatusCode::METHOD_NOT_ALLOWED, axum::Json(protocol::ErrorBody { error: "method not allowed".into(), progress: None })).into_response()
}

/// Run each request's handler as its own task, so a client that hangs up
/// cannot cancel it half-way: hyper drops the handler's future when the
/// connection closes, and a DELETE dropped between unregistering a sandbox
/// and freeing it leaked the sandbox's files. The work finishes (and is
/// logged and counted); only the answer is lost.
pub async fn detach(req: Request, next: Next) -> Response {
    match tokio::spawn(next.run(req)).await {
        Ok(response) => response,
        Err(e) => ApiError::Internal(format!("the request's handler failed: {e}")).into_response(),
    }
}

/// While the server drains for shutdown, every new request (the health
/// check too, so a load balancer moves on) gets 503; requests already in
/// flight go on.
pub async fn refuse_while_draining(State(state): State<AppState>, req: Request, next: Next) -> Response {
    if state.inner.drain.is_draining() {
        return ApiError::Unavailable { message: "the server is shutting down".into(), progress: None }.into_response();
    }
    next.run(req).await
}

/// Bearer-key auth for every route but the health check: resolves who is
/// calling (src/keys.rs) and hands it to the handlers as a `Caller`.
pub async fn auth(State(state): State<AppState>, headers: HeaderMap, mut req: Request, next: Next) -> Response {
    if req.uri().path() == "/v1/healthz" {
        return next.run(req).await;
    }
    let presented = headers.get(header::AUTHORIZATION).and_then(|v| v.to_str().ok()).and_then(|v| v.strip_prefix("Bearer ")).map(str::trim);
    match state.inner.keys.resolve(presented) {
        Some(caller) => {
            req.extensions_mut().insert(caller);
            next.run(req).await
        }
        None => ApiError::Unauthorized.into_response(),
    }
}

/// The caller the auth layer resolved, as a handler's argument. A request
/// that did not pass through the layer has none and is refused: a missing
/// layer fails closed.
pub struct Key(pub Caller);

impl<S: Send + Sync> FromRequestParts<S> for Key {
    type Rejection = ApiError;

    async fn from_request_parts(parts: &mut axum::http::request::Parts, _: &S) -> Result<Self, Self::Rejection> {
        parts.extensions.get::<Caller>().cloned().map(Key).ok_or(ApiError::Unauthorized)
    }
}

#[cfg(test)]
mod body_fuzz;
