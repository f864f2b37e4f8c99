//! The MCP tools: one per sandbox operation, each a call to the forkbox server.
//!
//! Every tool that acts on a sandbox takes an optional `sandbox_id`; without
//! it the session's default sandbox is used (made on first need). Errors of
//! the server come back as tool errors (`isError`) carrying its message.

use std::sync::{Arc, Mutex, PoisonError};

use base64::Engine;
use rmcp::handler::server::{router::tool::ToolRouter, wrapper::Parameters};
use rmcp::model::{CallToolResult, ContentBlock, Extensions, Implementation, ServerCapabilities, ServerConfig};
use rmcp::{tool, tool_handler, tool_router, ServerHandler};
use schemars::JsonSchema;
use serde::Deserialize;
use serde_json::{json, Value};

use crate::api::{Api, ApiError};
use crate::render;
use crate::session::{Session, Sessions};

/// Largest `max_bytes` a download may ask for: what comes back goes into a model's context.
const MAX_DOWNLOAD_BYTES: u64 = 10 << 20;
const DEFAULT_DOWNLOAD_BYTES: u64 = 1 << 20;

const INSTRUCTIONS: &str = "forkbox sandboxes: isolated Linux machines, each with a persistent Python REPL \
(variables, imports and files survive between calls) and bash beside it. Tools that act on a sandbox take an \
optional sandbox_id; without it they use this session's default sandbox, created on the first call that needs one \
(numpy and pandas are preinstalled). fork copies a live sandbox (memory and files) into children in milliseconds: \
try several ideas from one state, compare them with diff, keep the best with merge_into. checkpoint and restore \
undo. Sandboxes this session created are destroyed when it ends.";

/// State shared by every handler of this process.
pub struct Shared {
    pub api: Api,
    /// Template of the default sandbox and of `create_sandbox` without one.
    pub template: Option<String>,
    pub sessions: Sessions,
}

/// Which session a handler serves, learnt at its first tool call. A handler
/// made for one HTTP session lives as long as that session: when the last
/// clone goes, the session ends and its sandboxes are destroyed.
struct Binding {
    shared: Arc<Shared>,
    key: Mutex<Option<String>>,
}

impl Drop for Binding {
    fn drop(&mut self) {
        let key = self.key.get_mut().unwrap_or_else(PoisonError::into_inner).take();
        // "" is the stdio or stateless session, closed when the process stops.
        let Some(key) = key.filter(|k| !k.is_empty()) else { return };
        let Ok(rt) = tokio::runtime::Handle::try_current() else { return };
        let shared = self.shared.clone();
        rt.spawn(async move { shared.sessions.close(&shared.api, &key).await });
    }
}

/// The MCP server: a [`ServerHandler`] whose tools drive a forkbox server.
#[derive(Clone)]
pub struct ForkboxMcp {
    shared: Arc<Shared>,
    binding: Arc<Binding>,
    tool_router: ToolRouter<Self>,
}

/// The sandbox a call acts on.
struct Target {
    id: String,
    /// It is the session's default sandbox (not named by the caller).
    default: bool,
    session: Arc<Session>,
}

fn fail(e: impl std::fmt::Display) -> CallToolResult {
    CallToolResult::error(vec![ContentBlock::text(e.to_string())])
}

fn json_text(v: &Value) -> CallToolResult {
    CallToolResult::success(vec![ContentBlock::text(serde_json::to_string_pretty(v).unwrap_or_else(|_| v.to_string()))])
}

/// A caller's `sandbox_id`; an empty string means none.
fn named(id: &Option<String>) -> Option<&str> {
    id.as_deref().map(str::trim).filter(|s| !s.is_empty())
}

