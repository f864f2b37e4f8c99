//! Custom templates (docs/templates.md): recipes, their build stream, and
//! templates saved from live sandboxes.

use serde::{Deserialize, Serialize};
use utoipa::ToSchema;

use crate::Egress;

/// Body of `POST /v1/templates`: how to build a template on top of another.
/// The TOML recipe file of `forkbox template build` has the same fields,
/// except that a file's content is read from `src`, relative to the recipe.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct TemplateRecipe {
    /// Lower-case letters, digits, `-` and `_`; at most 64.
    pub name: String,
    #[serde(default)]
    pub description: String,
    /// The template it starts from (default `default`): a built-in or one of yours.
    #[serde(default)]
    pub base: Option<String>,
    /// Debian packages, installed with apt-get (one step).
    #[serde(default)]
    pub apt: Vec<String>,
    /// pip requirement specifiers (`pandas==2.2.2`, `rich`), installed with pip (one step).
    #[serde(default)]
    pub pip: Vec<String>,
    /// Files written into the template (one step).
    #[serde(default)]
    pub files: Vec<TemplateFile>,
    /// Shell commands run as root with bash, in order (one step each).
    #[serde(default)]
    pub commands: Vec<String>,
    /// Modules the warm REPL imports, so `import x` in a new sandbox costs nothing.
    #[serde(default)]
    pub preimport: Vec<String>,
    /// Defaults for sandboxes of this template (a create's own fields win).
    #[serde(default)]
    pub limits: TemplateLimits,
    /// Network of the build's steps (default `true`).
    #[serde(default)]
    pub egress: Option<Egress>,
}

/// One file of a recipe.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct TemplateFile {
    /// Absolute path in the template.
    pub path: String,
    /// The content, base64.
    pub content_b64: String,
    /// Permission bits (default 0o644).
    #[serde(default)]
    pub mode: Option<u32>,
}

/// Default limits a template gives its sandboxes.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct TemplateLimits {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ram_mib: Option<u64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rootfs_gb: Option<u64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub timeout_seconds: Option<u64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub idle_timeout_seconds: Option<u64>,
}

/// One line of the NDJSON stream `POST /v1/templates` answers.
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
#[serde(tag = "type", rename_all = "snake_case")]
pub enum BuildEvent {
    /// A step begins (`index` from 1 of `total`); `cached`: its layer was
    /// built before and is reused, nothing runs.
    Step { index: u32, total: u32, step: String, cached: bool },
    /// Output of the running step.
    Log { stream: String, text: String },
    /// The template is ready.
    Done { template: Box<TemplateInfo> },
    /// The build failed; nothing was registered.
    Error { error: String },
}

/// Body of `POST /v1/sandboxes/{id}/template`.
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct SaveTemplate {
    pub name: String,
    #[serde(default)]
    pub description: String,
}

/// What depends on a template (`DELETE` is `409` while any does).
#[derive(Debug, Clone, Default, Serialize, Deserialize, ToSchema)]
pub struct TemplateUse {
    /// Live sandboxes made from it.
    pub sandboxes: Vec<String>,
    /// Spaces that resume onto it.
    pub spaces: Vec<String>,
    /// Templates built on it.
    pub templates: Vec<String>,
}

/// `GET /v1/templates` items and `GET /v1/templates/{name}`.
#[derive(Debug, Clone, Default, Serialize, Deserialize, ToSchema)]
pub struct TemplateInfo {
    pub name: String,
    /// `ready`, `building`, `queued` or `failed` (built-ins build at start).
    pub state: String,
    pub progress: f32,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
    /// `builtin`, `recipe` or `saved`.
    #[serde(default)]
    pub kind: String,
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub description: String,
    /// The template it was built on (none for built-ins).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub base: Option<String>,
    /// Unix ms (0 if unknown).
    #[serde(default)]
    pub created_at: u64,
    /// Bytes of file data in its own layers, not its base's (0 for a built-in).
    #[serde(default)]
    pub size_bytes: u64,
    /// Layers under its sandboxes' files, built-in root filesystem included.
    #[serde(default)]
    pub layers: u32,
    /// Modules its warm REPL imports.
    #[serde(default)]
    pub preimport: Vec<String>,
    #[serde(default)]
    pub limits: TemplateLimits,
    /// The recipe it was built from (`recipe` templates).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub recipe: Option<Box<TemplateRecipe>>,
    /// The sandbox it was saved from (`saved` templates).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub saved_from: Option<String>,
    /// Globals of the saved REPL that could not be kept (`saved` templates).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub unsaved: Vec<crate::Unsaved>,
    #[serde(default)]
    pub in_use: TemplateUse,
}
