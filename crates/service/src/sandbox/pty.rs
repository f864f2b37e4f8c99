//! PTY sessions (docs/api.md, the podflare SDK's `sandbox.pty`): a command
//! on a terminal of the sandbox's own devpts. Front ends start, read, feed,
//! resize and kill sessions through [`start`] and [`PtySession`].
//!
//! One pump task per session reads the terminal into a 1 MiB ring of output
//! numbered by byte offset (`seq`) and never waits for clients, so a session
//! outlives any client. Every reader (the create stream, attach streams,
//! long-poll reads) follows the ring from its own offset; one that falls
//! more than the ring behind skips ahead (and `read` says how much it lost).

use std::collections::VecDeque;
use std::os::fd::{AsFd, OwnedFd};
use std::sync::{Arc, Mutex};
use std::time::Duration;

pub use jail::pty::Size;
pub use jail::RunAs;
use jail::{CommandControl, ExitStatus};
use tokio::io::unix::AsyncFd;
use tokio::sync::watch;

use crate::error::Error;
use crate::sandbox::{sandbox_env, SandboxEntry};
use repl_host::events::now_ms;

/// Output kept per session for attach and read.
pub const RING_BYTES: usize = 1 << 20;
/// Sessions still running per sandbox (429 beyond).
pub const MAX_LIVE_SESSIONS: usize = 16;
/// Exited sessions kept (for attach, read and list) per sandbox; older go.
pub const MAX_EXITED_KEPT: usize = 16;
/// Largest input of one `input` call.
pub const MAX_INPUT_BYTES: usize = 1 << 20;
/// Largest `max_bytes` and `timeout_ms` of one `read`.
pub const MAX_READ_BYTES: usize = RING_BYTES;
pub const MAX_READ_WAIT: Duration = Duration::from_secs(30);
/// Largest terminal side, in cells.
pub const MAX_CELLS: u16 = 4096;
/// How long input may wait for a terminal that is not reading it.
const INPUT_DEADLINE: Duration = Duration::from_secs(10);
/// After the command exits, output still in the terminal is read for this long.
const DRAIN_AFTER_EXIT: Duration = Duration::from_millis(250);

/// A session's output so far: the last `RING_BYTES` of it, and how it ended.
#[derive(Default)]
struct Output {
    ring: VecDeque<u8>,
    /// Offset (seq) of `ring[0]` in the whole output.
    start: u64,
    exit: Option<i32>,
}

impl Output {
    fn end(&self) -> u64 {
        self.start + self.ring.len() as u64
    }

    fn push(&mut self, data: &[u8]) {
        self.ring.extend(data);
        let over = self.ring.len().saturating_sub(RING_BYTES);
        if over > 0 {
            self.ring.drain(..over);
            self.start += over as u64;
        }
    }

    /// Up to `max` bytes from `since` (or from the oldest kept byte), and
    /// the seq they start at.
    fn read(&self, since: u64, max: usize) -> (Vec<u8>, u64) {
        let from = since.clamp(self.start, self.end());
        let skip = (from - self.start) as usize;
        (self.ring.iter().skip(skip).take(max).copied().collect(), from)
    }
}

pub struct PtySession {
    pub id: String,
    pub label: String,
    pub created_at_ms: u64,
    master: AsyncFd<OwnedFd>,
    size: Mutex<Size>,
    output: Mutex<Output>,
    /// How the command ended, once it has.
    status: Mutex<Option<ExitStatus>>,
    /// Bumped whenever output arrives or the command exits.
    changed: watch::Sender<u64>,
    control: CommandControl,
}