#[derive(Deserialize, JsonSchema)]
pub struct CreateSandboxParams {
    /// Template to start from: "default" (Python with numpy and pandas) or "python-datasci"
    /// (also matplotlib, scipy, scikit-learn). Default: the server's default for this MCP server.
    pub template: Option<String>,
    /// Memory limit in MiB (64 to 16384; default 1024).
    pub ram_mib: Option<u64>,
    /// Lifetime in seconds from creation (default 3600).
    pub timeout_seconds: Option<u64>,
    /// Destroyed after this many seconds without a call (default 600).
    pub idle_timeout_seconds: Option<u64>,
    /// Network access: true (internet), false (none), or {"allow": ["pypi.org", "10.0.0.0/8"]}.
    pub egress: Option<Value>,
    /// Make it this session's default sandbox (used by tools called without sandbox_id).
    /// The first sandbox created in a session becomes the default anyway.
    pub make_default: Option<bool>,
}

#[derive(Deserialize, JsonSchema)]
pub struct RunPythonParams {
    /// Python code. Runs in a persistent REPL: names, imports and open files stay for later calls.
    /// The value of the last expression is returned as the result; display(obj) and matplotlib
    /// figures come back as images.
    pub code: String,
    /// Sandbox to run in (default: this session's default sandbox).
    pub sandbox_id: Option<String>,
    /// Time limit in milliseconds (default 300000); on timeout the call is interrupted (exit code 124).
    pub timeout_ms: Option<u64>,
}

#[derive(Deserialize, JsonSchema)]
pub struct RunBashParams {
    /// A bash command line, run with `bash -c` in /root (a fresh shell each call; files persist).
    pub command: String,
    /// Sandbox to run in (default: this session's default sandbox).
    pub sandbox_id: Option<String>,
    /// Time limit in milliseconds (default 300000).
    pub timeout_ms: Option<u64>,
}

#[derive(Deserialize, JsonSchema)]
pub struct ForkParams {
    /// How many children (1 to 32, default 1).
    pub n: Option<u32>,
    /// Sandbox to fork (default: this session's default sandbox).
    pub sandbox_id: Option<String>,
}

#[derive(Deserialize, JsonSchema)]
pub struct DiffParams {
    /// The sandbox to compare with (e.g. a fork child).
    pub other_sandbox_id: String,
    /// The sandbox compared from (default: this session's default sandbox).
    pub sandbox_id: Option<String>,
    /// Absolute directories to compare (default ["/root", "/tmp"]).
    pub paths: Option<Vec<String>>,
}

#[derive(Deserialize, JsonSchema)]
pub struct MergeIntoParams {
    /// A fork descendant (child, grandchild, ...) of sandbox_id whose state wins.
    pub winner_sandbox_id: String,
    /// The sandbox that takes over the winner's state and keeps its own id
    /// (default: this session's default sandbox).
    pub sandbox_id: Option<String>,
}

#[derive(Deserialize, JsonSchema)]
pub struct SandboxParams {
    /// Sandbox (default: this session's default sandbox).
    pub sandbox_id: Option<String>,
}

#[derive(Deserialize, JsonSchema)]
pub struct RestoreParams {
    /// A checkpoint id returned by the checkpoint tool (it stays usable after a restore).
    pub checkpoint: String,
    /// Sandbox to restore (default: this session's default sandbox).
    pub sandbox_id: Option<String>,
}

#[derive(Deserialize, JsonSchema, Clone, Copy, Default)]
#[serde(rename_all = "lowercase")]
pub enum Encoding {
    /// `content` is the file's text (UTF-8).
    #[default]
    Text,
    /// `content` is base64 of the file's bytes.
    Base64,
}

#[derive(Deserialize, JsonSchema)]
pub struct UploadParams {
    /// Path in the sandbox; relative paths start at /root. Missing directories are made.
    pub path: String,
    /// The file's contents (replaces the file).
    pub content: String,
    /// "text" (default) or "base64" for binary data.
    pub encoding: Option<Encoding>,
    /// Sandbox (default: this session's default sandbox).
    pub sandbox_id: Option<String>,
}

