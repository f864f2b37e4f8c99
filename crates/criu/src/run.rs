//! Running a criu command to its end, with criu's own errors when it fails.

use std::path::Path;
use std::process::{Command, Stdio};

use crate::error::CriuError;

/// Run criu `command` (`what`: "dump", "restore"), which logs to `log`
/// (its `-o`); when it fails, the error carries the log's `Error` lines
/// and what criu printed.
pub fn run_logged(mut command: Command, what: &str, log: &Path) -> Result<(), CriuError> {
    command.stdin(Stdio::null()).stdout(Stdio::null()).stderr(Stdio::piped());
    let output = command.output().map_err(|source| CriuError::Spawn { what: format!("criu {what}"), source })?;
    if output.status.success() {
        return Ok(());
    }
    let text = std::fs::read_to_string(log).unwrap_or_default();
    let mut errors: Vec<&str> = text.lines().filter(|l| l.contains("Error")).collect();
    let printed = String::from_utf8_lossy(&output.stderr);
    errors.push(printed.trim());
    Err(CriuError::Failed { what: what.to_string(), status: output.status.to_string(), errors: errors.join("; ") })
}