impl PtySession {
    fn output(&self) -> std::sync::MutexGuard<'_, Output> {
        self.output.lock().unwrap_or_else(|e| e.into_inner())
    }

    pub fn exit_code(&self) -> Option<i32> {
        self.output().exit
    }

    fn bump(&self) {
        self.changed.send_modify(|v| *v += 1);
    }

    /// Write all of `data` to the terminal, waiting (a while) for room.
    async fn write(&self, mut data: &[u8]) -> Result<(), Error> {
        let deadline = tokio::time::Instant::now() + INPUT_DEADLINE;
        while !data.is_empty() {
            let mut guard = tokio::time::timeout_at(deadline, self.master.writable())
                .await
                .map_err(|_| Error::Conflict("the terminal has not read its input for 10 s".into()))?
                .map_err(|e| Error::internal("terminal input", e))?;
            match rustix::io::write(self.master.get_ref(), data) {
                Ok(n) => data = &data[n..],
                Err(rustix::io::Errno::WOULDBLOCK) => guard.clear_ready(),
                Err(rustix::io::Errno::IO) => return Err(Error::Conflict(format!("PTY session `{}` has exited", self.id))),
                Err(e) => return Err(Error::internal("terminal input", e)),
            }
        }
        Ok(())
    }
}

/// A sandbox's PTY sessions.
#[derive(Default)]
pub struct PtyTable {
    sessions: Mutex<Vec<Arc<PtySession>>>,
}

impl PtyTable {
    fn lock(&self) -> std::sync::MutexGuard<'_, Vec<Arc<PtySession>>> {
        self.sessions.lock().unwrap_or_else(|e| e.into_inner())
    }

    pub fn get(&self, id: &str) -> Result<Arc<PtySession>, Error> {
        self.lock().iter().find(|s| s.id == id).cloned().ok_or_else(|| Error::NotFound(format!("no PTY session `{id}`")))
    }

    pub fn list(&self) -> Vec<Arc<PtySession>> {
        self.lock().clone()
    }

    /// Room for one more running session? Forgets the oldest exited
    /// sessions beyond `MAX_EXITED_KEPT`.
    fn admit(&self) -> Result<(), Error> {
        let mut sessions = self.lock();
        let mut exited = sessions.iter().filter(|s| s.exit_code().is_some()).count();
        while exited > MAX_EXITED_KEPT {
            if let Some(i) = sessions.iter().position(|s| s.exit_code().is_some()) {
                sessions.remove(i);
            }
            exited -= 1;
        }
        if sessions.len() - exited >= MAX_LIVE_SESSIONS {
            return Err(Error::Capacity(format!("a sandbox may run at most {MAX_LIVE_SESSIONS} PTY sessions at once")));
        }
        Ok(())
    }
}

/// A terminal of `cols` × `rows` (default 80 × 24), each side at most
/// [`MAX_CELLS`].
pub fn size(cols: Option<u16>, rows: Option<u16>) -> Result<Size, Error> {
    let s = Size { cols: cols.unwrap_or(80), rows: rows.unwrap_or(24) };
    if s.cols == 0 || s.rows == 0 || s.cols > MAX_CELLS || s.rows > MAX_CELLS {
        return Err(Error::Invalid(format!("cols and rows must be between 1 and {MAX_CELLS}")));
    }
    Ok(s)
}

fn environment(id: &str, setup: &crate::setup::SandboxSetup, extra: &[(String, String)]) -> Result<Vec<String>, Error> {
    let mut env: Vec<String> = sandbox_env(id, setup).into_iter().filter(|v| !v.starts_with("TERM=")).collect();
    env.push("TERM=xterm-256color".into());
    for (k, v) in extra {
        super::check_env_var(k, v)?;
        env.retain(|e| !e.starts_with(&format!("{k}=")));
        env.push(format!("{k}={v}"));
    }
    Ok(env)
}

/// What to run on a new terminal.
pub struct PtySpec {
    pub argv: Vec<String>,
    /// How listings name the session.
    pub label: String,
    pub size: Size,
    /// Extra environment as `(name, value)` pairs.
    pub env: Vec<(String, String)>,
    /// Working directory (None: [`super::files::HOME`]).
    pub cwd: Option<String>,
    /// Kill the session after this long.
    pub timeout: Option<Duration>,
    /// Who it runs as (root unless a front end names a user).
    pub run_as: jail::RunAs,
}

/// Start `spec` in `entry` on a new terminal: one more live session, read
/// into its ring by a pump task until it ends.
pub async fn start(entry: &Arc<SandboxEntry>, spec: PtySpec) -> Result<Arc<PtySession>, Error> {
    let env = environment(&entry.id, &entry.settings.setup, &spec.env)?;
    start_with_env(entry, spec, env).await
}

