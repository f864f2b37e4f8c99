//! HTTP handlers: thin functions that parse, validate and call `AppState`.

use std::convert::Infallible;
use std::sync::atomic::Ordering;
use std::time::Duration;

use axum::body::Body;
use axum::extract::rejection::JsonRejection;
use axum::extract::{FromRequest, FromRequestParts, Path, Request, State};
use axum::http::{header, HeaderMap, StatusCode};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use futures::StreamExt;
use protocol::{CreateSandbox, Created, ExecRequest, SandboxInfo, SandboxList, MAX_CODE_BYTES};
use tokio::sync::mpsc;
use tokio_stream::wrappers::ReceiverStream;

use crate::error::ApiError;
use crate::keys::Caller;
use crate::state::AppState;
use repl_host::events::EventSink;

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
    serde_json::from_value(v).map_err(|e| ApiError::BadRequest(format!("invalid request body: {e}")))
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

pub(crate) fn json<T: serde::Serialize>(status: StatusCode, v: &T) -> Response {
    (status, axum::Json(v)).into_response()
}

#[utoipa::path(get, path = "/v1/healthz", responses((status = 200, description = "`ok` once the default template is ready"), (status = 503, body = protocol::ErrorBody)))]
pub async fn healthz(State(state): State<AppState>) -> Response {
    if state.inner.templates.is_ready("default") {
        (StatusCode::OK, "ok").into_response()
    } else {
        let err = state.inner.templates.rootfs("default").err().unwrap_or(ApiError::Unavailable { message: "starting".into(), progress: None });
        err.into_response()
    }
}

#[utoipa::path(post, path = "/v1/sandboxes", request_body = CreateSandbox,
    responses((status = 200, body = Created), (status = 400, body = protocol::ErrorBody), (status = 404, body = protocol::ErrorBody),
        (status = 429, body = protocol::ErrorBody), (status = 501, body = protocol::ErrorBody), (status = 503, body = protocol::ErrorBody),
        (status = 507, body = protocol::ErrorBody)))]
pub async fn create(
    State(state): State<AppState>,
    caller: Caller,
    body: Result<bytes::Bytes, axum::extract::rejection::BytesRejection>,
) -> Result<Response, ApiError> {
    let req: CreateSandbox = optional_body(body)?;
    let entry = state.create(&caller, req).await?;
    Ok(json(StatusCode::OK, &Created { id: entry.id.clone(), state: "ready".into() }))
}

#[utoipa::path(get, path = "/v1/sandboxes", responses((status = 200, body = SandboxList)))]
pub async fn list(State(state): State<AppState>, caller: Caller) -> Response {
    let sandboxes: Vec<SandboxInfo> = state.list(&caller).await.iter().map(|e| e.info()).collect();
    json(StatusCode::OK, &SandboxList { sandboxes })
}

#[utoipa::path(get, path = "/v1/sandboxes/{id}", params(("id" = String, Path)), responses((status = 200, body = SandboxInfo), (status = 404, body = protocol::ErrorBody)))]
pub async fn info(State(state): State<AppState>, caller: Caller, Path(id): Path<String>) -> Result<Response, ApiError> {
    match state.get(&caller, &id).await {
        Ok(entry) => Ok(json(StatusCode::OK, &entry.info())),
        // A frozen sandbox is shown as it was, with `state: "frozen"`.
        Err(ApiError::Conflict(e)) => match state.frozen(&caller, &id).await {
            Some(crate::state::Frozen::Space(space)) => Ok(json(StatusCode::OK, &space.sandbox)),
            _ => Err(ApiError::Conflict(e)),
        },
        Err(e) => Err(e),
    }
}

#[utoipa::path(delete, path = "/v1/sandboxes/{id}", params(("id" = String, Path)), responses((status = 204), (status = 404, body = protocol::ErrorBody)))]
pub async fn destroy(State(state): State<AppState>, caller: Caller, Path(id): Path<String>) -> Result<Response, ApiError> {
    if !crate::state::valid_id(&id) {
        state.get(&caller, &id).await?;
    }
    state.destroy(&caller, &id).await?;
    Ok(StatusCode::NO_CONTENT.into_response())
}

