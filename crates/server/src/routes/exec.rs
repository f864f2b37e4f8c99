//! Running code: exec (a streaming NDJSON answer) and the replay of past
//! events.

use std::sync::atomic::Ordering;
use std::time::Duration;

use axum::body::Body;
use axum::extract::{Path, State};
use axum::response::Response;
use protocol::{ExecRequest, MAX_CODE_BYTES};
use repl_host::events::EventSink;
use tokio::sync::mpsc;

use crate::error::ApiError;
use crate::http::{ndjson, ndjson_stream, Json};
use crate::keys::Caller;
use crate::state::AppState;

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
