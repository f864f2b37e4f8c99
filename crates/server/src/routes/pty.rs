//! The PTY routes (the podflare SDK's `sandbox.pty`): its request shapes,
//! base64 on the wire, NDJSON streams of `pty_*` events over
//! `service::pty`'s sessions.

use std::sync::Arc;
use std::time::Duration;

use axum::extract::{Path, State};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use base64::Engine as _;
use serde::{Deserialize, Serialize};
use serde_json::json;
use service::pty::{PtySession, PtySpec, MAX_INPUT_BYTES, MAX_READ_BYTES, MAX_READ_WAIT};
use tokio::sync::mpsc;

use crate::error::ApiError;
use crate::http::{Json, Key};
use crate::AppState;

/// Bytes per `pty_data` event.
const EVENT_BYTES: usize = 64 * 1024;

/// Body of `POST /v1/sandboxes/{id}/pty` (the podflare SDK's shape).
#[derive(Debug, Deserialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
pub struct PtyCreate {
    /// Run under `bash -lc` (either this or `argv`).
    #[serde(rename = "shellCmd")]
    pub shell_cmd: Option<String>,
    /// Run directly (execvp).
    pub argv: Option<Vec<String>>,
    pub cols: Option<u16>,
    pub rows: Option<u16>,
    /// Extra environment as `[name, value]` pairs.
    pub env: Option<Vec<(String, String)>>,
    /// Working directory (default /root).
    pub cwd: Option<String>,
    /// Kill the session after this long (0 or absent: no limit but the sandbox's).
    pub timeout_ms: Option<u64>,
}

#[derive(Debug, Deserialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
pub struct PtyInput {
    pub data_b64: String,
}

#[derive(Debug, Deserialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
pub struct PtyResize {
    pub cols: u16,
    pub rows: u16,
}

#[derive(Debug, Deserialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
pub struct PtyRead {
    #[serde(default)]
    pub since_seq: u64,
    pub max_bytes: Option<usize>,
    pub timeout_ms: Option<u64>,
}

/// Answer of `POST .../pty/{pty}/read`.
#[derive(Debug, Serialize, utoipa::ToSchema)]
pub struct PtyChunk {
    pub data_b64: String,
    /// Offset of the first byte of `data_b64` in the session's output.
    pub seq: u64,
    /// Where the next read should start.
    pub next_seq: u64,
    /// Bytes between `since_seq` and `seq` that had already left the ring.
    pub dropped: u64,
    pub exited: bool,
    pub exit_code: Option<i32>,
}

/// One entry of `GET .../pty`.
#[derive(Debug, Serialize, utoipa::ToSchema)]
pub struct PtyInfo {
    pub pty_id: String,
    pub cmd_label: String,
    pub created_at_ms: u64,
    pub exit_code: Option<i32>,
    pub cols: u16,
    pub rows: u16,
}

/// The command line and label of a create request.
fn command(req: &PtyCreate) -> Result<(Vec<String>, String), ApiError> {
    match (&req.shell_cmd, &req.argv) {
        (Some(cmd), None) => Ok((vec!["/bin/bash".into(), "-lc".into(), cmd.clone()], cmd.clone())),
        (None, Some(argv)) if !argv.is_empty() && !argv[0].is_empty() => Ok((argv.clone(), argv.join(" "))),
        (None, Some(_)) => Err(ApiError::BadRequest("argv must name a program".into())),
        _ => Err(ApiError::BadRequest("give exactly one of `shellCmd` and `argv`".into())),
    }
}

#[utoipa::path(post, path = "/v1/sandboxes/{id}/pty", params(("id" = String, Path)), request_body = PtyCreate,
    responses((status = 200, description = "NDJSON stream: pty_ready {session_id}, pty_data {data_b64, seq}, pty_exit {data: exit code}, pty_error {message}", content_type = "application/x-ndjson"),
        (status = 400, body = protocol::ErrorBody), (status = 404, body = protocol::ErrorBody), (status = 429, body = protocol::ErrorBody)))]