#[utoipa::path(post, path = "/v1/sandboxes/{id}/exec", params(("id" = String, Path)), request_body = ExecRequest,
    responses((status = 200, description = "NDJSON stream of events", body = protocol::Event, content_type = "application/x-ndjson"),
        (status = 400, body = protocol::ErrorBody), (status = 404, body = protocol::ErrorBody), (status = 413, body = protocol::ErrorBody)))]
pub async fn exec(State(state): State<AppState>, caller: Caller, Path(id): Path<String>, Json(req): Json<ExecRequest>) -> Result<Response, ApiError> {
    let entry = state.get(&caller, &id).await?;
    if req.code.len() > MAX_CODE_BYTES {
        return Err(ApiError::TooLarge(format!("code is {} bytes; the limit is {MAX_CODE_BYTES}", req.code.len())));
    }
    let language = req.language.as_deref().unwrap_or("python");
    if language != "python" && language != "bash" {
        return Err(ApiError::BadRequest(format!("unknown language `{language}` (use `python` or `bash`)")));
    }
    let limits = &state.inner.config.limits;
    let timeout = match req.timeout_ms {
        None => limits.default_exec_timeout,
        Some(0) => return Err(ApiError::BadRequest("timeout_ms must be at least 1".into())),
        Some(ms) => Duration::from_millis(ms).min(limits.max_exec_timeout),
    };
    let bounds = crate::sandbox::ExecBounds { timeout, stop: state.inner.drain.stop_token() };
    let (tx, rx) = mpsc::channel(256);
    let is_python = language == "python";
    let busy = entry.hold_busy();
    let started = std::time::Instant::now();
    // The exec runs in its own task: a client that disconnects does not
    // cancel it halfway (the REPL stays consistent); it just stops listening.
    // It logs under the request's span.
    let span = tracing::Span::current();
    tokio::spawn(tracing::Instrument::instrument(
        async move {
            // Busy until the exec is over, however it ends.
            let _busy = busy;
            // A sandbox's network may still be coming up (src/egress.rs).
            let network_failed = entry.network.lock().await.failed.take();
            let mut slot = entry.slot.lock().await;
            let mut sink = EventSink::new(tx, entry.replay.clone());
            if let Some(why) = network_failed {
                sink.warning(why).await;
            }
            if let Err(e) = crate::pause::ensure_running(&entry).await {
                sink.error(e.to_string(), None, None, None).await;
                sink.exit(1).await;
                return;
            }
            if !entry.lifecycle().can_run() {
                sink.error("the sandbox was destroyed".into(), None, None, None).await;
                sink.exit(1).await;
            } else if bounds.stop.is_cancelled() {
                // Queued behind another exec until after the drain ran out: it
                // never starts.
                crate::sandbox::never_started_for_shutdown(&mut sink).await;
            } else if is_python {
                entry.run_python(&mut slot, &req.code, &bounds, &mut sink).await;
            } else {
                entry.run_bash(&mut slot, &req.code, &bounds, &mut sink).await;
            }
            entry.execs.fetch_add(1, Ordering::Relaxed);
            entry.touch();
            state.inner.metrics.observe_exec(if is_python { "python" } else { "bash" }, started);
        },
        span,
    ));
    Ok(ndjson_stream(rx))
}

/// A streaming NDJSON response: one line per value received.
pub fn ndjson_stream<T: serde::Serialize + Send + 'static>(rx: mpsc::Receiver<T>) -> Response {
    let body = ReceiverStream::new(rx).map(|ev| {
        let mut line = serde_json::to_vec(&ev).unwrap_or_default();
        line.push(b'\n');
        Ok::<_, Infallible>(bytes::Bytes::from(line))
    });
    ndjson(Body::from_stream(body))
}

