//! The forkbox HTTP API as the MCP server uses it: one method per route,
//! errors carrying the server's own message.

use futures::StreamExt;
use protocol::{Created, DiffResult, Event, Forked};
use reqwest::{Method, RequestBuilder, Response, StatusCode};
use serde_json::Value;

/// What can go wrong talking to the forkbox server.
#[derive(Debug, thiserror::Error)]
pub enum ApiError {
    #[error("cannot reach the forkbox server at {url}: {reason}")]
    Unreachable { url: String, reason: String },
    /// The server answered with an error status; `message` is its `error` field.
    #[error("{message} (HTTP {status})")]
    Status { status: u16, message: String },
    #[error("unexpected answer from the forkbox server: {0}")]
    Protocol(String),
}

impl ApiError {
    pub fn status(&self) -> Option<u16> {
        match self {
            ApiError::Status { status, .. } => Some(*status),
            _ => None,
        }
    }
}

/// A downloaded file, or its first `max_bytes`.
pub struct Download {
    pub bytes: Vec<u8>,
    /// The whole file's size.
    pub size: u64,
}

/// Client of one forkbox server.
pub struct Api {
    http: reqwest::Client,
    base: String,
    key: Option<String>,
}

impl Api {
    pub fn new(url: &str, key: Option<String>) -> Api {
        Api { http: reqwest::Client::new(), base: url.trim_end_matches('/').to_string(), key }
    }

    pub fn url(&self) -> &str {
        &self.base
    }

    fn req(&self, method: Method, path: &str) -> RequestBuilder {
        let r = self.http.request(method, format!("{}{path}", self.base));
        match &self.key {
            Some(k) => r.bearer_auth(k),
            None => r,
        }
    }

    /// Send, and turn an error status into [`ApiError::Status`] with the server's message.
    async fn send(&self, req: RequestBuilder) -> Result<Response, ApiError> {
        let resp = req.send().await.map_err(|e| self.unreachable(e))?;
        if resp.status().is_success() {
            return Ok(resp);
        }
        let status = resp.status();
        let body = resp.text().await.unwrap_or_default();
        let message = serde_json::from_str::<Value>(&body).ok().and_then(|v| v.get("error").and_then(Value::as_str).map(String::from)).unwrap_or_else(|| {
            if body.trim().is_empty() {
                status.canonical_reason().unwrap_or("error").to_string()
            } else {
                body
            }
        });
        Err(ApiError::Status { status: status.as_u16(), message })
    }

    fn unreachable(&self, e: reqwest::Error) -> ApiError {
        // reqwest's Display is terse ("error sending request"); its source says why.
        let mut reason = e.to_string();
        let mut src = std::error::Error::source(&e);
        while let Some(s) = src {
            reason = format!("{reason}: {s}");
            src = s.source();
        }
        ApiError::Unreachable { url: self.base.clone(), reason }
    }

    async fn json<T: serde::de::DeserializeOwned>(&self, req: RequestBuilder) -> Result<T, ApiError> {
        let resp = self.send(req).await?;
        resp.json::<T>().await.map_err(|e| ApiError::Protocol(e.to_string()))
    }

    /// `POST /v1/sandboxes`; `body` is the create request (all fields optional).
    pub async fn create(&self, body: &Value) -> Result<String, ApiError> {
        let created: Created = self.json(self.req(Method::POST, "/v1/sandboxes").json(body)).await?;
        Ok(created.id)
    }

    /// `POST /v1/sandboxes/{id}/exec`, the whole event stream collected.
    pub async fn exec(&self, id: &str, code: &str, language: &str, timeout_ms: Option<u64>) -> Result<Vec<Event>, ApiError> {
        let mut body = serde_json::json!({"code": code, "language": language});
        if let Some(t) = timeout_ms {
            body["timeout_ms"] = t.into();
        }
        let resp = self.send(self.req(Method::POST, &format!("/v1/sandboxes/{id}/exec")).json(&body)).await?;
        let mut stream = resp.bytes_stream();
        let mut buf = Vec::new();
        let mut events = Vec::new();
        while let Some(chunk) = stream.next().await {
            buf.extend_from_slice(&chunk.map_err(|e| self.unreachable(e))?);
            while let Some(pos) = buf.iter().position(|b| *b == b'\n') {
                let line: Vec<u8> = buf.drain(..=pos).collect();
                if line.iter().all(u8::is_ascii_whitespace) {
                    continue;
                }
                events.push(serde_json::from_slice(&line).map_err(|e| ApiError::Protocol(format!("bad event: {e}")))?);
            }
        }
        Ok(events)
    }

