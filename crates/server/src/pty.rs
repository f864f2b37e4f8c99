//! PTY sessions (docs/api.md, the podflare SDK's `sandbox.pty`): a command
//! on a terminal of the sandbox's own devpts, driven over HTTP.
//!
//! One pump task per session reads the terminal into a 1 MiB ring of output
//! numbered by byte offset (`seq`) and never waits for clients, so a session
//! outlives any client. Every reader (the create stream, attach streams,
//! long-poll reads) follows the ring from its own offset; one that falls
//! more than the ring behind skips ahead (and `read` says how much it lost).

use std::collections::VecDeque;
use std::os::fd::{AsFd, OwnedFd};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::extract::{Path, State};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use base64::Engine as _;
use jail::pty::Size;
use jail::{CommandControl, ExitStatus};
use serde::{Deserialize, Serialize};
use serde_json::json;
use tokio::io::unix::AsyncFd;
use tokio::sync::{mpsc, watch};

use crate::error::ApiError;
use crate::http::Json;
use crate::sandbox::{sandbox_env, SandboxEntry};
use crate::state::AppState;
use repl_host::events::now_ms;

/// Output kept per session for attach and read.
pub const RING_BYTES: usize = 1 << 20;
/// Sessions still running per sandbox (429 beyond).
pub const MAX_LIVE_SESSIONS: usize = 16;
/// Exited sessions kept (for attach, read and list) per sandbox; older go.
pub const MAX_EXITED_KEPT: usize = 16;
/// Largest input of one `input` call.
pub const MAX_INPUT_BYTES: usize = 1 << 20;
/// Largest `max_bytes` and `timeout_ms` of one `read`.
pub const MAX_READ_BYTES: usize = RING_BYTES;
pub const MAX_READ_WAIT: Duration = Duration::from_secs(30);
/// Largest terminal side, in cells.
pub const MAX_CELLS: u16 = 4096;
/// How long input may wait for a terminal that is not reading it.
const INPUT_DEADLINE: Duration = Duration::from_secs(10);
/// After the command exits, output still in the terminal is read for this long.
const DRAIN_AFTER_EXIT: Duration = Duration::from_millis(250);
/// Bytes per `pty_data` event.
const EVENT_BYTES: usize = 64 * 1024;

/// A session's output so far: the last `RING_BYTES` of it, and how it ended.
#[derive(Default)]
struct Output {
    ring: VecDeque<u8>,
    /// Offset (seq) of `ring[0]` in the whole output.
    start: u64,
    exit: Option<i32>,
}

impl Output {
    fn end(&self) -> u64 {
        self.start + self.ring.len() as u64
    }

    fn push(&mut self, data: &[u8]) {
        self.ring.extend(data);
        let over = self.ring.len().saturating_sub(RING_BYTES);
        if over > 0 {
            self.ring.drain(..over);
            self.start += over as u64;
        }
    }

    /// Up to `max` bytes from `since` (or from the oldest kept byte), and
    /// the seq they start at.
    fn read(&self, since: u64, max: usize) -> (Vec<u8>, u64) {
        let from = since.clamp(self.start, self.end());
        let skip = (from - self.start) as usize;
        (self.ring.iter().skip(skip).take(max).copied().collect(), from)
    }
}

pub struct PtySession {
    pub id: String,
    pub label: String,
    pub created_at_ms: u64,
    master: AsyncFd<OwnedFd>,
    size: Mutex<Size>,
    output: Mutex<Output>,
    /// Bumped whenever output arrives or the command exits.
    changed: watch::Sender<u64>,
    control: CommandControl,
}

