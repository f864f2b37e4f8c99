//! envd's `process.Process` service (e2b-dev/E2B `spec/envd/process/
//! process.proto`) over `service::sandbox::processes`: Start and Connect
//! stream a process's events, the unary calls feed, signal and resize it.
//! A client that hangs up leaves its process running (background commands
//! depend on it); a call's deadline (`Connect-Timeout-Ms`) ends the
//! process it started.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use axum::body::Body;
use axum::extract::Path;
use axum::http::HeaderMap;
use axum::response::{IntoResponse, Response};
use base64::Engine as _;
use futures::StreamExt;
use serde::Deserialize;
use serde_json::json;
use service::sandbox::processes::{self, Exit, Output, Process, ProcessSpec};
use service::sandbox::pty::Size;
use service::sandbox::SandboxEntry;
use tokio::sync::mpsc;

use crate::connect::{self, StreamWriter};
use crate::error::{Code, RpcError};
use crate::{auth, envd, Sandbox};

#[derive(Debug, Default, Deserialize)]
#[serde(default)]
struct ProcessConfig {
    cmd: String,
    args: Vec<String>,
    envs: BTreeMap<String, String>,
    cwd: Option<String>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(default)]
struct PtySize {
    cols: u32,
    rows: u32,
}

#[derive(Debug, Default, Deserialize)]
#[serde(default)]
struct Pty {
    size: Option<PtySize>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(default)]
struct StartRequest {
    process: ProcessConfig,
    pty: Option<Pty>,
    tag: Option<String>,
    stdin: Option<bool>,
}

/// Which process a call is for: `{"pid": N}` or `{"tag": "..."}`.
#[derive(Debug, Default, Deserialize)]
#[serde(default)]
struct Selector {
    pid: Option<u32>,
    tag: Option<String>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(default)]
struct Selected {
    process: Selector,
}

#[derive(Debug, Default, Deserialize)]
#[serde(default)]
struct Input {
    stdin: Option<String>,
    pty: Option<String>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(default)]
struct SendInputRequest {
    process: Selector,
    input: Input,
}

#[derive(Debug, Default, Deserialize)]
#[serde(default)]
struct SendSignalRequest {
    process: Selector,
    signal: serde_json::Value,
}

#[derive(Debug, Default, Deserialize)]
#[serde(default)]
struct UpdateRequest {
    process: Selector,
    pty: Option<Pty>,
}

/// Dispatch one `process.Process` method.
pub async fn call(Sandbox(entry): Sandbox, Path(method): Path<String>, headers: HeaderMap, body: Body) -> Response {
    match method.as_str() {
        "Start" => match connect::first_message::<StartRequest>(&headers, body).await {
            Ok(req) => start(entry, &headers, req).await,
            Err(e) => connect::failed_stream(e).await,
        },
        "Connect" => match connect::first_message::<Selected>(&headers, body).await {
            Ok(req) => reconnect(entry, &headers, req).await,
            Err(e) => connect::failed_stream(e).await,
        },
        "StreamInput" => stream_input(entry, &headers, body).await,
        _ => {
            let bytes = match connect::body_bytes(body).await {
                Ok(b) => b,
                Err(e) => return e.into_response(),
            };
            match unary(&entry, &method, &headers, &bytes).await {
                Ok(v) => connect::ok(v),
                Err(e) => e.into_response(),
            }
        }
    }
}

async fn unary(entry: &Arc<SandboxEntry>, method: &str, headers: &HeaderMap, body: &[u8]) -> Result<serde_json::Value, RpcError> {
    match method {
        "List" => {
            let processes: Vec<_> = entry.processes.list().iter().map(|p| describe(p)).collect();
            Ok(json!({"processes": processes}))
        }
        "SendInput" => {
            let req: SendInputRequest = connect::unary(headers, body)?;
            let p = find(entry, &req.process)?;
            send_input(entry, &p, &req.input).await?;
            Ok(json!({}))
        }
        "SendSignal" => {
            let req: SendSignalRequest = connect::unary(headers, body)?;
            let p = find(entry, &req.process)?;
            p.signal(signal(&req.signal)?).await;
            Ok(json!({}))
        }
        "CloseStdin" => {
            let req: Selected = connect::unary(headers, body)?;
            find(entry, &req.process)?.close_stdin().await?;
            Ok(json!({}))
        }
        "Update" => {
            let req: UpdateRequest = connect::unary(headers, body)?;
            let p = find(entry, &req.process)?;
            if let Some(size) = req.pty.and_then(|p| p.size) {
                p.resize(size_of(&size)?)?;
            }
            Ok(json!({}))
        }
        other => Err(RpcError::new(Code::Unimplemented, format!("process.Process/{other} is not a method"))),
    }
}