#[derive(Deserialize, JsonSchema)]
pub struct DownloadParams {
    /// Path of a file in the sandbox; relative paths start at /root.
    pub path: String,
    /// Read at most this many bytes (default 1048576, at most 10485760).
    pub max_bytes: Option<u64>,
    /// Sandbox (default: this session's default sandbox).
    pub sandbox_id: Option<String>,
}

impl ForkboxMcp {
    pub fn new(shared: Arc<Shared>) -> ForkboxMcp {
        ForkboxMcp { binding: Arc::new(Binding { shared: shared.clone(), key: Mutex::new(None) }), shared, tool_router: Self::tool_router() }
    }

    /// The session of this call, from its HTTP `Mcp-Session-Id` if any.
    fn session(&self, ext: &Extensions) -> Arc<Session> {
        let key =
            ext.get::<axum::http::request::Parts>().and_then(|p| p.headers.get("mcp-session-id")).and_then(|v| v.to_str().ok()).unwrap_or_default().to_string();
        let session = self.shared.sessions.get(&key);
        self.binding.key.lock().unwrap_or_else(PoisonError::into_inner).get_or_insert(key);
        session
    }

    fn create_body(&self, template: Option<String>) -> Value {
        match template.or_else(|| self.shared.template.clone()) {
            Some(t) => json!({"template": t}),
            None => json!({}),
        }
    }

    async fn target(&self, ext: &Extensions, sandbox_id: &Option<String>) -> Result<Target, ApiError> {
        let session = self.session(ext);
        if let Some(id) = named(sandbox_id) {
            return Ok(Target { id: id.to_string(), default: false, session });
        }
        let body = self.create_body(None);
        let id = session.default_or(|| self.shared.api.create(&body)).await?;
        Ok(Target { id, default: true, session })
    }

    /// A failed call as a tool error; if the default sandbox is gone (idle
    /// timeout, destroyed elsewhere), say so and forget it.
    async fn failed(&self, t: &Target, e: ApiError) -> CallToolResult {
        // A 404 may be about something else (a missing file, checkpoint, winner): ask.
        if t.default && e.status() == Some(404) && self.shared.api.exists(&t.id).await == Some(false) && t.session.forget(&t.id).await {
            return fail(format!("{e}\nThe default sandbox {} no longer exists; the next call creates a new, empty one.", t.id));
        }
        fail(e)
    }

    async fn exec(&self, ext: &Extensions, sandbox_id: &Option<String>, code: &str, language: &str, timeout_ms: Option<u64>) -> CallToolResult {
        let t = match self.target(ext, sandbox_id).await {
            Ok(t) => t,
            Err(e) => return fail(e),
        };
        match self.shared.api.exec(&t.id, code, language, timeout_ms).await {
            Ok(events) => render::exec_result(&t.id, &events),
            Err(e) => self.failed(&t, e).await,
        }
    }
}

#[tool_router]
impl ForkboxMcp {
    #[tool(description = "Create a new sandbox and return its id. Not needed for a single sandbox: the other tools \
create this session's default sandbox on first use. Use it for a second independent sandbox, or for other settings \
(template with matplotlib, more memory, no network).")]
    async fn create_sandbox(&self, Parameters(p): Parameters<CreateSandboxParams>, ext: Extensions) -> CallToolResult {
        let session = self.session(&ext);
        let mut body = self.create_body(p.template);
        for (k, v) in [("ram_mib", p.ram_mib), ("timeout_seconds", p.timeout_seconds), ("idle_timeout_seconds", p.idle_timeout_seconds)] {
            if let Some(v) = v {
                body[k] = v.into();
            }
        }
        if let Some(e) = p.egress {
            body["egress"] = e;
        }
        let id = match self.shared.api.create(&body).await {
            Ok(id) => id,
            Err(e) => return fail(e),
        };
        session.own(&id);
        let is_default = match session.default_id().await {
            None => true,
            Some(_) => p.make_default.unwrap_or(false),
        };
        if is_default {
            session.set_default(&id).await;
        }
        json_text(&json!({"sandbox_id": id, "default": is_default}))
    }