pub async fn create(State(state): State<AppState>, Key(caller): Key, Path(id): Path<String>, Json(req): Json<PtyCreate>) -> Result<Response, ApiError> {
    let entry = state.get(&caller, &id).await?;
    let (argv, label) = command(&req)?;
    let size = service::pty::size(req.cols, req.rows)?;
    let spec = PtySpec {
        argv,
        label,
        size,
        env: req.env.unwrap_or_default(),
        cwd: req.cwd,
        timeout: req.timeout_ms.filter(|ms| *ms > 0).map(Duration::from_millis),
        run_as: service::pty::RunAs::ROOT,
    };
    let session = service::pty::start(&entry, spec).await?;
    let (tx, rx) = mpsc::channel(64);
    let _ = tx.send(json!({"type": "pty_ready", "session_id": session.id})).await;
    tokio::spawn(follow(session, 0, tx));
    Ok(crate::http::ndjson_stream(rx))
}

/// Stream a session's output from `cursor` as NDJSON events, then its exit,
/// until the client goes.
async fn follow(session: Arc<PtySession>, mut cursor: u64, tx: mpsc::Sender<serde_json::Value>) {
    loop {
        let chunk = tokio::select! {
            chunk = session.read(cursor, EVENT_BYTES, None) => chunk,
            _ = tx.closed() => return,
        };
        if !chunk.data.is_empty() {
            cursor = chunk.next_seq();
            let ev = json!({"type": "pty_data", "data_b64": base64::engine::general_purpose::STANDARD.encode(&chunk.data), "seq": chunk.seq});
            if tx.send(ev).await.is_err() {
                return;
            }
            continue;
        }
        match chunk.exit {
            Some(code) => {
                let _ = tx.send(json!({"type": "pty_exit", "data": code})).await;
                return;
            }
            // The session's notifier went without an exit: nothing more will come.
            None => return,
        }
    }
}

#[utoipa::path(get, path = "/v1/sandboxes/{id}/pty/{pty}/attach", params(("id" = String, Path), ("pty" = String, Path)),
    responses((status = 200, description = "NDJSON stream: the ring buffer's pty_data first, then live events until pty_exit", content_type = "application/x-ndjson"),
        (status = 404, body = protocol::ErrorBody)))]
pub async fn attach(State(state): State<AppState>, Key(caller): Key, Path((id, pty)): Path<(String, String)>) -> Result<Response, ApiError> {
    let session = state.get(&caller, &id).await?.ptys.get(&pty)?;
    let (tx, rx) = mpsc::channel(64);
    tokio::spawn(follow(session, 0, tx));
    Ok(crate::http::ndjson_stream(rx))
}

#[utoipa::path(post, path = "/v1/sandboxes/{id}/pty/{pty}/input", params(("id" = String, Path), ("pty" = String, Path)), request_body = PtyInput,
    responses((status = 204), (status = 400, body = protocol::ErrorBody), (status = 404, body = protocol::ErrorBody), (status = 409, body = protocol::ErrorBody), (status = 413, body = protocol::ErrorBody)))]
pub async fn input(
    State(state): State<AppState>,
    Key(caller): Key,
    Path((id, pty)): Path<(String, String)>,
    Json(req): Json<PtyInput>,
) -> Result<Response, ApiError> {
    let entry = state.get(&caller, &id).await?;
    let session = entry.ptys.get(&pty)?;
    // Refused before decoding: base64 is 4/3 of the bytes.
    if req.data_b64.len() > MAX_INPUT_BYTES / 3 * 4 + 4 {
        return Err(ApiError::TooLarge(format!("input is larger than {MAX_INPUT_BYTES} bytes")));
    }
    let data = base64::engine::general_purpose::STANDARD.decode(&req.data_b64).map_err(|e| ApiError::BadRequest(format!("data_b64 is not base64: {e}")))?;
    session.input(&entry, &data).await?;
    Ok(StatusCode::NO_CONTENT.into_response())
}