/// [`start`] with the whole environment given (`spec.env` is not used).
pub async fn start_with_env(entry: &Arc<SandboxEntry>, spec: PtySpec, mut env: Vec<String>) -> Result<Arc<PtySession>, Error> {
    if spec.argv.is_empty() || spec.argv[0].is_empty() {
        return Err(Error::Invalid("argv must name a program".into()));
    }
    if !env.iter().any(|e| e.starts_with("TERM=")) {
        env.push("TERM=xterm-256color".into());
    }
    let cwd = match &spec.cwd {
        Some(c) => super::files::sandbox_path(c)?.to_string(),
        None => super::files::HOME.to_string(),
    };
    let check = jail::fs::SandboxPath::parse(&cwd, "/").map_err(Error::from)?;
    let info = super::files::with_fs(entry, move |fs| fs.stat(&check, true)).await?;
    if info.kind != jail::fs::EntryType::Dir {
        return Err(Error::Invalid(format!("cwd {cwd} is not a directory")));
    }
    entry.ptys.admit()?;
    let process =
        entry.engine.spawn_terminal(spec.argv, env, &cwd, spec.size, spec.run_as).await.map_err(|e| Error::internal("could not start the PTY session", e))?;
    // SAFETY: the AsyncFd owns the master, which stays open and the same for its life.
    let master = unsafe { AsyncFd::register(process.master) }.map_err(|e| Error::internal("register terminal", e.into_parts().1))?;
    let session = Arc::new(PtySession {
        id: format!("pty-{}", &crate::ids::new_id()[3..15]),
        label: spec.label,
        created_at_ms: now_ms(),
        master,
        size: Mutex::new(spec.size),
        output: Mutex::new(Output::default()),
        status: Mutex::new(None),
        changed: watch::channel(0).0,
        control: process.control,
    });
    entry.ptys.lock().push(Arc::clone(&session));
    tokio::spawn(pump(Arc::clone(&session), process.exited, Arc::clone(entry)));
    if let Some(after) = spec.timeout {
        let s = Arc::clone(&session);
        tokio::spawn(async move {
            tokio::time::sleep(after).await;
            if s.exit_code().is_none() {
                s.control.kill().await;
            }
        });
    }
    Ok(session)
}

/// Read the terminal into the ring until the command has exited and its
/// output is drained, then record the exit code.
async fn pump(session: Arc<PtySession>, mut exited: tokio::sync::oneshot::Receiver<ExitStatus>, entry: Arc<SandboxEntry>) {
    let mut buf = vec![0u8; 64 * 1024];
    let mut code: Option<i32> = None;
    let mut drain_until: Option<tokio::time::Instant> = None;
    loop {
        let drain = async {
            match drain_until {
                Some(t) => tokio::time::sleep_until(t).await,
                None => std::future::pending().await,
            }
        };
        tokio::select! {
            status = &mut exited, if code.is_none() => {
                // An unknown end (the sandbox went) reads as -1.
                let status = status.ok();
                code = Some(status.map(|s| s.code()).unwrap_or(-1));
                *session.status.lock().unwrap_or_else(|e| e.into_inner()) = status;
                drain_until = Some(tokio::time::Instant::now() + DRAIN_AFTER_EXIT);
            }
            _ = drain => break,
            ready = session.master.readable() => {
                let Ok(mut guard) = ready else { break };
                match rustix::io::read(session.master.get_ref().as_fd(), &mut buf) {
                    Ok(0) => break,
                    Ok(n) => {
                        session.output().push(&buf[..n]);
                        session.bump();
                        entry.touch();
                    }
                    Err(rustix::io::Errno::WOULDBLOCK) => guard.clear_ready(),
                    // EIO: every holder of the terminal's other side is gone.
                    Err(_) => {
                        if code.is_none() {
                            let status = (&mut exited).await.ok();
                            code = Some(status.map(|s| s.code()).unwrap_or(-1));
                            *session.status.lock().unwrap_or_else(|e| e.into_inner()) = status;
                        }
                        break;
                    }
                }
            }
        }
    }
    session.output().exit = Some(code.unwrap_or(-1));
    session.bump();
}