    #[tool(description = "Run Python code in a sandbox's persistent REPL (like a Jupyter cell: state persists \
between calls). Returns stdout, stderr, the value of the last expression (result), errors with traceback, and the \
exit code; images from display(obj) or matplotlib figures come back as image content. An exception makes the call \
a tool error.")]
    async fn run_python(&self, Parameters(p): Parameters<RunPythonParams>, ext: Extensions) -> CallToolResult {
        self.exec(&ext, &p.sandbox_id, &p.code, "python", p.timeout_ms).await
    }

    #[tool(description = "Run a bash command in a sandbox (bash -c in /root; install packages with pip, inspect \
files, start processes). Returns stdout, stderr and the exit code; a non-zero exit code makes it a tool error.")]
    async fn run_bash(&self, Parameters(p): Parameters<RunBashParams>, ext: Extensions) -> CallToolResult {
        self.exec(&ext, &p.sandbox_id, &p.command, "bash", p.timeout_ms).await
    }

    #[tool(description = "Fork a live sandbox into n copy-on-write children in milliseconds. Each child starts \
with the parent's exact Python state (variables, imports) and files, then runs independently. Returns the children's \
ids: pass them as sandbox_id to the other tools. Use it to try several approaches from one expensive state, then \
diff and merge_into the best.")]
    async fn fork(&self, Parameters(p): Parameters<ForkParams>, ext: Extensions) -> CallToolResult {
        let t = match self.target(&ext, &p.sandbox_id).await {
            Ok(t) => t,
            Err(e) => return fail(e),
        };
        match self.shared.api.fork(&t.id, p.n.unwrap_or(1)).await {
            Ok(children) => {
                for c in &children {
                    t.session.own(c);
                }
                json_text(&json!({"sandbox_id": t.id, "children": children}))
            }
            Err(e) => self.failed(&t, e).await,
        }
    }

    #[tool(description = "Compare the files of two sandboxes (e.g. a fork child against its parent): paths of \
regular files added in other_sandbox_id, removed from it, and modified, under /root and /tmp by default.")]
    async fn diff(&self, Parameters(p): Parameters<DiffParams>, ext: Extensions) -> CallToolResult {
        let t = match self.target(&ext, &p.sandbox_id).await {
            Ok(t) => t,
            Err(e) => return fail(e),
        };
        match self.shared.api.diff(&t.id, p.other_sandbox_id.trim(), p.paths.as_deref().unwrap_or_default()).await {
            Ok(d) => {
                json_text(&json!({"sandbox_id": t.id, "other_sandbox_id": p.other_sandbox_id, "added": d.added, "removed": d.removed, "modified": d.modified}))
            }
            Err(e) => self.failed(&t, e).await,
        }
    }

    #[tool(description = "Keep a fork's result: sandbox_id (default: the default sandbox) takes over the Python \
state and files of winner_sandbox_id, one of its fork descendants, and keeps its own id; the winner's id stops \
existing. Other children are untouched (destroy them when done).")]
    async fn merge_into(&self, Parameters(p): Parameters<MergeIntoParams>, ext: Extensions) -> CallToolResult {
        let t = match self.target(&ext, &p.sandbox_id).await {
            Ok(t) => t,
            Err(e) => return fail(e),
        };
        let winner = p.winner_sandbox_id.trim();
        match self.shared.api.merge_into(&t.id, winner).await {
            Ok(()) => {
                t.session.forget(winner).await;
                json_text(&json!({"sandbox_id": t.id, "merged": winner}))
            }
            Err(e) => self.failed(&t, e).await,
        }
    }

    #[tool(description = "Save a sandbox's current state (Python memory and files) as a checkpoint, and return \
its id. restore goes back to it, as often as needed: take one before a risky step.")]
    async fn checkpoint(&self, Parameters(p): Parameters<SandboxParams>, ext: Extensions) -> CallToolResult {
        let t = match self.target(&ext, &p.sandbox_id).await {
            Ok(t) => t,
            Err(e) => return fail(e),
        };
        match self.shared.api.checkpoint(&t.id).await {
            Ok(v) => json_text(&v),
            Err(e) => self.failed(&t, e).await,
        }
    }

    #[tool(description = "Bring a sandbox back to a checkpoint taken with the checkpoint tool: its Python state \