impl PtySession {
    fn output(&self) -> std::sync::MutexGuard<'_, Output> {
        self.output.lock().unwrap_or_else(|e| e.into_inner())
    }

    pub fn exit_code(&self) -> Option<i32> {
        self.output().exit
    }

    fn bump(&self) {
        self.changed.send_modify(|v| *v += 1);
    }

    /// Write all of `data` to the terminal, waiting (a while) for room.
    async fn write(&self, mut data: &[u8]) -> Result<(), ApiError> {
        let deadline = tokio::time::Instant::now() + INPUT_DEADLINE;
        while !data.is_empty() {
            let mut guard = tokio::time::timeout_at(deadline, self.master.writable())
                .await
                .map_err(|_| ApiError::Conflict("the terminal has not read its input for 10 s".into()))?
                .map_err(|e| ApiError::engine("terminal input", e))?;
            match rustix::io::write(self.master.get_ref(), data) {
                Ok(n) => data = &data[n..],
                Err(rustix::io::Errno::WOULDBLOCK) => guard.clear_ready(),
                Err(rustix::io::Errno::IO) => return Err(ApiError::Conflict(format!("PTY session `{}` has exited", self.id))),
                Err(e) => return Err(ApiError::engine("terminal input", e)),
            }
        }
        Ok(())
    }
}

/// A sandbox's PTY sessions.
#[derive(Default)]
pub struct PtyTable {
    sessions: Mutex<Vec<Arc<PtySession>>>,
}

impl PtyTable {
    fn lock(&self) -> std::sync::MutexGuard<'_, Vec<Arc<PtySession>>> {
        self.sessions.lock().unwrap_or_else(|e| e.into_inner())
    }

    pub fn get(&self, id: &str) -> Result<Arc<PtySession>, ApiError> {
        self.lock().iter().find(|s| s.id == id).cloned().ok_or_else(|| ApiError::NotFound(format!("no PTY session `{id}`")))
    }

    pub fn list(&self) -> Vec<Arc<PtySession>> {
        self.lock().clone()
    }

    /// Room for one more running session? Forgets the oldest exited
    /// sessions beyond `MAX_EXITED_KEPT`.
    fn admit(&self) -> Result<(), ApiError> {
        let mut sessions = self.lock();
        let mut exited = sessions.iter().filter(|s| s.exit_code().is_some()).count();
        while exited > MAX_EXITED_KEPT {
            if let Some(i) = sessions.iter().position(|s| s.exit_code().is_some()) {
                sessions.remove(i);
            }
            exited -= 1;
        }
        if sessions.len() - exited >= MAX_LIVE_SESSIONS {
            return Err(ApiError::TooMany(format!("a sandbox may run at most {MAX_LIVE_SESSIONS} PTY sessions at once")));
        }
        Ok(())
    }
}

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

fn size(cols: Option<u16>, rows: Option<u16>) -> Result<Size, ApiError> {
    let s = Size { cols: cols.unwrap_or(80), rows: rows.unwrap_or(24) };
    if s.cols == 0 || s.rows == 0 || s.cols > MAX_CELLS || s.rows > MAX_CELLS {
        return Err(ApiError::BadRequest(format!("cols and rows must be between 1 and {MAX_CELLS}")));
    }
    Ok(s)
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

fn environment(id: &str, setup: &crate::setup::SandboxSetup, extra: &[(String, String)]) -> Result<Vec<String>, ApiError> {
    let mut env: Vec<String> = sandbox_env(id, setup).into_iter().filter(|v| !v.starts_with("TERM=")).collect();
    env.push("TERM=xterm-256color".into());
    for (k, v) in extra {
        if k.is_empty() || k.contains('=') || k.contains('\0') || v.contains('\0') {
            return Err(ApiError::BadRequest(format!("invalid environment variable name or value `{k}`")));
        }
        env.retain(|e| !e.starts_with(&format!("{k}=")));
        env.push(format!("{k}={v}"));
    }
    Ok(env)
}

#[utoipa::path(post, path = "/v1/sandboxes/{id}/pty", params(("id" = String, Path)), request_body = PtyCreate,
    responses((status = 200, description = "NDJSON stream: pty_ready {session_id}, pty_data {data_b64, seq}, pty_exit {data: exit code}, pty_error {message}", content_type = "application/x-ndjson"),
        (status = 400, body = protocol::ErrorBody), (status = 404, body = protocol::ErrorBody), (status = 429, body = protocol::ErrorBody)))]
