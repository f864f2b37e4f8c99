//! E2B's code interpreter (port 49999) on forkbox's own REPL instead of a
//! Jupyter kernel: `POST /execute` streams JSON lines (no blank ones) made
//! from the exec's events; `/contexts` are more REPLs in the same sandbox
//! (`service::contexts`). The sandbox's own REPL is the default context.

use std::sync::atomic::Ordering;
use std::sync::Arc;

use axum::body::Body;
use axum::extract::{Path, State};
use axum::http::{header, HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::{delete, get, post};
use axum::Router;
use futures::StreamExt;
use protocol::{Event, EventKind, ExecRequest};
use serde::Deserialize;
use serde_json::{json, Map, Value};
use service::contexts::Target;
use service::exec::ExecOptions;
use service::keys::Caller;
use service::sandbox::SandboxEntry;
use tokio_util::sync::CancellationToken;

use crate::error::ApiError;
use crate::{E2b, Sandbox};

/// Where contexts start unless told (E2B's default).
pub const DEFAULT_CWD: &str = "/home/user";

pub fn router() -> Router<E2b> {
    Router::new()
        .route("/health", get(|| async { "OK" }))
        .route("/execute", post(execute))
        .route("/contexts", post(create_context).get(list_contexts))
        .route("/contexts/{context}", delete(delete_context))
        .route("/contexts/{context}/restart", post(restart_context))
        .fallback(|| async { ApiError::not_found("no such route") })
}

/// The default context's start, as E2B's sandboxes have it: in
/// `/home/user` when the template has it, with the sandbox's variables in
/// `os.environ` (run once, at create).
pub async fn prepare(entry: &Arc<SandboxEntry>) {
    let env: serde_json::Map<String, Value> = entry.settings.env.iter().map(|(k, v)| (k.clone(), json!(v))).collect();
    let env = serde_json::to_string(&serde_json::to_string(&env).unwrap_or_default()).unwrap_or_default();
    let cwd = serde_json::to_string(DEFAULT_CWD).unwrap_or_default();
    let code = format!("import os as _fb_os, json as _fb_json\nif _fb_os.path.isdir({cwd}):\n    _fb_os.chdir({cwd})\n_fb_os.environ.update(_fb_json.loads({env}))\ndel _fb_os, _fb_json\n");
    let mut slot = entry.slot.lock().await;
    if let Err(e) = entry.run_hidden(&mut slot, &code, std::time::Duration::from_secs(30)).await {
        tracing::warn!(sandbox = %entry.id, err = %e, "could not prepare the sandbox's REPL for E2B");
    }
}

#[derive(Debug, Default, Deserialize)]
#[serde(default)]
struct ExecuteRequest {
    code: String,
    context_id: Option<String>,
    language: Option<String>,
    env_vars: Option<std::collections::BTreeMap<String, String>>,
}

/// An E2B result line from a forkbox MIME bundle.
fn result_line(bundle: &Value, main: bool) -> Value {
    let mut out = Map::new();
    out.insert("type".into(), json!("result"));
    let mut extra = Map::new();
    if let Some(b) = bundle.as_object() {
        for (mime, v) in b {
            let key = match mime.as_str() {
                "text/plain" => "text",
                "text/html" => "html",
                "text/markdown" => "markdown",
                "image/svg+xml" => "svg",
                "image/png" => "png",
                "image/jpeg" => "jpeg",
                "application/pdf" => "pdf",
                "text/latex" => "latex",
                "application/json" => "json",
                "application/javascript" => "javascript",
                "e2b/data" => "data",
                "e2b/chart" => "chart",
                _ => {
                    extra.insert(mime.clone(), v.clone());
                    continue;
                }
            };
            out.insert(key.into(), v.clone());
        }
    }
    if !extra.is_empty() {
        out.insert("extra".into(), Value::Object(extra));
    }
    out.insert("is_main_result".into(), json!(main));
    Value::Object(out)
}

fn timestamp(ms: u64) -> String {
    chrono::DateTime::from_timestamp_millis(ms as i64).unwrap_or_default().to_rfc3339_opts(chrono::SecondsFormat::Micros, true)
}

/// The E2B lines of one forkbox event (none for what E2B has no line for).
fn lines(ev: &Event) -> Vec<Value> {
    let text = |ev: &Event| {
        let mut t = ev.data.as_str().unwrap_or_default().to_string();
        if ev.nl == Some(true) {
            t.push('\n');
        }
        t
    };
    match ev.kind {
        EventKind::Stdout => vec![json!({"type": "stdout", "text": text(ev), "timestamp": timestamp(ev.ts)})],
        EventKind::Stderr => vec![json!({"type": "stderr", "text": text(ev), "timestamp": timestamp(ev.ts)})],
        EventKind::Result => vec![result_line(ev.bundle.as_ref().unwrap_or(&json!({"text/plain": ev.data})), true)],
        EventKind::Display => vec![result_line(ev.bundle.as_ref().unwrap_or(&json!({"text/plain": ev.data})), false)],
        EventKind::Error => {
            let name = ev.ename.clone().unwrap_or_else(|| "Error".into());
            let value = ev.evalue.clone().unwrap_or_else(|| ev.data.as_str().unwrap_or_default().to_string());
            let traceback = ev.traceback.as_ref().map(|t| t.join("\n")).unwrap_or_else(|| format!("{name}: {value}"));
            vec![json!({"type": "error", "name": name, "value": value, "traceback": traceback})]
        }
        EventKind::Warning => vec![json!({"type": "stderr", "text": format!("{}\n", ev.data.as_str().unwrap_or_default()), "timestamp": timestamp(ev.ts)})],
        EventKind::Exit => Vec::new(),
    }
}

fn line_bytes(v: &Value) -> bytes::Bytes {
    let mut b = serde_json::to_vec(v).unwrap_or_default();
    b.push(b'\n');
    bytes::Bytes::from(b)
}

/// Cancels its token when dropped: the response body went with its client.
struct CancelOnDrop(CancellationToken);

impl Drop for CancelOnDrop {
    fn drop(&mut self) {
        self.0.cancel();
    }
}

async fn execute(State(e2b): State<E2b>, Sandbox(entry): Sandbox, body: bytes::Bytes) -> Result<Response, ApiError> {
    let req: ExecuteRequest = if body.iter().all(u8::is_ascii_whitespace) {
        return Err(ApiError::bad_request("the request needs a body with `code`"));
    } else {
        serde_json::from_slice(&body).map_err(|e| ApiError::bad_request(format!("invalid request body: {e}")))?
    };
    if req.context_id.is_some() && req.language.is_some() {
        return Err(ApiError::bad_request("give context_id or language, not both"));
    }
    let (target, language) = match (&req.context_id, req.language.as_deref()) {
        (Some(id), _) => match entry.contexts.get(id) {
            Ok(c) => (Target::Context(c), "python"),
            // The default context answers to its own id too.
            Err(_) if *id == entry.id => (Target::Sandbox, "python"),
            Err(_) => return Ok((StatusCode::NOT_FOUND, format!("context {id} not found")).into_response()),
        },
        (None, None | Some("python")) => (Target::Sandbox, "python"),
        (None, Some("bash")) => (Target::Sandbox, "bash"),
        (None, Some(other)) => return Err(ApiError::bad_request(format!("language `{other}` is not offered: the interpreter runs python and bash"))),
    };
    let count = match &target {
        Target::Context(c) => c.execs.fetch_add(1, Ordering::Relaxed) + 1,
        Target::Sandbox => entry.execs.load(Ordering::Relaxed) + 1,
    };
    let cancel = CancellationToken::new();
    let options = ExecOptions { target, env: req.env_vars.unwrap_or_default().into_iter().collect(), cancel: cancel.clone() };
    // Jupyter streams what a cell printed in chunks too: the E2B SDKs take a
    // message per chunk (`logs.stdout` items are not lines).
    let exec = ExecRequest { code: req.code, language: Some(language.into()), timeout_ms: None, output: protocol::OutputEvents::Chunks };
    let events = e2b.service.exec_with(&Caller::anonymous(), &entry.id, exec, options).await?;
    let guard = CancelOnDrop(cancel);
    let first = futures::stream::once(async move { line_bytes(&json!({"type": "number_of_executions", "execution_count": count})) });
    let rest = tokio_stream::wrappers::ReceiverStream::new(events).flat_map(|ev| {
        let ended = ev.kind == EventKind::Exit;
        let mut out: Vec<bytes::Bytes> = lines(&ev).iter().map(line_bytes).collect();
        if ended {
            out.push(line_bytes(&json!({"type": "end_of_execution"})));
        }
        futures::stream::iter(out)
    });
    let body = first.chain(rest).map(move |b| {
        let _keep = &guard;
        Ok::<_, std::convert::Infallible>(b)
    });
    Ok(Response::builder()
        .status(StatusCode::OK)
        .header(header::CONTENT_TYPE, "application/x-ndjson")
        .header(header::CACHE_CONTROL, "no-store")
        .body(Body::from_stream(body))
        .unwrap_or_default())
}

#[derive(Debug, Default, Deserialize)]
#[serde(default)]
struct NewContext {
    language: Option<String>,
    cwd: Option<String>,
}

fn context_json(id: &str, language: &str, cwd: &str) -> Value {
    json!({"id": id, "language": language, "cwd": cwd})
}

async fn create_context(State(e2b): State<E2b>, Sandbox(entry): Sandbox, headers: HeaderMap, body: bytes::Bytes) -> Result<Response, ApiError> {
    let _ = headers;
    let req: NewContext = if body.iter().all(u8::is_ascii_whitespace) {
        NewContext::default()
    } else {
        serde_json::from_slice(&body).map_err(|e| ApiError::bad_request(format!("invalid request body: {e}")))?
    };
    let language = req.language.filter(|l| !l.is_empty()).unwrap_or_else(|| "python".into());
    let cwd = req.cwd.filter(|c| !c.is_empty()).unwrap_or_else(|| DEFAULT_CWD.into());
    let c = e2b.service.create_context(&Caller::anonymous(), &entry.id, &language, &cwd).await?;
    Ok(axum::Json(context_json(&c.id, &c.language, &c.cwd)).into_response())
}

async fn list_contexts(State(e2b): State<E2b>, Sandbox(entry): Sandbox) -> Result<Response, ApiError> {
    let mut all = vec![context_json(&entry.id, "python", DEFAULT_CWD)];
    all.extend(e2b.service.contexts(&Caller::anonymous(), &entry.id).await?.iter().map(|c| context_json(&c.id, &c.language, &c.cwd)));
    Ok(axum::Json(all).into_response())
}

async fn restart_context(State(e2b): State<E2b>, Sandbox(entry): Sandbox, Path(context): Path<String>) -> Result<Response, ApiError> {
    if context == entry.id {
        return Err(ApiError::bad_request("the default context is the sandbox's own REPL: it cannot be restarted"));
    }
    e2b.service.restart_context(&Caller::anonymous(), &entry.id, &context).await?;
    Ok(StatusCode::NO_CONTENT.into_response())
}

async fn delete_context(State(e2b): State<E2b>, Sandbox(entry): Sandbox, Path(context): Path<String>) -> Result<Response, ApiError> {
    if context == entry.id {
        return Err(ApiError::bad_request("the default context is the sandbox's own REPL: it cannot be deleted"));
    }
    e2b.service.delete_context(&Caller::anonymous(), &entry.id, &context).await?;
    Ok(StatusCode::NO_CONTENT.into_response())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bundles_become_e2b_results() {
        let r = result_line(&json!({"text/plain": "1", "image/png": "iVBO", "application/vnd.x": {"a": 1}}), true);
        assert_eq!(r["text"], "1");
        assert_eq!(r["png"], "iVBO");
        assert_eq!(r["extra"]["application/vnd.x"]["a"], 1);
        assert_eq!(r["is_main_result"], true);
    }

    #[test]
    fn errors_carry_name_value_and_one_traceback() {
        let mut ev = Event::new(EventKind::Error, json!("ZeroDivisionError: division by zero"));
        ev.ename = Some("ZeroDivisionError".into());
        ev.evalue = Some("division by zero".into());
        ev.traceback = Some(vec!["Traceback".into(), "ZeroDivisionError: division by zero".into()]);
        let l = &lines(&ev)[0];
        assert_eq!((l["name"].as_str(), l["value"].as_str()), (Some("ZeroDivisionError"), Some("division by zero")));
        assert_eq!(l["traceback"], "Traceback\nZeroDivisionError: division by zero");
        let mut out = Event::new(EventKind::Stdout, json!("hi"));
        out.nl = Some(true);
        assert_eq!(lines(&out)[0]["text"], "hi\n");
        assert!(lines(&Event::new(EventKind::Exit, json!(0))).is_empty());
        assert!(!line_bytes(&json!({})).starts_with(b"\n"));
    }
}