fn find(entry: &SandboxEntry, s: &Selector) -> Result<Arc<Process>, RpcError> {
    match (s.pid, &s.tag) {
        (Some(pid), _) => Ok(entry.processes.get(pid)?),
        (None, Some(tag)) => Ok(entry.processes.by_tag(tag)?),
        (None, None) => Err(RpcError::invalid("name the process by pid or tag")),
    }
}

fn describe(p: &Process) -> serde_json::Value {
    let mut config = json!({"cmd": p.argv.first().cloned().unwrap_or_default(), "args": p.argv.iter().skip(1).collect::<Vec<_>>(),
        "envs": p.env.iter().cloned().collect::<BTreeMap<_, _>>(), "cwd": p.cwd});
    if p.argv.is_empty() {
        config["cmd"] = json!("");
    }
    let mut out = json!({"config": config, "pid": p.pid});
    if let Some(tag) = &p.tag {
        out["tag"] = json!(tag);
    }
    out
}

/// Signals by proto enum name or number (SIGTERM and SIGKILL are the
/// enum's; other numbers are passed on).
fn signal(v: &serde_json::Value) -> Result<i32, RpcError> {
    let n = match v {
        serde_json::Value::String(s) => match s.as_str() {
            "SIGNAL_SIGKILL" => libc::SIGKILL,
            "SIGNAL_SIGTERM" => libc::SIGTERM,
            other => other.parse().map_err(|_| RpcError::invalid(format!("unknown signal `{other}`")))?,
        },
        serde_json::Value::Number(n) => n.as_i64().unwrap_or(0) as i32,
        _ => return Err(RpcError::invalid("signal is required")),
    };
    if !(1..=64).contains(&n) {
        return Err(RpcError::invalid(format!("signal {n} is not a signal")));
    }
    Ok(n)
}

fn size_of(s: &PtySize) -> Result<Size, RpcError> {
    let c = |v: u32| u16::try_from(v).ok().filter(|v| *v > 0);
    let (Some(cols), Some(rows)) = (c(s.cols), c(s.rows)) else {
        return Err(RpcError::invalid("a terminal needs cols and rows from 1 to 65535"));
    };
    Ok(service::sandbox::pty::size(Some(cols), Some(rows))?)
}

fn decode(b64: &str) -> Result<Vec<u8>, RpcError> {
    use base64::engine::general_purpose::{STANDARD, STANDARD_NO_PAD, URL_SAFE, URL_SAFE_NO_PAD};
    [STANDARD, STANDARD_NO_PAD, URL_SAFE, URL_SAFE_NO_PAD].iter().find_map(|e| e.decode(b64).ok()).ok_or_else(|| RpcError::invalid("input is not base64"))
}

async fn send_input(entry: &Arc<SandboxEntry>, p: &Process, input: &Input) -> Result<(), RpcError> {
    match (&input.stdin, &input.pty) {
        (Some(data), _) | (None, Some(data)) => Ok(p.input(entry, &decode(data)?).await?),
        (None, None) => Ok(()),
    }
}

fn b64(data: &[u8]) -> String {
    base64::engine::general_purpose::STANDARD.encode(data)
}

fn end_event(exit: Exit) -> serde_json::Value {
    // Go's os.ProcessState, which envd reports: -1 for a death by signal.
    let code = if exit.signal.is_some() { -1 } else { exit.code };
    json!({"event": {"end": {"exitCode": code, "exited": exit.signal.is_none(), "status": exit.status()}}})
}