pub async fn create(
    State(state): State<AppState>,
    caller: crate::keys::Caller,
    Path(id): Path<String>,
    Json(req): Json<PtyCreate>,
) -> Result<Response, ApiError> {
    let entry = state.get(&caller, &id).await?;
    let (argv, label) = command(&req)?;
    let size = size(req.cols, req.rows)?;
    let env = environment(&entry.id, &entry.settings.setup, req.env.as_deref().unwrap_or_default())?;
    let cwd = match &req.cwd {
        Some(c) => crate::files::sandbox_path(c)?.to_string(),
        None => crate::files::HOME.to_string(),
    };
    let check = jail::fs::SandboxPath::parse(&cwd, "/").map_err(ApiError::from)?;
    let info = crate::files::with_fs(&entry, move |fs| fs.stat(&check, true)).await?;
    if info.kind != jail::fs::EntryType::Dir {
        return Err(ApiError::BadRequest(format!("cwd {cwd} is not a directory")));
    }
    entry.ptys.admit()?;
    let process = entry.engine.spawn_terminal(argv, env, &cwd, size).await.map_err(|e| ApiError::engine("could not start the PTY session", e))?;
    // SAFETY: the AsyncFd owns the master, which stays open and the same for its life.
    let master = unsafe { AsyncFd::register(process.master) }.map_err(|e| ApiError::engine("register terminal", e.into_parts().1))?;
    let session = Arc::new(PtySession {
        id: format!("pty-{}", &crate::state::new_id()[3..15]),
        label,
        created_at_ms: now_ms(),
        master,
        size: Mutex::new(size),
        output: Mutex::new(Output::default()),
        changed: watch::channel(0).0,
        control: process.control,
    });
    entry.ptys.lock().push(Arc::clone(&session));
    tokio::spawn(pump(Arc::clone(&session), process.exited, Arc::clone(&entry)));
    if let Some(ms) = req.timeout_ms.filter(|ms| *ms > 0) {
        let s = Arc::clone(&session);
        tokio::spawn(async move {
            tokio::time::sleep(Duration::from_millis(ms)).await;
            if s.exit_code().is_none() {
                s.control.kill().await;
            }
        });
    }
    let (tx, rx) = mpsc::channel(64);
    let _ = tx.send(json!({"type": "pty_ready", "session_id": session.id})).await;
    tokio::spawn(follow(session, 0, tx));
    Ok(crate::http::ndjson_stream(rx))
}

/// Read the terminal into the ring until the command has exited and its
/// output is drained, then record the exit code.
async fn pump(session: Arc<PtySession>, mut exited: tokio::sync::oneshot::Receiver<ExitStatus>, entry: Arc<SandboxEntry>) {
    let mut buf = vec![0u8; 64 * 1024];
    let mut code: Option<i32> = None;
    let mut drain_until: Option<tokio::time::Instant> = None;
    loop {
        let drain = async {
            match drain_until {
                Some(t) => tokio::time::sleep_until(t).await,
                None => std::future::pending().await,
            }
        };
        tokio::select! {
            status = &mut exited, if code.is_none() => {
                // An unknown end (the sandbox went) reads as -1.
                code = Some(status.map(|s| s.code()).unwrap_or(-1));
                drain_until = Some(tokio::time::Instant::now() + DRAIN_AFTER_EXIT);
            }
            _ = drain => break,
            ready = session.master.readable() => {
                let Ok(mut guard) = ready else { break };
                match rustix::io::read(session.master.get_ref().as_fd(), &mut buf) {
                    Ok(0) => break,
                    Ok(n) => {
                        session.output().push(&buf[..n]);
                        session.bump();
                        entry.touch();
                    }
                    Err(rustix::io::Errno::WOULDBLOCK) => guard.clear_ready(),
                    // EIO: every holder of the terminal's other side is gone.
                    Err(_) => {
                        if code.is_none() {
                            code = Some((&mut exited).await.map(|s| s.code()).unwrap_or(-1));
                        }
                        break;
                    }
                }
            }
        }
    }
    session.output().exit = Some(code.unwrap_or(-1));
    session.bump();
}

