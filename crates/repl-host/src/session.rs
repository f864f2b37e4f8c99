//! The server's side of one REPL process: frames it sends (docs/repl-protocol.md),
//! and one pump task that merges the control socket with the raw stdout/stderr
//! pipes into a single ordered stream of `ReplItem`s. Before it forwards a
//! control frame it drains both pipes, so raw output written before a
//! Python-level write is delivered before it.

use std::os::fd::{AsFd, OwnedFd};
use std::sync::{Arc, OnceLock};
use std::time::Duration;

use bytes::{Buf, BytesMut};
use jail::{ExitStatus, ReplProcess};
use serde::Deserialize;
use tokio::io::AsyncReadExt;
use tokio::net::unix::pipe;
use tokio::sync::{mpsc, oneshot};

use crate::control::{self, ControlReader, ControlWriter};
use crate::journal::Journal;

/// The REPL source and its bootstrap, embedded in the binary.
pub const REPL_SOURCE: &str = include_str!("../../../repl/repl.py");
pub const REPL_BOOTSTRAP: &str = include_str!("../../../repl/bootstrap.py");
/// Longest wait for a new REPL's ready frame.
const START_TIMEOUT: Duration = Duration::from_secs(60);
/// Largest control frame we accept from a REPL (a huge repr, say).
const MAX_FRAME: usize = 64 << 20;
/// Largest MIME bundle (`V`, `M`) passed on; the REPL keeps to it, so only
/// code that writes to the control socket itself sends a bigger one.
pub const MAX_BUNDLE: usize = 4 << 20;

#[derive(Debug)]
pub enum ReplItem {
    Stdout(Vec<u8>),
    Stderr(Vec<u8>),
    Result(serde_json::Value),
    /// A MIME bundle to display (`display()`, a figure).
    Display(serde_json::Value),
    Done(Done),
    /// The REPL forked itself (answer to `send_fork`).
    Forked(Forked),
    /// The process is gone (its status when known).
    Died(Option<ExitStatus>),
}

#[derive(Debug, Deserialize)]
pub struct Done {
    pub id: u64,
    pub exit_code: i32,
    pub error: Option<PyError>,
}

#[derive(Debug, Deserialize)]
pub struct Forked {
    pub id: u64,
    /// The children's pids in the family pid namespace.
    pub pids: Vec<i64>,
    pub error: Option<String>,
}

#[derive(Debug, Deserialize)]
pub struct PyError {
    pub ename: String,
    pub evalue: String,
    pub traceback: Vec<String>,
}

#[derive(Debug, Deserialize)]
pub struct Ready {
    pub pid: i64,
    pub python: String,
    /// Whether the REPL moves the processes it starts into the sandbox's
    /// leaf pid namespace (false: they stay in the family's, unseen by `ps`).
    #[serde(default)]
    pub pidns: bool,
    /// Whether this REPL is a fork of another.
    #[serde(default)]
    pub forked: bool,
}

pub struct ReplSession {
    control: ControlWriter,
    items: mpsc::Receiver<ReplItem>,
    /// Items read while waiting for something else (a fork's answer),
    /// handed out first.
    held: std::collections::VecDeque<ReplItem>,
    /// None for a forked REPL until the engine adopted it.
    pidfd: Option<OwnedFd>,
    /// The REPL's output journal, taken once its pidfd is known; the pump
    /// reads it after the REPL's death.
    journal: Arc<OnceLock<Journal>>,
    pub host_pid: i32,
    next_id: u64,
    pub ready: Ready,
    /// Duplicates of the server's ends ([control, stdout, stderr]) until
    /// they are handed to the family's shim (`take_ends`), which keeps them
    /// across a server restart.
    ends: Option<[OwnedFd; 3]>,
}

/// What `ReplSession::resume` found.
pub struct Resumed {
    pub session: ReplSession,
    /// Code was running when the server went away (it was interrupted).
    pub interrupted: bool,
}