fn ndjson(body: Body) -> Response {
    Response::builder()
        .status(StatusCode::OK)
        .header(header::CONTENT_TYPE, "application/x-ndjson")
        .header(header::CACHE_CONTROL, "no-cache")
        .body(body)
        .unwrap_or_else(|_| StatusCode::INTERNAL_SERVER_ERROR.into_response())
}

#[utoipa::path(get, path = "/v1/sandboxes/{id}/replay", params(("id" = String, Path)),
    responses((status = 200, description = "NDJSON of the last 1000 events", content_type = "application/x-ndjson"), (status = 404, body = protocol::ErrorBody)))]
pub async fn replay(State(state): State<AppState>, caller: Caller, Path(id): Path<String>) -> Result<Response, ApiError> {
    let entry = state.get(&caller, &id).await?;
    let events: Vec<protocol::Event> = entry.replay.lock().map(|r| r.iter().cloned().collect()).unwrap_or_default();
    let mut out = Vec::new();
    for ev in events {
        out.extend(serde_json::to_vec(&ev).unwrap_or_default());
        out.push(b'\n');
    }
    Ok(ndjson(Body::from(out)))
}

#[utoipa::path(post, path = "/v1/sandboxes/{id}/fork", params(("id" = String, Path)), request_body = protocol::ForkRequest,
    responses((status = 200, body = protocol::Forked), (status = 400, body = protocol::ErrorBody), (status = 404, body = protocol::ErrorBody),
        (status = 429, body = protocol::ErrorBody), (status = 500, body = protocol::ErrorBody), (status = 507, body = protocol::ErrorBody)))]
pub async fn fork(State(state): State<AppState>, caller: Caller, Path(id): Path<String>, Json(req): Json<protocol::ForkRequest>) -> Result<Response, ApiError> {
    let n = usize::try_from(req.n).unwrap_or(0);
    let children = state.fork(&caller, &id, n).await?;
    Ok(json(StatusCode::OK, &protocol::Forked { children }))
}

#[utoipa::path(post, path = "/v1/sandboxes/{id}/merge_into/{winner}", params(("id" = String, Path), ("winner" = String, Path)),
    responses((status = 204), (status = 400, body = protocol::ErrorBody), (status = 404, body = protocol::ErrorBody), (status = 409, body = protocol::ErrorBody)))]
pub async fn merge_into(State(state): State<AppState>, caller: Caller, Path((id, winner)): Path<(String, String)>) -> Result<Response, ApiError> {
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
    caller: Caller,
    Path((id, other)): Path<(String, String)>,
    query: Result<axum::extract::Query<DiffQuery>, axum::extract::rejection::QueryRejection>,
) -> Result<Response, ApiError> {
    let axum::extract::Query(q) = query.map_err(|e| ApiError::BadRequest(e.body_text()))?;
    let paths: Vec<String> = q.paths.unwrap_or_default().split(',').filter(|p| !p.is_empty()).map(str::to_string).collect();
    Ok(json(StatusCode::OK, &state.diff(&caller, &id, &other, paths).await?))
}

#[utoipa::path(get, path = "/v1/pool", responses((status = 200, body = crate::pool::PoolInfo, description = "The warm pool's hidden sandboxes by template")))]
pub async fn pool(State(state): State<AppState>, caller: Caller) -> Response {
    json(StatusCode::OK, &state.inner.pool.info(&caller, &state.inner.templates, state.inner.jail.spare_ids()).await)
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

/// The caller the auth layer resolved. A request that did not pass through
/// it has none and is refused: a missing layer fails closed.
impl<S: Send + Sync> FromRequestParts<S> for Caller {
    type Rejection = ApiError;

    async fn from_request_parts(parts: &mut axum::http::request::Parts, _: &S) -> Result<Self, Self::Rejection> {
        parts.extensions.get::<Caller>().cloned().ok_or(ApiError::Unauthorized)
    }
}

#[cfg(test)]
mod body_fuzz;