/// Stream a session's output from `cursor` as NDJSON events, then its exit.
async fn follow(session: Arc<PtySession>, mut cursor: u64, tx: mpsc::Sender<serde_json::Value>) {
    let mut changed = session.changed.subscribe();
    loop {
        let (chunk, from, exit) = {
            let out = session.output();
            let (chunk, from) = out.read(cursor, EVENT_BYTES);
            (chunk, from, out.exit)
        };
        if !chunk.is_empty() {
            cursor = from + chunk.len() as u64;
            let ev = json!({"type": "pty_data", "data_b64": base64::engine::general_purpose::STANDARD.encode(&chunk), "seq": from});
            if tx.send(ev).await.is_err() {
                return;
            }
            continue;
        }
        if let Some(code) = exit {
            let _ = tx.send(json!({"type": "pty_exit", "data": code})).await;
            return;
        }
        tokio::select! {
            r = changed.changed() => if r.is_err() { return },
            _ = tx.closed() => return,
        }
    }
}

#[utoipa::path(get, path = "/v1/sandboxes/{id}/pty/{pty}/attach", params(("id" = String, Path), ("pty" = String, Path)),
    responses((status = 200, description = "NDJSON stream: the ring buffer's pty_data first, then live events until pty_exit", content_type = "application/x-ndjson"),
        (status = 404, body = protocol::ErrorBody)))]
pub async fn attach(State(state): State<AppState>, caller: crate::keys::Caller, Path((id, pty)): Path<(String, String)>) -> Result<Response, ApiError> {
    let session = state.get(&caller, &id).await?.ptys.get(&pty)?;
    let (tx, rx) = mpsc::channel(64);
    tokio::spawn(follow(session, 0, tx));
    Ok(crate::http::ndjson_stream(rx))
}

#[utoipa::path(post, path = "/v1/sandboxes/{id}/pty/{pty}/input", params(("id" = String, Path), ("pty" = String, Path)), request_body = PtyInput,
    responses((status = 204), (status = 400, body = protocol::ErrorBody), (status = 404, body = protocol::ErrorBody), (status = 409, body = protocol::ErrorBody), (status = 413, body = protocol::ErrorBody)))]
pub async fn input(
    State(state): State<AppState>,
    caller: crate::keys::Caller,
    Path((id, pty)): Path<(String, String)>,
    Json(req): Json<PtyInput>,
) -> Result<Response, ApiError> {
    let entry = state.get(&caller, &id).await?;
    let session = entry.ptys.get(&pty)?;
    if req.data_b64.len() > MAX_INPUT_BYTES / 3 * 4 + 4 {
        return Err(ApiError::TooLarge(format!("input is larger than {MAX_INPUT_BYTES} bytes")));
    }
    let data = base64::engine::general_purpose::STANDARD.decode(&req.data_b64).map_err(|e| ApiError::BadRequest(format!("data_b64 is not base64: {e}")))?;
    if data.len() > MAX_INPUT_BYTES {
        return Err(ApiError::TooLarge(format!("input is larger than {MAX_INPUT_BYTES} bytes")));
    }
    if session.exit_code().is_some() {
        return Err(ApiError::Conflict(format!("PTY session `{pty}` has exited")));
    }
    entry.touch();
    crate::pause::ensure_running(&entry).await?;
    session.write(&data).await?;
    Ok(StatusCode::NO_CONTENT.into_response())
}

#[utoipa::path(post, path = "/v1/sandboxes/{id}/pty/{pty}/resize", params(("id" = String, Path), ("pty" = String, Path)), request_body = PtyResize,
    responses((status = 204), (status = 400, body = protocol::ErrorBody), (status = 404, body = protocol::ErrorBody), (status = 409, body = protocol::ErrorBody)))]
pub async fn resize(
    State(state): State<AppState>,
    caller: crate::keys::Caller,
    Path((id, pty)): Path<(String, String)>,
    Json(req): Json<PtyResize>,
) -> Result<Response, ApiError> {
    let session = state.get(&caller, &id).await?.ptys.get(&pty)?;
    let size = size(Some(req.cols), Some(req.rows))?;
    if session.exit_code().is_some() {
        return Err(ApiError::Conflict(format!("PTY session `{pty}` has exited")));
    }
    jail::pty::resize(session.master.get_ref(), size).map_err(|e| ApiError::engine("resize the terminal", e))?;
    *session.size.lock().unwrap_or_else(|e| e.into_inner()) = size;
    Ok(StatusCode::NO_CONTENT.into_response())
}