#[utoipa::path(post, path = "/v1/sandboxes/{id}/pty/{pty}/resize", params(("id" = String, Path), ("pty" = String, Path)), request_body = PtyResize,
    responses((status = 204), (status = 400, body = protocol::ErrorBody), (status = 404, body = protocol::ErrorBody), (status = 409, body = protocol::ErrorBody)))]
pub async fn resize(
    State(state): State<AppState>,
    Key(caller): Key,
    Path((id, pty)): Path<(String, String)>,
    Json(req): Json<PtyResize>,
) -> Result<Response, ApiError> {
    let session = state.get(&caller, &id).await?.ptys.get(&pty)?;
    session.resize(service::pty::size(Some(req.cols), Some(req.rows))?)?;
    Ok(StatusCode::NO_CONTENT.into_response())
}

#[utoipa::path(post, path = "/v1/sandboxes/{id}/pty/{pty}/kill", params(("id" = String, Path), ("pty" = String, Path)),
    responses((status = 204), (status = 404, body = protocol::ErrorBody)))]
pub async fn kill(State(state): State<AppState>, Key(caller): Key, Path((id, pty)): Path<(String, String)>) -> Result<Response, ApiError> {
    state.get(&caller, &id).await?.ptys.get(&pty)?.kill().await;
    Ok(StatusCode::NO_CONTENT.into_response())
}

#[utoipa::path(get, path = "/v1/sandboxes/{id}/pty", params(("id" = String, Path)), responses((status = 200, body = [PtyInfo]), (status = 404, body = protocol::ErrorBody)))]
pub async fn list(State(state): State<AppState>, Key(caller): Key, Path(id): Path<String>) -> Result<Response, ApiError> {
    let entry = state.get(&caller, &id).await?;
    let out: Vec<PtyInfo> = entry
        .ptys
        .list()
        .iter()
        .map(|s| {
            let s = s.status();
            PtyInfo { pty_id: s.id, cmd_label: s.label, created_at_ms: s.created_at_ms, exit_code: s.exit_code, cols: s.size.cols, rows: s.size.rows }
        })
        .collect();
    Ok((StatusCode::OK, axum::Json(out)).into_response())
}

#[utoipa::path(post, path = "/v1/sandboxes/{id}/pty/{pty}/read", params(("id" = String, Path), ("pty" = String, Path)), request_body = PtyRead,
    responses((status = 200, body = PtyChunk), (status = 400, body = protocol::ErrorBody), (status = 404, body = protocol::ErrorBody)))]
pub async fn read(
    State(state): State<AppState>,
    Key(caller): Key,
    Path((id, pty)): Path<(String, String)>,
    Json(req): Json<PtyRead>,
) -> Result<Response, ApiError> {
    let session = state.get(&caller, &id).await?.ptys.get(&pty)?;
    let max = req.max_bytes.unwrap_or(64 * 1024);
    if max == 0 || max > MAX_READ_BYTES {
        return Err(ApiError::BadRequest(format!("max_bytes must be between 1 and {MAX_READ_BYTES}")));
    }
    let wait = Duration::from_millis(req.timeout_ms.unwrap_or(10_000)).min(MAX_READ_WAIT);
    let chunk = session.read(req.since_seq, max, Some(tokio::time::Instant::now() + wait)).await;
    let reply = PtyChunk {
        data_b64: base64::engine::general_purpose::STANDARD.encode(&chunk.data),
        seq: chunk.seq,
        next_seq: chunk.next_seq(),
        dropped: chunk.seq.saturating_sub(req.since_seq),
        exited: chunk.exit.is_some() && chunk.data.is_empty(),
        exit_code: chunk.exit,
    };
    Ok((StatusCode::OK, axum::Json(reply)).into_response())
}
