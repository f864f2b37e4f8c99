//! Request and response bodies of the `/v1` routes.

use serde::{Deserialize, Serialize};
use utoipa::ToSchema;

/// Largest `code` accepted by `exec` (bigger bodies answer 413).
pub const MAX_CODE_BYTES: usize = 10 * 1024 * 1024;

/// Body of `POST /v1/sandboxes`. Every field is optional; the server fills in
/// its defaults and caps.
#[derive(Debug, Clone, Default, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct CreateSandbox {
    /// Template name (`default`, `python-datasci`, ...).
    pub template: Option<String>,
    /// Lifetime in seconds, after which the sandbox is destroyed.
    pub timeout_seconds: Option<u64>,
    /// Seconds without an exec after which the sandbox is destroyed.
    pub idle_timeout_seconds: Option<u64>,
    /// Memory limit in MiB (REPL and every process of the sandbox together).
    pub ram_mib: Option<u64>,
    /// Size of the writable root filesystem in GiB.
    pub rootfs_gb: Option<u64>,
    /// Freeze to a Space instead of destroying at the idle timeout.
    pub persistent: Option<bool>,
    /// Freezes keep every process, not just the REPL's globals (criu,
    /// docs/state.md); such a sandbox cannot fork. Default: `persistent`,
    /// when the server has criu.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub keep_processes: Option<bool>,
    /// Outbound network: `false`, `true`, or `{"allow": [domains and CIDRs]}`
    /// (default: the server's `--default-egress`).
    pub egress: Option<crate::Egress>,
}

/// Answer of `POST /v1/sandboxes`.
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
pub struct Created {
    pub id: String,
    pub state: String,
}

/// Body of `POST /v1/sandboxes/{id}/exec`.
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct ExecRequest {
    pub code: String,
    /// `python` (default) or `bash`.
    #[serde(default)]
    pub language: Option<String>,
    /// Interrupt the call after this many milliseconds (default 300000).
    #[serde(default)]
    pub timeout_ms: Option<u64>,
    /// `lines` (default): one stdout/stderr event per line, as the podflare
    /// SDK expects. `chunks`: one event per batch of lines that arrived
    /// together (docs/api.md#events).
    #[serde(default)]
    pub output: OutputEvents,
}

/// How an exec's stdout and stderr are cut into events.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "lowercase")]
pub enum OutputEvents {
    #[default]
    Lines,
    Chunks,
}

/// `GET /v1/sandboxes/{id}` and the items of `GET /v1/sandboxes`.
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
pub struct SandboxInfo {
    pub id: String,
    pub state: String,
    pub template: String,
    pub ram_mib: u64,
    pub rootfs_gb: u64,
    pub egress: crate::Egress,
    pub persistent: bool,
    /// Its freezes keep every process (`CreateSandbox::keep_processes`).
    #[serde(default)]
    pub keep_processes: bool,
    /// The Space it was frozen into (`state: "frozen"` only).
    #[serde(skip_serializing_if = "Option::is_none", default)]
    pub space_id: Option<String>,
    /// Unix milliseconds.
    pub created_at: u64,
    /// Unix milliseconds of the last exec start or end.
    pub last_active_at: u64,
    /// Unix milliseconds at which the lifetime ends.
    pub expires_at: u64,
    pub timeout_seconds: u64,
    pub idle_timeout_seconds: u64,
    /// Number of execs run so far.
    pub execs: u64,
    /// How many times the REPL was replaced after dying (state was lost each time).
    pub repl_restarts: u64,
    /// Memory its processes use now, in bytes (its cgroup's usage).
    #[serde(default)]
    pub memory_bytes: u64,
    /// CPU time its processes have used, in seconds (`forkbox top` turns
    /// two readings into a percentage).
    #[serde(default)]
    pub cpu_seconds: f64,
}

/// `GET /v1/sandboxes`.
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
pub struct SandboxList {
    pub sandboxes: Vec<SandboxInfo>,
}

/// Every error answer: a status code and `{"error": "..."}`.
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
pub struct ErrorBody {
    pub error: String,
    /// Present on 503 while a template builds: 0.0 ..= 1.0.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub progress: Option<f32>,
}

/// Body of `POST /v1/sandboxes/{id}/fork`.
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct ForkRequest {
    /// How many children, 1 to 32.
    pub n: i64,
}

/// Answer of `POST /v1/sandboxes/{id}/fork`.
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
pub struct Forked {
    /// The children's ids, in no particular meaning of order.
    pub children: Vec<String>,
}

/// Answer of `GET /v1/sandboxes/{id}/diff/{other}`: paths of regular files,
/// sorted; `added` = in `other` but not in `id`, `removed` = the reverse,
/// `modified` = in both with different contents.
#[derive(Debug, Clone, Default, Serialize, Deserialize, ToSchema)]
pub struct DiffResult {
    pub added: Vec<String>,
    pub removed: Vec<String>,
    pub modified: Vec<String>,
}