async fn start(entry: Arc<SandboxEntry>, headers: &HeaderMap, req: StartRequest) -> Response {
    let deadline = match connect::timeout(headers) {
        Ok(d) => d,
        Err(e) => return connect::failed_stream(e).await,
    };
    let user = match envd::user(&entry, auth::rpc_user(headers).as_deref()).await {
        Ok(u) => u,
        Err(e) => return connect::failed_stream(e.into()).await,
    };
    let pty = match req.pty.as_ref().map(|p| p.size.as_ref().map(size_of).unwrap_or(Ok(Size { cols: 80, rows: 24 }))) {
        Some(Err(e)) => return connect::failed_stream(e).await,
        Some(Ok(size)) => Some(size),
        None => None,
    };
    let mut argv = vec![req.process.cmd];
    argv.extend(req.process.args);
    let spec = ProcessSpec {
        argv,
        env: req.process.envs.into_iter().collect(),
        cwd: req.process.cwd.filter(|c| !c.is_empty()),
        user: Some(user),
        // Unset means open, as envd before `stdin` existed.
        stdin: req.stdin.unwrap_or(true),
        tag: req.tag,
        pty,
    };
    let (process, events) = match processes::start(&entry, spec).await {
        Ok(started) => started,
        Err(e) => return connect::failed_stream(e.into()).await,
    };
    let (resp, writer) = connect::stream();
    tokio::spawn(follow(process, events, writer, deadline, connect::keepalive(headers), true));
    resp
}

async fn reconnect(entry: Arc<SandboxEntry>, headers: &HeaderMap, req: Selected) -> Response {
    let deadline = match connect::timeout(headers) {
        Ok(d) => d,
        Err(e) => return connect::failed_stream(e).await,
    };
    let process = match find(&entry, &req.process) {
        Ok(p) => p,
        Err(e) => return connect::failed_stream(e).await,
    };
    let events = process.follow();
    let (resp, writer) = connect::stream();
    tokio::spawn(follow(process, events, writer, deadline, connect::keepalive(headers), false));
    resp
}

/// Stream a process's events to a client: `start` first (the SDKs wait
/// for it), its output, keepalives, and `end`; at the deadline, end the
/// process (`owns` it: the call that started it) and the stream.
async fn follow(
    process: Arc<Process>,
    mut events: mpsc::Receiver<Output>,
    writer: StreamWriter,
    deadline: Option<Duration>,
    keepalive: Option<Duration>,
    owns: bool,
) {
    if !writer.send(&json!({"event": {"start": {"pid": process.pid}}})).await {
        return;
    }
    let deadline_set = deadline.is_some();
    let deadline = async {
        match deadline {
            Some(d) => tokio::time::sleep(d).await,
            None => std::future::pending().await,
        }
    };
    tokio::pin!(deadline);
    let mut ping = tokio::time::interval(keepalive.unwrap_or(Duration::from_secs(3600)));
    ping.tick().await;
    loop {
        tokio::select! {
            out = events.recv() => {
                let msg = match out {
                    Some(Output::Stdout(b)) => json!({"event": {"data": {"stdout": b64(&b)}}}),
                    Some(Output::Stderr(b)) => json!({"event": {"data": {"stderr": b64(&b)}}}),
                    Some(Output::Pty(b)) => json!({"event": {"data": {"pty": b64(&b)}}}),
                    Some(Output::End(exit)) => {
                        if writer.send(&end_event(exit)).await {
                            writer.end(None).await;
                        }
                        return;
                    }
                    None => {
                        writer.end(Some(RpcError::new(Code::Internal, "the process's output stopped"))).await;
                        return;
                    }
                };
                if !writer.send(&msg).await {
                    break; // the client went; the process runs on
                }
            }
            _ = ping.tick(), if keepalive.is_some() => {
                if !writer.send(&json!({"event": {"keepalive": {}}})).await {
                    break;
                }
            }
            () = &mut deadline => {
                if owns {
                    process.signal(libc::SIGKILL).await;
                }
                writer.end(Some(RpcError::new(Code::DeadlineExceeded, "the call's deadline (Connect-Timeout-Ms) passed"))).await;
                return;
            }
            () = writer.closed() => break,
        }
    }
    // The client went first (its own clock ends its call at the same
    // deadline): the deadline still ends the process that call started.
    drop(events);
    if owns && deadline_set {
        tokio::select! {
            () = &mut deadline => process.signal(libc::SIGKILL).await,
            _ = process.wait() => {}
        }
    }
}

