//! The control plane's JSON, with E2B's field names (e2b-dev/E2B
//! `spec/openapi.yml`, as the SDKs' generated clients read it).

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

/// `POST /sandboxes`, `POST /v2/sandboxes`.
#[derive(Debug, Default, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct NewSandbox {
    #[serde(rename = "templateID")]
    pub template_id: Option<String>,
    /// Seconds.
    pub timeout: Option<u64>,
    #[serde(default)]
    pub auto_pause: bool,
    #[serde(default)]
    pub metadata: Option<BTreeMap<String, String>>,
    #[serde(default)]
    pub env_vars: Option<BTreeMap<String, String>>,
    /// snake_case on the wire, unlike its neighbours.
    #[serde(rename = "allow_internet_access")]
    pub allow_internet_access: Option<bool>,
    pub network: Option<Network>,
    /// Deprecated and always on here (every sandbox has an access token).
    pub secure: Option<bool>,
    pub auto_resume: Option<serde_json::Value>,
    pub mcp: Option<serde_json::Value>,
    pub volume_mounts: Option<Vec<serde_json::Value>>,
}

/// A sandbox's network settings (create, and `PUT .../network`).
#[derive(Debug, Default, Clone, Deserialize, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Network {
    pub allow_public_traffic: Option<bool>,
    pub allow_out: Option<Vec<String>>,
    pub deny_out: Option<Vec<String>>,
    pub dns_servers: Option<Vec<String>>,
    pub egress_proxy: Option<serde_json::Value>,
    pub mask_request_host: Option<serde_json::Value>,
    #[serde(rename = "allow_internet_access")]
    pub allow_internet_access: Option<bool>,
}

/// `POST /sandboxes/{id}/connect` (and the old `/resume`).
#[derive(Debug, Default, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Connect {
    pub timeout: Option<u64>,
}

#[derive(Debug, Deserialize)]
pub struct Timeout {
    pub timeout: u64,
}

#[derive(Debug, Default, Deserialize)]
pub struct Fork {
    pub count: Option<usize>,
    pub timeout: Option<u64>,
}

#[derive(Debug, Default, Deserialize)]
pub struct NewSnapshot {
    pub name: Option<String>,
}

/// What names a sandbox in every answer about it.
#[derive(Debug, Serialize)]
pub struct Names {
    #[serde(rename = "templateID")]
    pub template_id: String,
    #[serde(rename = "sandboxID")]
    pub sandbox_id: String,
    /// Deprecated by E2B, still required by its Python SDK.
    #[serde(rename = "clientID")]
    pub client_id: String,
    pub alias: Option<String>,
}

/// What create, connect and fork answer.
#[derive(Debug, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Sandbox {
    #[serde(flatten)]
    pub names: Names,
    pub envd_version: String,
    pub envd_access_token: String,
    pub traffic_access_token: String,
    /// Null: the SDK keeps the domain it was configured with.
    pub domain: Option<String>,
}

/// `GET /sandboxes/{id}` and the items of the lists.
#[derive(Debug, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Detail {
    #[serde(flatten)]
    pub names: Names,
    pub started_at: String,
    pub end_at: String,
    pub envd_version: String,
    pub envd_access_token: String,
    pub cpu_count: u32,
    #[serde(rename = "memoryMB")]
    pub memory_mb: u64,
    #[serde(rename = "diskSizeMB")]
    pub disk_size_mb: u64,
    pub metadata: BTreeMap<String, String>,
    /// `running` or `paused`: the only values the SDKs accept.
    pub state: &'static str,
    pub allow_internet_access: bool,
    pub domain: Option<String>,
}

#[derive(Debug, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Metric {
    pub timestamp: String,
    pub timestamp_unix: i64,
    pub cpu_count: u32,
    pub cpu_used_pct: f64,
    pub mem_used: u64,
    pub mem_total: u64,
    pub mem_cache: u64,
    pub disk_used: u64,
    pub disk_total: u64,
}

#[derive(Debug, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Snapshot {
    #[serde(rename = "snapshotID")]
    pub snapshot_id: String,
    pub names: Vec<String>,
}

/// One child of a fork: the sandbox, or why it could not be made.
#[derive(Debug, Serialize)]
pub struct ForkItem {
    #[serde(skip_serializing_if = "Option::is_none")]
    pub sandbox: Option<Sandbox>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub error: Option<serde_json::Value>,
}

/// Unix milliseconds as RFC 3339 (what proto3 JSON and E2B's API send).
pub fn rfc3339(unix_ms: i64) -> String {
    chrono::DateTime::from_timestamp_millis(unix_ms).unwrap_or_default().to_rfc3339_opts(chrono::SecondsFormat::Millis, true)
}