/// Output read from a session's ring.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Chunk {
    pub data: Vec<u8>,
    /// Offset of `data[0]` in the whole output (later than asked when the
    /// ring had moved on).
    pub seq: u64,
    /// The exit code, once the command has ended.
    pub exit: Option<i32>,
}

impl Chunk {
    /// Where the next read should start.
    pub fn next_seq(&self) -> u64 {
        self.seq + self.data.len() as u64
    }
}

/// What listings show of a session.
#[derive(Debug, Clone)]
pub struct PtyStatus {
    pub id: String,
    pub label: String,
    pub created_at_ms: u64,
    pub exit_code: Option<i32>,
    pub size: Size,
}

impl PtySession {
    /// Up to `max` bytes of output from `since`, waiting until `deadline`
    /// (None: for ever) for some to arrive or the command to end.
    pub async fn read(&self, since: u64, max: usize, deadline: Option<tokio::time::Instant>) -> Chunk {
        let mut changed = self.changed.subscribe();
        loop {
            let chunk = {
                let out = self.output();
                let (data, seq) = out.read(since, max);
                Chunk { data, seq, exit: out.exit }
            };
            let timed_out = deadline.is_some_and(|d| tokio::time::Instant::now() >= d);
            if !chunk.data.is_empty() || chunk.exit.is_some() || timed_out {
                return chunk;
            }
            match deadline {
                Some(d) => drop(tokio::time::timeout_at(d, changed.changed()).await),
                None => {
                    if changed.changed().await.is_err() {
                        return chunk;
                    }
                }
            }
        }
    }

    /// Type `data` on the terminal (resuming a paused sandbox first).
    pub async fn input(&self, entry: &Arc<SandboxEntry>, data: &[u8]) -> Result<(), Error> {
        if data.len() > MAX_INPUT_BYTES {
            return Err(Error::TooLarge(format!("input is larger than {MAX_INPUT_BYTES} bytes")));
        }
        if self.exit_code().is_some() {
            return Err(Error::Conflict(format!("PTY session `{}` has exited", self.id)));
        }
        entry.touch();
        crate::sandbox::freezer::ensure_running(entry).await?;
        self.write(data).await
    }

    pub fn resize(&self, size: Size) -> Result<(), Error> {
        if self.exit_code().is_some() {
            return Err(Error::Conflict(format!("PTY session `{}` has exited", self.id)));
        }
        jail::pty::resize(self.master.get_ref(), size).map_err(|e| Error::internal("resize the terminal", e))?;
        *self.size.lock().unwrap_or_else(|e| e.into_inner()) = size;
        Ok(())
    }

    /// Kill the command (nothing if it has ended).
    pub async fn kill(&self) {
        self.signal(libc::SIGKILL).await;
    }

    /// Send `signal` to the command's session (nothing if it has ended).
    pub async fn signal(&self, signal: i32) {
        if self.exit_code().is_none() {
            self.control.signal(signal).await;
        }
    }

    /// How the command ended (None: running, or its end is unknown).
    pub fn exit_status(&self) -> Option<ExitStatus> {
        *self.status.lock().unwrap_or_else(|e| e.into_inner())
    }

    pub fn status(&self) -> PtyStatus {
        PtyStatus {
            id: self.id.clone(),
            label: self.label.clone(),
            created_at_ms: self.created_at_ms,
            exit_code: self.exit_code(),
            size: *self.size.lock().unwrap_or_else(|e| e.into_inner()),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_ring_keeps_the_last_mebibyte_by_offset() {
        let mut out = Output::default();
        out.push(&vec![b'a'; RING_BYTES - 10]);
        out.push(&[b'b'; 20]);
        assert_eq!(out.start, 10);
        assert_eq!(out.end(), RING_BYTES as u64 + 10);
        let (chunk, from) = out.read(0, 5);
        assert_eq!((chunk, from), (vec![b'a'; 5], 10), "a reader behind the ring skips to its start");
        let (chunk, from) = out.read(RING_BYTES as u64, 100);
        assert_eq!((chunk, from), (vec![b'b'; 10], RING_BYTES as u64));
        let (chunk, _) = out.read(u64::MAX, 100);
        assert!(chunk.is_empty());
    }
}
