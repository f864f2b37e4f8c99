//! Bodies of the files API (`/v1/sandboxes/{id}/files...`, docs/files.md).

use serde::{Deserialize, Serialize};
use utoipa::ToSchema;

/// What a path is.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "lowercase")]
pub enum FileType {
    File,
    Dir,
    Symlink,
    Other,
}

/// `stat` of one path, as the sandbox sees it (owners in the sandbox's ids).
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
pub struct FileInfo {
    pub name: String,
    /// Absolute, normalised path inside the sandbox.
    pub path: String,
    #[serde(rename = "type")]
    pub kind: FileType,
    pub size: u64,
    /// Permission bits as a number (0o644 = 420).
    pub mode: u32,
    /// Last modification, milliseconds since the epoch.
    pub mtime_ms: i64,
    pub uid: u32,
    pub gid: u32,
    /// A symlink's target, as written.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub target: Option<String>,
}

/// Answer of `GET .../files?list=1`.
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
pub struct FileList {
    pub path: String,
    pub entries: Vec<FileInfo>,
    /// More entries than `limit` existed; the first `limit` by name are here.
    pub truncated: bool,
}

/// Answer of `PUT .../files`.
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
pub struct Written {
    pub path: String,
    /// Bytes written by this request.
    pub bytes: u64,
}

/// A mode given as a number (420) or an octal string ("644", "0o755").
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
#[serde(untagged)]
pub enum FileMode {
    Number(u32),
    Octal(String),
}

impl FileMode {
    pub fn bits(&self) -> Result<u32, String> {
        match self {
            FileMode::Number(n) => Ok(*n),
            FileMode::Octal(s) => parse_octal_mode(s),
        }
    }
}

/// "644", "0644" or "0o644" → 0o644.
pub fn parse_octal_mode(s: &str) -> Result<u32, String> {
    let digits = s.strip_prefix("0o").unwrap_or(s);
    u32::from_str_radix(digits, 8).map_err(|_| format!("mode `{s}` is not an octal number"))
}

/// Body of `POST .../files/mkdir` (`mkdir -p`).
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct MkdirRequest {
    pub path: String,
    /// Mode of the directories made (default 0o755).
    pub mode: Option<FileMode>,
}

/// Body of `POST .../files/rename`.
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct RenameRequest {
    pub from: String,
    pub to: String,
    /// Replace an existing `to` (default false: 409 if it exists).
    #[serde(default)]
    pub overwrite: bool,
}

/// Body of `POST .../files/chmod`.
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct ChmodRequest {
    pub path: String,
    pub mode: FileMode,
}

/// One line of `GET .../files/watch`.
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
pub struct FileEvent {
    /// `ready` (watching has begun), `created`, `modified`, `removed`, or
    /// `overflow` (events were lost: rescan).
    #[serde(rename = "type")]
    pub kind: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub path: Option<String>,
    /// Whether `path` is a directory.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub dir: bool,
    pub ts: u64,
}
