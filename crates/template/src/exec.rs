//! Running one build step: stream its output lines, keep a tail for errors.

use std::collections::VecDeque;
use std::io::{BufRead, BufReader};
use std::os::unix::process::CommandExt;
use std::process::{Command, ExitStatus, Stdio};
use std::sync::mpsc;
use std::time::Duration;

use crate::error::TemplateError;

/// Output lines kept for the error of a failed step.
pub(crate) const TAIL_LINES: usize = 50;

/// How long to wait for output after the step exited; a daemon it left
/// behind may hold the pipe open forever.
const DRAIN_GRACE: Duration = Duration::from_secs(2);

enum Event {
    Line(String),
    Exited(std::io::Result<ExitStatus>),
}

/// Runs `cmd` with stdout and stderr merged, calling `on_line` for each output
/// line. A non-zero exit becomes `StepFailed` carrying the last lines.
pub(crate) fn run_step(template: &str, step: &str, mut cmd: Command, mut on_line: impl FnMut(&str)) -> Result<(), TemplateError> {
    let spawn_context = || format!("template {template:?}: starting {step}");
    let (reader, writer) = std::io::pipe().map_err(TemplateError::io(spawn_context()))?;
    let writer2 = writer.try_clone().map_err(TemplateError::io(spawn_context()))?;
    cmd.stdin(Stdio::null()).stdout(writer2).stderr(writer);
    // SAFETY: the closure runs between fork and exec and only calls prctl,
    // which is async-signal-safe; it touches no memory of the parent.
    unsafe {
        cmd.pre_exec(|| {
            // If the builder dies, don't leave the step running unsupervised.
            if libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL as libc::c_ulong) != 0 {
                return Err(std::io::Error::last_os_error());
            }
            Ok(())
        });
    }
    let mut child = cmd.spawn().map_err(TemplateError::io(spawn_context()))?;
    // Our copies of the pipe's write end must go, or the reader never sees EOF.
    drop(cmd);

    let (tx, rx) = mpsc::channel();
    let line_tx = tx.clone();
    std::thread::spawn(move || {
        let mut reader = BufReader::new(reader);
        let mut buf = Vec::new();
        loop {
            buf.clear();
            match reader.read_until(b'\n', &mut buf) {
                Ok(0) | Err(_) => break,
                Ok(_) => {
                    let line = String::from_utf8_lossy(&buf);
                    let line = line.trim_end_matches(['\n', '\r']).to_string();
                    if line_tx.send(Event::Line(line)).is_err() {
                        break;
                    }
                }
            }
        }
    });
    std::thread::spawn(move || {
        let _ = tx.send(Event::Exited(child.wait()));
    });

    let mut tail = VecDeque::with_capacity(TAIL_LINES);
    let mut keep = |line: String, on_line: &mut dyn FnMut(&str)| {
        tracing::debug!(template, step, "{line}");
        on_line(&line);
        if tail.len() == TAIL_LINES {
            tail.pop_front();
        }
        tail.push_back(line);
    };
    let status = loop {
        match rx.recv() {
            Ok(Event::Line(line)) => keep(line, &mut on_line),
            Ok(Event::Exited(status)) => break status,
            Err(_) => break Err(std::io::Error::other("lost the exit status")),
        }
    };
    while let Ok(Event::Line(line)) = rx.recv_timeout(DRAIN_GRACE) {
        keep(line, &mut on_line);
    }

    let status = status.map_err(TemplateError::io(format!("template {template:?}: waiting for {step}")))?;
    if status.success() {
        return Ok(());
    }
    Err(TemplateError::StepFailed { template: template.to_string(), step: step.to_string(), status: describe(status), tail: Vec::from(tail).join("\n") })
}

fn describe(status: ExitStatus) -> String {
    use std::os::unix::process::ExitStatusExt;
    match (status.code(), status.signal()) {
        (Some(code), _) => format!("exit status {code}"),
        (None, Some(signal)) => format!("killed by signal {signal}"),
        _ => status.to_string(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::path::Path;

    fn sh(script: &str) -> Command {
        let mut cmd = crate::tools::command(Path::new("/bin/sh"));
        cmd.arg("-c").arg(script);
        cmd
    }

    #[test]
    fn streams_stdout_and_stderr_lines() {
        let mut lines = Vec::new();
        run_step("t", "echo", sh("echo one; echo two >&2; printf three"), |l| lines.push(l.to_string())).unwrap();
        assert_eq!(lines, ["one", "two", "three"]);
    }

    #[test]
    fn failure_carries_the_last_fifty_lines() {
        let err = run_step("t", "count", sh("seq 1 80; exit 3"), |_| {}).unwrap_err();
        let TemplateError::StepFailed { step, status, tail, .. } = &err else {
            panic!("unexpected error {err}");
        };
        assert_eq!(step, "count");
        assert_eq!(status, "exit status 3");
        let expected: Vec<String> = (31..=80).map(|n| n.to_string()).collect();
        assert_eq!(tail, &expected.join("\n"));
        assert!(err.to_string().starts_with("template \"t\": count failed (exit status 3); last output:\n31\n"));
    }

    #[test]
    fn a_daemon_holding_the_pipe_does_not_hang_the_step() {
        let started = std::time::Instant::now();
        run_step("t", "daemon", sh("sleep 5 & echo started"), |_| {}).unwrap();
        assert!(started.elapsed() < Duration::from_secs(4));
    }
}
