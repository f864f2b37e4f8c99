//! Checkpoints and Spaces (docs/state.md).

use serde::{Deserialize, Serialize};
use utoipa::ToSchema;

/// A checkpoint of a sandbox: `POST /v1/sandboxes/{id}/checkpoints` and the
/// items of `GET .../checkpoints`.
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
pub struct CheckpointInfo {
    pub checkpoint: String,
    pub sandbox_id: String,
    /// Unix milliseconds.
    pub created_at: u64,
}

/// `GET /v1/sandboxes/{id}/checkpoints`, oldest first.
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
pub struct CheckpointList {
    pub checkpoints: Vec<CheckpointInfo>,
}

/// Body of `POST /v1/sandboxes/{id}/restore`.
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct RestoreRequest {
    pub checkpoint: String,
}

/// A global the REPL could not keep in a Space, and why.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub struct Unsaved {
    pub name: String,
    /// The value's type name.
    #[serde(rename = "type")]
    pub kind: String,
    pub reason: String,
}

/// A Space: a sandbox frozen to disk. `GET /v1/spaces/{id}`, the items of
/// `GET /v1/spaces`, and (with `sandbox_id`) the answer of `freeze`.
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
pub struct SpaceInfo {
    pub space_id: String,
    /// The sandbox that was frozen into it.
    pub sandbox_id: String,
    pub template: String,
    /// Unix milliseconds.
    pub created_at: u64,
    /// Bytes on disk: the sandbox's changed files and its REPL state.
    pub bytes: u64,
    /// Globals that could not be kept.
    pub unsaved: Vec<Unsaved>,
    /// What the Space keeps (docs/state.md#what-each-kind-keeps); Spaces
    /// written before kinds existed are `globals`.
    #[serde(default)]
    pub kind: SpaceKind,
    /// Why a `globals` Space did not keep the sandbox's processes (absent
    /// from a `processes` Space).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub processes_not_kept: Option<String>,
}

/// What a Space keeps.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "lowercase")]
pub enum SpaceKind {
    /// The sandbox's changed files and the REPL's picklable globals.
    #[default]
    Globals,
    /// The sandbox's changed files and every process, as criu dumped them
    /// (a `keep_processes` sandbox's).
    Processes,
}

/// `GET /v1/spaces`, oldest first.
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
pub struct SpaceList {
    pub spaces: Vec<SpaceInfo>,
}

/// Body of `POST /v1/spaces/{id}/resume` (every field optional; the
/// frozen sandbox's settings otherwise).
#[derive(Debug, Clone, Default, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct ResumeSpace {
    pub timeout_seconds: Option<u64>,
    pub idle_timeout_seconds: Option<u64>,
    pub persistent: Option<bool>,
    pub egress: Option<crate::Egress>,
}