/// `StreamInput` (client streaming): `start` names the process, then
/// `data` messages feed it; one `{}` answers when the client is done.
async fn stream_input(entry: Arc<SandboxEntry>, _headers: &HeaderMap, body: Body) -> Response {
    #[derive(Debug, Default, Deserialize)]
    #[serde(default)]
    struct Start {
        process: Selector,
    }
    #[derive(Debug, Default, Deserialize)]
    #[serde(default)]
    struct Data {
        input: Input,
    }
    #[derive(Debug, Default, Deserialize)]
    #[serde(default)]
    struct Message {
        start: Option<Start>,
        data: Option<Data>,
        keepalive: Option<serde_json::Value>,
    }
    let (resp, writer) = connect::stream();
    tokio::spawn(async move {
        let mut stream = body.into_data_stream();
        let mut messages = connect::Envelopes::default();
        let mut target: Option<Arc<Process>> = None;
        let result: Result<(), RpcError> = async {
            loop {
                while let Some(raw) = messages.next_message()? {
                    let m: Message = connect::parse(&raw)?;
                    if let Some(s) = m.start {
                        target = Some(find(&entry, &s.process)?);
                    } else if let Some(d) = m.data {
                        let p = target.as_ref().ok_or_else(|| RpcError::invalid("StreamInput needs `start` before `data`"))?;
                        send_input(&entry, p, &d.input).await?;
                    } else if m.keepalive.is_none() {
                        return Err(RpcError::invalid("a StreamInput message holds start, data or keepalive"));
                    }
                }
                match stream.next().await {
                    Some(Ok(chunk)) => messages.push(&chunk),
                    Some(Err(e)) => return Err(RpcError::new(Code::Canceled, format!("the input stream broke: {e}"))),
                    None => return Ok(()),
                }
            }
        }
        .await;
        match result {
            Ok(()) => {
                writer.send(&json!({})).await;
                writer.end(None).await;
            }
            Err(e) => writer.end(Some(e)).await,
        }
    });
    resp
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn signals_by_name_or_number() {
        assert_eq!(signal(&json!("SIGNAL_SIGKILL")).unwrap(), 9);
        assert_eq!(signal(&json!("SIGNAL_SIGTERM")).unwrap(), 15);
        assert_eq!(signal(&json!(15)).unwrap(), 15);
        assert!(signal(&json!("SIGNAL_UNSPECIFIED")).is_err());
        assert!(signal(&json!(0)).is_err());
        assert!(signal(&json!(null)).is_err());
    }

    #[test]
    fn requests_parse_in_both_cases_of_json() {
        let r: StartRequest =
            serde_json::from_value(json!({"process": {"cmd": "/bin/bash", "args": ["-l", "-c", "echo 1"], "envs": {"A": "1"}}, "stdin": false})).unwrap();
        assert_eq!(r.process.cmd, "/bin/bash");
        assert_eq!(r.stdin, Some(false));
        let r: SendInputRequest = serde_json::from_value(json!({"process": {"pid": 1000}, "input": {"stdin": "aGk="}})).unwrap();
        assert_eq!(decode(r.input.stdin.as_deref().unwrap()).unwrap(), b"hi");
    }

    #[test]
    fn ends_read_as_envd_reports_them() {
        assert_eq!(end_event(Exit { code: 3, signal: None })["event"]["end"]["exitCode"], 3);
        let killed = end_event(Exit { code: 137, signal: Some(9) });
        assert_eq!(killed["event"]["end"]["exitCode"], -1);
        assert_eq!(killed["event"]["end"]["status"], "signal: killed");
    }
}