and files become exactly what they were then. The checkpoint stays usable.")]
    async fn restore(&self, Parameters(p): Parameters<RestoreParams>, ext: Extensions) -> CallToolResult {
        let t = match self.target(&ext, &p.sandbox_id).await {
            Ok(t) => t,
            Err(e) => return fail(e),
        };
        match self.shared.api.restore(&t.id, p.checkpoint.trim()).await {
            Ok(info) => json_text(&json!({"sandbox_id": t.id, "restored": p.checkpoint, "state": info.get("state")})),
            Err(e) => self.failed(&t, e).await,
        }
    }

    #[tool(description = "Write a file into a sandbox (text, or base64 for binary data); it replaces the file \
atomically. Returns the absolute path and size written.")]
    async fn upload(&self, Parameters(p): Parameters<UploadParams>, ext: Extensions) -> CallToolResult {
        let bytes = match p.encoding.unwrap_or_default() {
            Encoding::Text => p.content.into_bytes(),
            Encoding::Base64 => match base64::engine::general_purpose::STANDARD.decode(p.content.trim()) {
                Ok(b) => b,
                Err(e) => return fail(format!("content is not valid base64: {e}")),
            },
        };
        let t = match self.target(&ext, &p.sandbox_id).await {
            Ok(t) => t,
            Err(e) => return fail(e),
        };
        match self.shared.api.upload(&t.id, &p.path, bytes).await {
            Ok(v) => json_text(&json!({"sandbox_id": t.id, "path": v.get("path"), "bytes": v.get("bytes")})),
            Err(e) => self.failed(&t, e).await,
        }
    }

    #[tool(description = "Read a file from a sandbox: text comes back as text, images (PNG, JPEG, GIF, WebP) as \
image content, other binary data as base64. Reads at most max_bytes (default 1 MiB).")]
    async fn download(&self, Parameters(p): Parameters<DownloadParams>, ext: Extensions) -> CallToolResult {
        let max = p.max_bytes.unwrap_or(DEFAULT_DOWNLOAD_BYTES).clamp(1, MAX_DOWNLOAD_BYTES);
        let t = match self.target(&ext, &p.sandbox_id).await {
            Ok(t) => t,
            Err(e) => return fail(e),
        };
        match self.shared.api.download(&t.id, &p.path, max).await {
            Ok(dl) => render::download_result(&p.path, &dl),
            Err(e) => self.failed(&t, e).await,
        }
    }

    #[tool(description = "Destroy a sandbox and everything in it (default: this session's default sandbox; the \
next call that needs one then creates a fresh default).")]
    async fn destroy_sandbox(&self, Parameters(p): Parameters<SandboxParams>, ext: Extensions) -> CallToolResult {
        let session = self.session(&ext);
        let id = match named(&p.sandbox_id) {
            Some(id) => id.to_string(),
            None => match session.default_id().await {
                Some(id) => id,
                None => return fail("this session has no default sandbox yet; nothing to destroy"),
            },
        };
        match self.shared.api.destroy(&id).await {
            Ok(()) => {
                let was_default = session.forget(&id).await;
                json_text(&json!({"destroyed": id, "was_default": was_default}))
            }
            Err(e) => {
                if e.status() == Some(404) {
                    session.forget(&id).await;
                }
                fail(e)
            }
        }
    }
}

#[tool_handler(router = self.tool_router)]
impl ServerHandler for ForkboxMcp {
    fn get_info(&self) -> ServerConfig {
        ServerConfig::new(ServerCapabilities::builder().enable_tools().build())
            .with_server_info(Implementation::new("forkbox", env!("CARGO_PKG_VERSION")))
            .with_instructions(INSTRUCTIONS)
    }
}
