//! Running a criu command to its end, with criu's own errors when it fails.

use std::io::Read;
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use crate::error::CriuError;

/// The longest a dump or a restore may take: far beyond what a sandbox's
/// memory takes to write or read (seconds per GiB), short of forever.
/// criu 4.2.1 was seen waiting for good after a failed restore.
pub const LONGEST_RUN: Duration = Duration::from_secs(300);

/// Run criu `command` (`what`: "dump", "restore"), which logs to `log`
/// (its `-o`); when it fails, the error carries the log's `Error` lines
/// and what criu printed. A criu still running after `LONGEST_RUN` is
/// killed, and that is an error too.
pub fn run_logged(command: Command, what: &str, log: &Path) -> Result<(), CriuError> {
    run_logged_unless(command, what, log, || None)
}

/// [`run_logged`], and criu is killed as soon as `stop` says why it must
/// be (a restore whose lazy-pages daemon died would wait on its pages).
pub fn run_logged_unless(mut command: Command, what: &str, log: &Path, mut stop: impl FnMut() -> Option<String>) -> Result<(), CriuError> {
    command.stdin(Stdio::null()).stdout(Stdio::null()).stderr(Stdio::piped());
    let mut child = command.spawn().map_err(|source| CriuError::Spawn { what: format!("criu {what}"), source })?;
    // Read while it runs, so a full pipe cannot stop it.
    let mut stderr = child.stderr.take();
    let printed = std::thread::spawn(move || {
        let mut text = String::new();
        if let Some(pipe) = stderr.as_mut() {
            let _ = pipe.read_to_string(&mut text);
        }
        text
    });
    let started = Instant::now();
    let mut stopped = None;
    let status = loop {
        match child.try_wait() {
            Ok(Some(status)) => break Some(status),
            Ok(None) if started.elapsed() < LONGEST_RUN => {
                stopped = stop();
                if stopped.is_none() {
                    std::thread::sleep(Duration::from_millis(2));
                    continue;
                }
            }
            _ => {}
        }
        let _ = child.kill();
        let _ = child.wait();
        break None;
    };
    let printed = printed.join().unwrap_or_default();
    let text = std::fs::read_to_string(log).unwrap_or_default();
    let mut errors: Vec<&str> = text.lines().filter(|l| l.contains("Error")).collect();
    errors.push(printed.trim());
    match status {
        Some(status) if status.success() => Ok(()),
        Some(status) => Err(CriuError::Failed { what: what.to_string(), status: status.to_string(), errors: errors.join("; ") }),
        None => {
            let status = stopped.map_or_else(|| format!("killed after {} s", LONGEST_RUN.as_secs()), |why| format!("killed: {why}"));
            Err(CriuError::Failed { what: what.to_string(), status, errors: errors.join("; ") })
        }
    }
}
