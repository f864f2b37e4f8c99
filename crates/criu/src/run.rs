//! Running a criu command to its end, with criu's own errors when it fails.

use std::io::Read;
use std::os::fd::AsFd;
use std::path::Path;
use std::process::{ChildStderr, Command, Stdio};
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
    // Read as it runs, so a full pipe cannot stop it, and never past its
    // end: what it forked (a restore's helper, its half-restored tasks,
    // left behind when it is killed) may hold the pipe open for good.
    let mut stderr = child.stderr.take().map(Printed::new);
    let started = Instant::now();
    let mut stopped = None;
    let status = loop {
        if let Some(stderr) = stderr.as_mut() {
            stderr.read_available();
        }
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
    let printed = stderr.map(Printed::into_text).unwrap_or_default();
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

/// What criu printed on stderr, read without blocking.
struct Printed {
    pipe: ChildStderr,
    bytes: Vec<u8>,
}

impl Printed {
    fn new(pipe: ChildStderr) -> Printed {
        // Unset only if fcntl fails; a blocking read then waits for criu's next line at worst.
        let _ = nix::fcntl::fcntl(pipe.as_fd(), nix::fcntl::FcntlArg::F_SETFL(nix::fcntl::OFlag::O_NONBLOCK));
        Printed { pipe, bytes: Vec::new() }
    }

    /// Take what is in the pipe now.
    fn read_available(&mut self) {
        let mut buf = [0u8; 4096];
        while let Ok(n @ 1..) = self.pipe.read(&mut buf) {
            self.bytes.extend_from_slice(&buf[..n]);
        }
    }

    /// All criu printed: what is in the pipe once it ended, and before.
    fn into_text(mut self) -> String {
        self.read_available();
        String::from_utf8_lossy(&self.bytes).into_owned()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::mpsc;

    fn sh(script: &str) -> Command {
        let mut command = Command::new("sh");
        command.arg("-c").arg(script);
        command
    }

    #[test]
    fn a_failure_carries_what_criu_printed() {
        let log = tempfile::NamedTempFile::new().unwrap();
        std::fs::write(log.path(), "(00.01) Error (criu/cr-restore.c:1): restore went wrong\n").unwrap();
        let err = run_logged(sh("echo printed-on-stderr >&2; exit 3"), "restore", log.path()).unwrap_err().to_string();
        assert!(err.contains("printed-on-stderr") && err.contains("restore went wrong"), "{err}");
    }

    #[test]
    fn a_stopped_run_returns_though_what_it_forked_holds_stderr() {
        // The background sleep keeps the pipe open after sh is killed,
        // as a restore's helper does after criu is.
        let (tx, rx) = mpsc::channel();
        let leftover = tempfile::NamedTempFile::new().unwrap();
        let pidfile = leftover.path().to_path_buf();
        std::thread::spawn(move || {
            let script = format!("sleep 1000 & echo $! > {}; echo started >&2; wait", pidfile.display());
            let mut asked = 0;
            let ran = run_logged_unless(sh(&script), "restore", Path::new("/nonexistent"), || {
                asked += 1;
                (asked > 50).then(|| "the lazy-pages daemon died".to_string())
            });
            let _ = tx.send(ran);
        });
        let ran = rx.recv_timeout(Duration::from_secs(60));
        if let Ok(pid) = std::fs::read_to_string(leftover.path()).unwrap_or_default().trim().parse::<i32>() {
            let _ = nix::sys::signal::kill(nix::unistd::Pid::from_raw(pid), nix::sys::signal::Signal::SIGKILL);
        }
        let err = ran.expect("run_logged_unless waited on a pipe its killed child's children held").unwrap_err().to_string();
        assert!(err.contains("killed: the lazy-pages daemon died") && err.contains("started"), "{err}");
    }
}