    /// `POST /v1/sandboxes/{id}/fork` → the children's ids.
    pub async fn fork(&self, id: &str, n: u32) -> Result<Vec<String>, ApiError> {
        let forked: Forked = self.json(self.req(Method::POST, &format!("/v1/sandboxes/{id}/fork")).json(&serde_json::json!({"n": n}))).await?;
        Ok(forked.children)
    }

    /// `GET /v1/sandboxes/{a}/diff/{b}`.
    pub async fn diff(&self, a: &str, b: &str, paths: &[String]) -> Result<DiffResult, ApiError> {
        let mut req = self.req(Method::GET, &format!("/v1/sandboxes/{a}/diff/{b}"));
        if !paths.is_empty() {
            req = req.query(&[("paths", paths.join(","))]);
        }
        self.json(req).await
    }

    /// `POST /v1/sandboxes/{parent}/merge_into/{winner}`.
    pub async fn merge_into(&self, parent: &str, winner: &str) -> Result<(), ApiError> {
        self.send(self.req(Method::POST, &format!("/v1/sandboxes/{parent}/merge_into/{winner}"))).await.map(drop)
    }

    /// `POST /v1/sandboxes/{id}/checkpoints` → `{"checkpoint", "sandbox_id", "created_at"}`.
    pub async fn checkpoint(&self, id: &str) -> Result<Value, ApiError> {
        self.json(self.req(Method::POST, &format!("/v1/sandboxes/{id}/checkpoints")).json(&serde_json::json!({}))).await
    }

    /// `POST /v1/sandboxes/{id}/restore` → the sandbox's info.
    pub async fn restore(&self, id: &str, checkpoint: &str) -> Result<Value, ApiError> {
        self.json(self.req(Method::POST, &format!("/v1/sandboxes/{id}/restore")).json(&serde_json::json!({"checkpoint": checkpoint}))).await
    }

    /// `PUT /v1/sandboxes/{id}/files?path=…` → `{"path", "bytes"}`.
    pub async fn upload(&self, id: &str, path: &str, bytes: Vec<u8>) -> Result<Value, ApiError> {
        self.json(self.req(Method::PUT, &format!("/v1/sandboxes/{id}/files")).query(&[("path", path)]).body(bytes)).await
    }

    /// `GET /v1/sandboxes/{id}/files?path=…`, at most `max_bytes` of it.
    pub async fn download(&self, id: &str, path: &str, max_bytes: u64) -> Result<Download, ApiError> {
        let req = self
            .req(Method::GET, &format!("/v1/sandboxes/{id}/files"))
            .query(&[("path", path)])
            .header(reqwest::header::RANGE, format!("bytes=0-{}", max_bytes.saturating_sub(1)));
        let resp = match self.send(req).await {
            // An empty file has no byte 0: ask again without the range.
            Err(ApiError::Status { status: 416, .. }) => {
                self.send(self.req(Method::GET, &format!("/v1/sandboxes/{id}/files")).query(&[("path", path)])).await?
            }
            other => other?,
        };
        let size = match resp.status() {
            StatusCode::PARTIAL_CONTENT => {
                resp.headers().get(reqwest::header::CONTENT_RANGE).and_then(|v| v.to_str().ok()).and_then(|v| v.rsplit('/').next()).and_then(|v| v.parse().ok())
            }
            _ => resp.content_length(),
        };
        let bytes = resp.bytes().await.map_err(|e| self.unreachable(e))?.to_vec();
        let size = size.unwrap_or(bytes.len() as u64);
        Ok(Download { bytes, size })
    }

    /// Whether sandbox `id` exists (`GET /v1/sandboxes/{id}`); `None` if the server cannot say.
    pub async fn exists(&self, id: &str) -> Option<bool> {
        match self.send(self.req(Method::GET, &format!("/v1/sandboxes/{id}"))).await {
            Ok(_) => Some(true),
            Err(e) if e.status() == Some(404) => Some(false),
            Err(_) => None,
        }
    }

    /// `DELETE /v1/sandboxes/{id}`.
    pub async fn destroy(&self, id: &str) -> Result<(), ApiError> {
        self.send(self.req(Method::DELETE, &format!("/v1/sandboxes/{id}"))).await.map(drop)
    }
}