/// Why a REPL could not be taken over or answer. Every message may reach a
/// client: it names the REPL, never a host path.
#[derive(Debug, thiserror::Error)]
pub enum SessionError {
    /// It died or went silent before its ready frame; what it printed.
    #[error("the Python REPL did not start: {said}")]
    NotStarted { said: String },
    #[error("the forked Python REPL did not start: {said}")]
    ForkedNotStarted { said: String },
    #[error("the control socket: {0}")]
    Control(#[source] std::io::Error),
    #[error("the Python process cannot be reached: {0}")]
    Unreachable(#[source] std::io::Error),
    #[error("the Python process died")]
    Died,
    #[error("the Python process did not answer after the restart")]
    Silent,
    #[error("the Python process died while forking")]
    DiedWhileForking,
}

/// How long an adopted REPL may take to answer the first call.
const RESUME_TIMEOUT: Duration = Duration::from_secs(10);

impl SessionError {
    /// A failed start, said of a new REPL or of a fork child's.
    fn started(self, forked: bool) -> SessionError {
        match self {
            SessionError::NotStarted { said } if forked => SessionError::ForkedNotStarted { said },
            other => other,
        }
    }
}

impl ReplSession {
    /// Take over a freshly spawned REPL and wait until it is ready.
    pub async fn start(process: ReplProcess) -> Result<ReplSession, SessionError> {
        let (control, pidfd, host_pid) = (process.control, process.pidfd, process.host_pid);
        let mut session = Self::begin(control, process.stdout, process.stderr, process.exited).await.map_err(|e| {
            let _ = jail::sys::pidfd_send_signal(pidfd.as_fd(), nix::sys::signal::Signal::SIGKILL);
            e.started(false)
        })?;
        session.adopted(host_pid, pidfd);
        Ok(session)
    }

    /// Take over the server's ends of a REPL that a fork is making, and wait
    /// for its ready frame; `adopted` supplies its pidfd afterwards.
    pub async fn start_forked(
        control: tokio::net::UnixStream,
        stdout: pipe::Receiver,
        stderr: pipe::Receiver,
        exited: oneshot::Receiver<ExitStatus>,
    ) -> Result<ReplSession, SessionError> {
        Self::begin(control, stdout, stderr, exited).await.map_err(|e| e.started(true))
    }

    /// Take over a REPL a previous server left running (after a restart):
    /// interrupt whatever it was running for that server, then find our
    /// place in its control stream again. The old server may have died
    /// half-way through reading a frame, so the stream is scanned for the
    /// answer to a probe with an id nothing else can carry; everything
    /// before it was meant for the dead server and is dropped.
    pub async fn resume(process: ReplProcess) -> Result<Resumed, SessionError> {
        let probe = (1u64 << 52) + rand::random::<u32>() as u64;
        let marker = format!("D{{\"id\":{probe},").into_bytes();
        let (control, pidfd, host_pid) = (process.control, process.pidfd, process.host_pid);
        let _ = jail::sys::pidfd_send_signal(pidfd.as_fd(), nix::sys::signal::Signal::SIGINT);
        let (read, write) = control::split(control).map_err(SessionError::Control)?;
        let (tx, rx) = mpsc::channel(256);
        let (ready_tx, _) = oneshot::channel();
        // No journal: this server does not know how much of the stream the
        // dead one read, so it cannot tell what the journal holds beyond it.
        let journal = Arc::new(OnceLock::new());
        tokio::spawn(pump(read, process.stdout, process.stderr, process.exited, tx, ready_tx, Some(marker), journal.clone()));
        let ready = Ready { pid: 0, python: String::new(), pidns: true, forked: false };
        let mut session =
            ReplSession { control: write, items: rx, held: Default::default(), pidfd: Some(pidfd), journal, host_pid, next_id: probe, ready, ends: None };
        let id = session.send_exec("pass").await.map_err(SessionError::Unreachable)?;
        let mut interrupted = false;
        let found = tokio::time::timeout(RESUME_TIMEOUT, async {
            loop {
                match session.items.recv().await {
                    Some(ReplItem::Done(d)) if d.id == id => return Ok(()),
                    Some(ReplItem::Done(_)) => interrupted = true,
                    Some(ReplItem::Died(_)) | None => return Err(SessionError::Died),
                    Some(_) => {}
                }
            }
        })
        .await;
        match found {
            Ok(Ok(())) => Ok(Resumed { session, interrupted }),
            Ok(Err(e)) => Err(e),
            Err(_) => {
                session.signal(nix::sys::signal::Signal::SIGKILL);
                Err(SessionError::Silent)
            }
        }
    }

    /// The duplicates of the server's ends, for the family's shim to keep
    /// (once: later calls get None).
    pub fn take_ends(&mut self) -> Option<[OwnedFd; 3]> {
        self.ends.take()
    }

    pub fn adopted(&mut self, host_pid: i32, pidfd: OwnedFd) {
        if let Some(journal) = Journal::take(&pidfd) {
            let _ = self.journal.set(journal);
        }
        self.host_pid = host_pid;
        self.pidfd = Some(pidfd);
    }

    /// Wait for the ready frame; on failure, what the process said
    /// (`NotStarted`, which `start_forked` turns into `ForkedNotStarted`).
    async fn begin(
        control: tokio::net::UnixStream,
        stdout: pipe::Receiver,
        stderr: pipe::Receiver,
        exited: oneshot::Receiver<ExitStatus>,
    ) -> Result<ReplSession, SessionError> {
        let ends = [control.as_fd(), stdout.as_fd(), stderr.as_fd()].map(|fd| fd.try_clone_to_owned());
        let ends = match ends {
            [Ok(a), Ok(b), Ok(c)] => Some([a, b, c]),
            _ => None,
        };
        let (read, write) = control::split(control).map_err(SessionError::Control)?;
        let (tx, mut rx) = mpsc::channel(256);
        let (ready_tx, ready_rx) = oneshot::channel();
        let journal = Arc::new(OnceLock::new());
        tokio::spawn(pump(read, stdout, stderr, exited, tx, ready_tx, None, journal.clone()));
        let ready = match tokio::time::timeout(START_TIMEOUT, ready_rx).await {
            Ok(Ok(r)) => r,
            _ => {
                // Collect what the process said before dying, for the error.
                let mut said = Vec::new();
                while let Ok(Some(item)) = tokio::time::timeout(Duration::from_millis(200), rx.recv()).await {
                    match item {
                        ReplItem::Stdout(b) | ReplItem::Stderr(b) => said.extend(b),
                        ReplItem::Died(s) => {
                            said.extend(format!(" (exit {s:?})").into_bytes());
                            break;
                        }
                        _ => {}
                    }
                }
                return Err(SessionError::NotStarted { said: String::from_utf8_lossy(&said).trim().to_string() });
            }
        };
        Ok(ReplSession { control: write, items: rx, held: Default::default(), pidfd: None, journal, host_pid: 0, next_id: 1, ready, ends })
    }

    /// Send code to run; returns the exec id the matching `Done` carries.
    pub async fn send_exec(&mut self, code: &str) -> std::io::Result<u64> {
        let id = self.next_id;
        self.next_id += 1;
        let body = serde_json::to_vec(&serde_json::json!({"id": id, "code": code}))?;
        let mut frame = Vec::with_capacity(body.len() + 5);
        frame.extend_from_slice(&((body.len() + 1) as u32).to_be_bytes());
        frame.push(b'X');
        frame.extend_from_slice(&body);
        self.control.write_all(&frame).await?;
        Ok(id)
    }

    pub async fn next(&mut self) -> Option<ReplItem> {
        match self.held.pop_front() {
            Some(item) => Some(item),
            None => self.items.recv().await,
        }
    }

    /// Items already waiting (output of background threads between execs).
    pub fn try_next(&mut self) -> Option<ReplItem> {
        self.held.pop_front().or_else(|| self.items.try_recv().ok())
    }

    pub fn signal(&self, sig: nix::sys::signal::Signal) {
        if let Some(fd) = &self.pidfd {
            let _ = jail::sys::pidfd_send_signal(fd.as_fd(), sig);
        }
    }

    /// A frame that does nothing but let the REPL reap its dead fork
    /// children (it does between frames; a zygote gets one now and then).
    pub async fn nudge(&mut self) -> std::io::Result<()> {
        self.control.write_all(&[0, 0, 0, 1, b'Z']).await
    }

    /// Tell a REPL that was copied without forking (criu restored one
    /// dump into several sandboxes) to reseed its random generators, as a
    /// fork child does; the next exec runs after it (docs/repl-protocol.md).
    pub async fn send_reseed(&mut self) -> std::io::Result<()> {
        self.control.write_all(&[0, 0, 0, 3, b'S', b'{', b'}']).await
    }

    /// Ask the REPL to fork itself once per child: one `F` frame per child,
    /// saying how many descriptors that child gets from the shim
    /// (docs/repl-protocol.md); child `i` takes the shim's hand-over slot
    /// `first_slot + i`. Returns the fork id its `Forked` answer carries.
    pub async fn send_fork(&mut self, plan: &serde_json::Value, children: &[usize], first_slot: usize) -> std::io::Result<u64> {
        let id = self.next_id;
        self.next_id += 1;
        let mut frames = Vec::new();
        for (index, fds) in children.iter().enumerate() {
            let mut msg = serde_json::json!({"id": id, "index": index, "count": children.len(), "fds": fds});
            if first_slot > 0 {
                // Absent, the slot is the index (what a REPL started by an
                // older server understands).
                msg["slot"] = serde_json::json!(first_slot + index);
            }
            if index == 0 {
                msg["plan"] = plan.clone();
            }
            let body = serde_json::to_vec(&msg)?;
            frames.extend_from_slice(&((body.len() + 1) as u32).to_be_bytes());
            frames.push(b'F');
            frames.extend_from_slice(&body);
        }
        self.control.write_all(&frames).await?;
        Ok(id)
    }

    /// Wait for the answer to fork `id`, keeping anything else that arrives
    /// meanwhile for the next exec.
    pub async fn wait_forked(&mut self, id: u64) -> Result<Forked, SessionError> {
        loop {
            match self.items.recv().await {
                Some(ReplItem::Forked(f)) if f.id == id => return Ok(f),
                Some(ReplItem::Died(status)) => {
                    self.held.push_back(ReplItem::Died(status));
                    return Err(SessionError::DiedWhileForking);
                }
                Some(other) => self.held.push_back(other),
                None => return Err(SessionError::DiedWhileForking),
            }
        }
    }
}

#[allow(clippy::too_many_arguments)]
async fn pump(
    mut control: ControlReader,
    mut stdout: pipe::Receiver,
    mut stderr: pipe::Receiver,
    exited: oneshot::Receiver<ExitStatus>,
    tx: mpsc::Sender<ReplItem>,
    ready_tx: oneshot::Sender<Ready>,
    mut resync: Option<Vec<u8>>,
    journal: Arc<OnceLock<Journal>>,
) {
    let mut ready_tx = Some(ready_tx);
    // Bytes of the control stream read so far, to find our place in the
    // journal; unknown after a resync, or once the stream was garbage.
    let mut received = resync.is_none().then_some(0u64);
    let mut buf = BytesMut::with_capacity(64 * 1024);
    let mut out_buf = vec![0u8; 64 * 1024];
    let mut err_buf = vec![0u8; 64 * 1024];
    let (mut out_open, mut err_open) = (true, true);
    loop {
        tokio::select! {
            n = control.read_buf(&mut buf) => {
                match n {
                    Ok(0) | Err(_) => break,
                    Ok(n) => {
                        received = received.map(|r| r + n as u64);
                        if let Some(marker) = &resync {
                            let (found, saw_done) = skip_to(&mut buf, marker);
                            if saw_done {
                                // An exec's end, meant for the dead server:
                                // code was running (`resume` says so).
                                let _ = tx.send(ReplItem::Done(Done { id: 0, exit_code: 130, error: None })).await;
                            }
                            if !found {
                                continue;
                            }
                            resync = None;
                        }
                        while let Some((kind, payload)) = take_frame(&mut buf) {
                            if drain(&mut stdout, &mut stderr, &tx).await.is_err() {
                                return;
                            }
                            if kind == b'R' {
                                if let (Some(t), Ok(r)) = (ready_tx.take(), serde_json::from_slice::<Ready>(&payload)) {
                                    let _ = t.send(r);
                                }
                                continue;
                            }
                            let Some(item) = item_of(kind, payload) else { continue };
                            if tx.send(item).await.is_err() {
                                return;
                            }
                        }
                        if buf.len() > MAX_FRAME + 5 {
                            received = None;
                            break;
                        }
                    }
                }
            }
            n = stdout.read(&mut out_buf), if out_open => match n {
                Ok(0) | Err(_) => out_open = false,
                Ok(n) => if tx.send(ReplItem::Stdout(out_buf[..n].to_vec())).await.is_err() { return },
            },
            n = stderr.read(&mut err_buf), if err_open => match n {
                Ok(0) | Err(_) => err_open = false,
                Ok(n) => if tx.send(ReplItem::Stderr(err_buf[..n].to_vec())).await.is_err() { return },
            },
        }
    }
    // The control socket closed: the REPL is dead (or dying).
    let status = tokio::time::timeout(Duration::from_secs(5), exited).await.ok().and_then(|r| r.ok());
    // Output it held and never wrote, taken from its journal: only output,
    // never an exec's end or a fork's answer.
    if let (Some(received), Some(journal)) = (received, journal.get()) {
        buf.extend_from_slice(&journal.unsent(received));
        while let Some((kind, payload)) = take_frame(&mut buf) {
            if !matches!(kind, b'O' | b'E' | b'V' | b'M') {
                continue;
            }
            let Some(item) = item_of(kind, payload) else { continue };
            if tx.send(item).await.is_err() {
                return;
            }
        }
    }
    let _ = drain(&mut stdout, &mut stderr, &tx).await;
    let _ = tx.send(ReplItem::Died(status)).await;
}

/// The item a control frame from the REPL carries (`R` aside), if any.
fn item_of(kind: u8, payload: Vec<u8>) -> Option<ReplItem> {
    Some(match kind {
        b'O' => ReplItem::Stdout(payload),
        b'E' => ReplItem::Stderr(payload),
        b'V' | b'M' if payload.len() > MAX_BUNDLE => return None,
        b'V' => ReplItem::Result(serde_json::from_slice(&payload).ok()?),
        b'M' => ReplItem::Display(serde_json::from_slice(&payload).ok()?),
        b'D' => ReplItem::Done(serde_json::from_slice(&payload).ok()?),
        b'f' => ReplItem::Forked(serde_json::from_slice(&payload).ok()?),
        _ => return None,
    })
}

/// Read what `pipe` holds right now, without waiting: Some(n > 0) bytes,
/// or None when it is empty or closed. It reads the descriptor itself:
/// tokio's `try_read` answers WouldBlock until its reactor has noticed the
/// pipe became readable, which under load can be after the writer's exit
/// was reported, and output written just before an exit would be lost.
pub fn read_now(pipe: &pipe::Receiver, buf: &mut [u8]) -> Option<usize> {
    match rustix::io::read(std::os::fd::AsFd::as_fd(pipe), buf) {
        Ok(0) | Err(_) => None,
        Ok(n) => Some(n),
    }
}

/// Forward whatever the pipes hold right now, without waiting.
async fn drain(stdout: &mut pipe::Receiver, stderr: &mut pipe::Receiver, tx: &mpsc::Sender<ReplItem>) -> Result<(), ()> {
    let mut chunk = vec![0u8; 64 * 1024];
    for (pipe, is_out) in [(stdout, true), (stderr, false)] {
        loop {
            match read_now(pipe, &mut chunk) {
                None => break,
                Some(n) => {
                    let data = chunk[..n].to_vec();
                    let item = if is_out { ReplItem::Stdout(data) } else { ReplItem::Stderr(data) };
                    tx.send(item).await.map_err(|_| ())?;
                }
            }
        }
    }
    Ok(())
}

/// Drop what comes before the frame that starts with `marker` (after its
/// 4-byte length); false while it has not arrived yet (only a tail that
/// may be its beginning is kept).
/// Also says whether what it dropped held the end of another exec.
fn skip_to(buf: &mut BytesMut, marker: &[u8]) -> (bool, bool) {
    const ANY_DONE: &[u8] = b"D{\"id\":";
    let found = buf.windows(marker.len()).position(|w| w == marker).filter(|at| *at >= 4);
    let dropped = match found {
        Some(at) => at - 4,
        None => buf.len().saturating_sub(marker.len() + 4),
    };
    // Ends that start in what is dropped (they may reach into what is kept).
    let saw_done = buf.windows(ANY_DONE.len()).take(dropped).any(|w| w == ANY_DONE);
    buf.advance(dropped);
    (found.is_some(), saw_done)
}

/// The next complete frame (kind, payload), if `buf` holds one. The length
/// comes from the sandbox (its code can write to fd 3): an empty frame is
/// skipped (not taken as the end of what `buf` holds), and room is made for
/// at most `MAX_FRAME` (`pump` gives up on a longer one), not for the up to
/// 4 GiB a length may claim.
fn take_frame(buf: &mut BytesMut) -> Option<(u8, Vec<u8>)> {
    let len = loop {
        if buf.len() < 4 {
            return None;
        }
        match u32::from_be_bytes([buf[0], buf[1], buf[2], buf[3]]) as usize {
            0 => buf.advance(4),
            len => break len,
        }
    };
    if buf.len() < 4 + len {
        buf.reserve((4 + len).min(MAX_FRAME + 5) - buf.len().min(MAX_FRAME + 5));
        return None;
    }
    buf.advance(4);
    let kind = buf[0];
    let payload = buf[1..len].to_vec();
    buf.advance(len);
    Some((kind, payload))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn frame(kind: u8, payload: &[u8]) -> Vec<u8> {
        let mut f = ((payload.len() + 1) as u32).to_be_bytes().to_vec();
        f.push(kind);
        f.extend_from_slice(payload);
        f
    }

    #[test]
    fn resync_finds_the_probe_after_a_torn_frame() {
        let marker = b"D{\"id\":4503599627370497,".to_vec();
        // The tail of a frame the dead server half read, an old exec's end,
        // then the probe's answer and a frame after it.
        let mut stream = b"tail of a torn frame".to_vec();
        stream.extend(frame(b'D', br#"{"id":3,"exit_code":130,"error":null}"#));
        stream.extend(frame(b'D', br#"{"id":4503599627370497,"exit_code":0,"error":null}"#));
        stream.extend(frame(b'O', b"after"));
        // Fed in small pieces, as reads may come.
        let mut buf = BytesMut::new();
        let (mut found, mut saw_done) = (false, false);
        for piece in stream.chunks(7) {
            buf.extend_from_slice(piece);
            if !found {
                let (f, d) = skip_to(&mut buf, &marker);
                found = f;
                saw_done |= d;
            }
        }
        assert!(found && saw_done);
        let (kind, payload) = take_frame(&mut buf).unwrap();
        assert_eq!(kind, b'D');
        assert!(payload.starts_with(br#"{"id":4503599627370497,"#));
        assert_eq!(take_frame(&mut buf), Some((b'O', b"after".to_vec())));
    }

    #[test]
    fn resync_without_an_old_exec_says_nothing_ran() {
        let marker = b"D{\"id\":77,".to_vec();
        let mut buf = BytesMut::from(&frame(b'D', br#"{"id":77,"exit_code":0,"error":null}"#)[..]);
        assert_eq!(skip_to(&mut buf, &marker), (true, false));
        assert_eq!(take_frame(&mut buf).map(|f| f.0), Some(b'D'));
    }

    // Properties of the framing (docs/reliability.md#fuzzing): the REPL's
    // fd 3 is writable by the sandbox's code, so any bytes may arrive, cut
    // anywhere by the reads.

    use proptest::prelude::*;
    use proptest::sample::Index;

    /// `stream` cut at `cuts` (positions taken modulo its length), in order.
    fn pieces(stream: &[u8], cuts: &[Index]) -> Vec<Vec<u8>> {
        let mut at: Vec<usize> = cuts.iter().map(|c| c.index(stream.len() + 1)).collect();
        at.push(0);
        at.push(stream.len());
        at.sort_unstable();
        at.windows(2).map(|w| stream[w[0]..w[1]].to_vec()).collect()
    }

    /// Feed the pieces as `pump` does, taking every complete frame after each.
    fn parse_pieces(pieces: &[Vec<u8>]) -> (Vec<(u8, Vec<u8>)>, BytesMut) {
        let mut buf = BytesMut::new();
        let mut frames = Vec::new();
        for piece in pieces {
            buf.extend_from_slice(piece);
            while let Some(frame) = take_frame(&mut buf) {
                frames.push(frame);
            }
            // A declared length never reserves more than a frame may be.
            assert!(buf.capacity() <= 2 * (MAX_FRAME + 5) + 2 * pieces.iter().map(Vec::len).sum::<usize>());
        }
        (frames, buf)
    }

    /// The framing read in one go: what the pieces must parse to.
    fn model(mut s: &[u8]) -> Vec<(u8, Vec<u8>)> {
        let mut out = Vec::new();
        while s.len() >= 4 {
            let len = u32::from_be_bytes([s[0], s[1], s[2], s[3]]) as usize;
            if s.len() - 4 < len {
                break;
            }
            if len > 0 {
                out.push((s[4], s[5..4 + len].to_vec()));
            }
            s = &s[4 + len..];
        }
        out
    }

    /// Small lengths often, so that random bytes hold complete frames.
    fn noisy_stream() -> impl Strategy<Value = Vec<u8>> {
        let chunk = prop_oneof![
            proptest::collection::vec(any::<u8>(), 0..64),
            (0u32..48).prop_map(|n| n.to_be_bytes().to_vec()),
            (any::<u8>(), proptest::collection::vec(any::<u8>(), 0..48)).prop_map(|(k, p)| frame(k, &p)),
        ];
        proptest::collection::vec(chunk, 0..12).prop_map(|c| c.concat())
    }

    proptest! {
        #![proptest_config(ProptestConfig { cases: 256, ..ProptestConfig::default() })]

        #[test]
        fn any_bytes_in_any_pieces_parse_as_in_one_go(stream in noisy_stream(), cuts in proptest::collection::vec(any::<Index>(), 0..8)) {
            let (frames, rest) = parse_pieces(&pieces(&stream, &cuts));
            prop_assert_eq!(&frames, &model(&stream));
            let taken: usize = frames.iter().map(|(_, p)| 5 + p.len()).sum();
            prop_assert!(taken + rest.len() <= stream.len());
        }

        #[test]
        fn well_formed_frames_come_back_exactly(
            sent in proptest::collection::vec((any::<u8>(), proptest::collection::vec(any::<u8>(), 0..300)), 0..16),
            cuts in proptest::collection::vec(any::<Index>(), 0..16),
        ) {
            let stream: Vec<u8> = sent.iter().flat_map(|(k, p)| frame(*k, p)).collect();
            let (frames, rest) = parse_pieces(&pieces(&stream, &cuts));
            prop_assert_eq!(frames, sent);
            prop_assert!(rest.is_empty());
        }

        #[test]
        fn resync_finds_the_probe_anywhere(
            garbage in proptest::collection::vec(prop_oneof![
                proptest::collection::vec(any::<u8>(), 0..64),
                Just(frame(b'D', br#"{"id":3,"exit_code":130,"error":null}"#)),
                Just(br#"D{"id":4503599627370497"#.to_vec()),
            ], 0..8).prop_map(|c| c.concat()),
            cuts in proptest::collection::vec(any::<Index>(), 0..12),
        ) {
            let marker = b"D{\"id\":4503599627370497,".to_vec();
            let probe = frame(b'D', br#"{"id":4503599627370497,"exit_code":0,"error":null}"#);
            let mut stream = garbage.clone();
            stream.extend(&probe);
            stream.extend(frame(b'O', b"after"));
            // The garbage holds no copy of the marker itself.
            prop_assume!(stream.windows(marker.len()).position(|w| w == marker) == Some(garbage.len() + 4));
            let expect_done = stream.windows(7).take(garbage.len()).any(|w| w == b"D{\"id\":");
            let mut buf = BytesMut::new();
            let (mut found, mut saw_done) = (false, false);
            let mut frames = Vec::new();
            for piece in pieces(&stream, &cuts) {
                buf.extend_from_slice(&piece);
                if !found {
                    let (f, d) = skip_to(&mut buf, &marker);
                    found = f;
                    saw_done |= d;
                    if !found {
                        // Only a tail that may start the probe is kept.
                        prop_assert!(buf.len() <= marker.len() + 4);
                        continue;
                    }
                }
                while let Some(f) = take_frame(&mut buf) {
                    frames.push(f);
                }
            }
            prop_assert!(found);
            prop_assert_eq!(saw_done, expect_done);
            prop_assert_eq!(frames, vec![(b'D', probe[5..].to_vec()), (b'O', b"after".to_vec())]);
        }
    }
}