#[utoipa::path(post, path = "/v1/sandboxes/{id}/pty/{pty}/kill", params(("id" = String, Path), ("pty" = String, Path)),
    responses((status = 204), (status = 404, body = protocol::ErrorBody)))]
pub async fn kill(State(state): State<AppState>, caller: crate::keys::Caller, Path((id, pty)): Path<(String, String)>) -> Result<Response, ApiError> {
    let session = state.get(&caller, &id).await?.ptys.get(&pty)?;
    if session.exit_code().is_none() {
        session.control.kill().await;
    }
    Ok(StatusCode::NO_CONTENT.into_response())
}

#[utoipa::path(get, path = "/v1/sandboxes/{id}/pty", params(("id" = String, Path)), responses((status = 200, body = [PtyInfo]), (status = 404, body = protocol::ErrorBody)))]
pub async fn list(State(state): State<AppState>, caller: crate::keys::Caller, Path(id): Path<String>) -> Result<Response, ApiError> {
    let entry = state.get(&caller, &id).await?;
    let out: Vec<PtyInfo> = entry
        .ptys
        .list()
        .iter()
        .map(|s| {
            let size = *s.size.lock().unwrap_or_else(|e| e.into_inner());
            PtyInfo {
                pty_id: s.id.clone(),
                cmd_label: s.label.clone(),
                created_at_ms: s.created_at_ms,
                exit_code: s.exit_code(),
                cols: size.cols,
                rows: size.rows,
            }
        })
        .collect();
    Ok((StatusCode::OK, axum::Json(out)).into_response())
}

#[utoipa::path(post, path = "/v1/sandboxes/{id}/pty/{pty}/read", params(("id" = String, Path), ("pty" = String, Path)), request_body = PtyRead,
    responses((status = 200, body = PtyChunk), (status = 400, body = protocol::ErrorBody), (status = 404, body = protocol::ErrorBody)))]
pub async fn read(
    State(state): State<AppState>,
    caller: crate::keys::Caller,
    Path((id, pty)): Path<(String, String)>,
    Json(req): Json<PtyRead>,
) -> Result<Response, ApiError> {
    let session = state.get(&caller, &id).await?.ptys.get(&pty)?;
    let max = req.max_bytes.unwrap_or(64 * 1024);
    if max == 0 || max > MAX_READ_BYTES {
        return Err(ApiError::BadRequest(format!("max_bytes must be between 1 and {MAX_READ_BYTES}")));
    }
    let wait = Duration::from_millis(req.timeout_ms.unwrap_or(10_000)).min(MAX_READ_WAIT);
    let deadline = tokio::time::Instant::now() + wait;
    let mut changed = session.changed.subscribe();
    loop {
        let (chunk, from, exit) = {
            let out = session.output();
            let (chunk, from) = out.read(req.since_seq, max);
            (chunk, from, out.exit)
        };
        if !chunk.is_empty() || exit.is_some() || tokio::time::Instant::now() >= deadline {
            let reply = PtyChunk {
                data_b64: base64::engine::general_purpose::STANDARD.encode(&chunk),
                seq: from,
                next_seq: from + chunk.len() as u64,
                dropped: from.saturating_sub(req.since_seq),
                exited: exit.is_some() && chunk.is_empty(),
                exit_code: exit,
            };
            return Ok((StatusCode::OK, axum::Json(reply)).into_response());
        }
        let _ = tokio::time::timeout_at(deadline, changed.changed()).await;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_ring_keeps_the_last_mebibyte_by_offset() {
        let mut out = Output::default();
        out.push(&vec![b'a'; RING_BYTES - 10]);
        out.push(&[b'b'; 20]);
        assert_eq!(out.start, 10);
        assert_eq!(out.end(), RING_BYTES as u64 + 10);
        let (chunk, from) = out.read(0, 5);
        assert_eq!((chunk, from), (vec![b'a'; 5], 10), "a reader behind the ring skips to its start");
        let (chunk, from) = out.read(RING_BYTES as u64, 100);
        assert_eq!((chunk, from), (vec![b'b'; 10], RING_BYTES as u64));
        let (chunk, _) = out.read(u64::MAX, 100);
        assert!(chunk.is_empty());
    }
}
