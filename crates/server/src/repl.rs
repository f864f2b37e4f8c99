//! The server's side of one REPL process: frames it sends (docs/repl-protocol.md),
//! and one pump task that merges the control socket with the raw stdout/stderr
//! pipes into a single ordered stream of `ReplItem`s. Before it forwards a
//! control frame it drains both pipes, so raw output written before a
//! Python-level write is delivered before it.

use std::os::fd::{AsFd, OwnedFd};
use std::time::Duration;

use bytes::{Buf, BytesMut};
use jail::{ExitStatus, ReplProcess};
use serde::Deserialize;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::unix::pipe;
use tokio::sync::{mpsc, oneshot};

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
    control: tokio::net::unix::OwnedWriteHalf,
    items: mpsc::Receiver<ReplItem>,
    /// Items read while waiting for something else (a fork's answer),
    /// handed out first.
    held: std::collections::VecDeque<ReplItem>,
    /// None for a forked REPL until the engine adopted it.
    pidfd: Option<OwnedFd>,
    pub host_pid: i32,
    next_id: u64,
    pub ready: Ready,
}

impl ReplSession {
    /// Take over a freshly spawned REPL and wait until it is ready.
    pub async fn start(process: ReplProcess) -> Result<ReplSession, String> {
        let (control, pidfd, host_pid) = (process.control, process.pidfd, process.host_pid);
        let mut session = Self::begin(control, process.stdout, process.stderr, process.exited).await.map_err(|said| {
            let _ = jail::sys::pidfd_send_signal(pidfd.as_fd(), nix::sys::signal::Signal::SIGKILL);
            format!("the Python REPL did not start: {said}")
        })?;
        session.pidfd = Some(pidfd);
        session.host_pid = host_pid;
        Ok(session)
    }

    /// Take over the server's ends of a REPL that a fork is making, and wait
    /// for its ready frame; `adopted` supplies its pidfd afterwards.
    pub async fn start_forked(
        control: tokio::net::UnixStream,
        stdout: pipe::Receiver,
        stderr: pipe::Receiver,
        exited: oneshot::Receiver<ExitStatus>,
    ) -> Result<ReplSession, String> {
        Self::begin(control, stdout, stderr, exited).await.map_err(|said| format!("the forked Python REPL did not start: {said}"))
    }

    pub fn adopted(&mut self, host_pid: i32, pidfd: OwnedFd) {
        self.host_pid = host_pid;
        self.pidfd = Some(pidfd);
    }

    /// Wait for the ready frame; on failure, what the process said.
    async fn begin(
        control: tokio::net::UnixStream,
        stdout: pipe::Receiver,
        stderr: pipe::Receiver,
        exited: oneshot::Receiver<ExitStatus>,
    ) -> Result<ReplSession, String> {
        let (read, write) = control.into_split();
        let (tx, mut rx) = mpsc::channel(256);
        let (ready_tx, ready_rx) = oneshot::channel();
        tokio::spawn(pump(read, stdout, stderr, exited, tx, ready_tx));
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
                return Err(String::from_utf8_lossy(&said).trim().to_string());
            }
        };
        Ok(ReplSession { control: write, items: rx, held: Default::default(), pidfd: None, host_pid: 0, next_id: 1, ready })
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

    /// Ask the REPL to fork itself once per child: one `F` frame per child,
    /// carrying that child's descriptors (docs/repl-protocol.md). Returns
    /// the fork id its `Forked` answer carries.
    pub async fn send_fork(&mut self, plan: &serde_json::Value, children: &[Vec<std::os::fd::RawFd>]) -> std::io::Result<u64> {
        use std::os::fd::AsRawFd;
        let id = self.next_id;
        self.next_id += 1;
        for (index, fds) in children.iter().enumerate() {
            let mut msg = serde_json::json!({"id": id, "index": index, "count": children.len(), "fds": fds.len()});
            if index == 0 {
                msg["plan"] = plan.clone();
            }
            let body = serde_json::to_vec(&msg)?;
            let mut frame = Vec::with_capacity(body.len() + 5);
            frame.extend_from_slice(&((body.len() + 1) as u32).to_be_bytes());
            frame.push(b'F');
            frame.extend_from_slice(&body);
            let stream: &tokio::net::UnixStream = self.control.as_ref();
            let raw = stream.as_raw_fd();
            // The descriptors ride on the frame's first byte; the rest of a
            // large frame follows as plain bytes.
            let mut sent = 0;
            while sent == 0 {
                stream.writable().await?;
                match stream.try_io(tokio::io::Interest::WRITABLE, || {
                    let iov = [std::io::IoSlice::new(&frame)];
                    let cmsg = [nix::sys::socket::ControlMessage::ScmRights(fds)];
                    nix::sys::socket::sendmsg::<()>(raw, &iov, &cmsg, nix::sys::socket::MsgFlags::MSG_NOSIGNAL, None).map_err(std::io::Error::from)
                }) {
                    Ok(n) => sent = n,
                    Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => continue,
                    Err(e) => return Err(e),
                }
            }
            if sent < frame.len() {
                self.control.write_all(&frame[sent..]).await?;
            }
        }
        Ok(id)
    }

    /// Wait for the answer to fork `id`, keeping anything else that arrives
    /// meanwhile for the next exec.
    pub async fn wait_forked(&mut self, id: u64) -> Result<Forked, String> {
        loop {
            match self.items.recv().await {
                Some(ReplItem::Forked(f)) if f.id == id => return Ok(f),
                Some(ReplItem::Died(status)) => {
                    self.held.push_back(ReplItem::Died(status));
                    return Err("the Python process died while forking".into());
                }
                Some(other) => self.held.push_back(other),
                None => return Err("the Python process died while forking".into()),
            }
        }
    }
}

async fn pump(
    mut control: tokio::net::unix::OwnedReadHalf,
    mut stdout: pipe::Receiver,
    mut stderr: pipe::Receiver,
    exited: oneshot::Receiver<ExitStatus>,
    tx: mpsc::Sender<ReplItem>,
    ready_tx: oneshot::Sender<Ready>,
) {
    let mut ready_tx = Some(ready_tx);
    let mut buf = BytesMut::with_capacity(64 * 1024);
    let mut out_buf = vec![0u8; 64 * 1024];
    let mut err_buf = vec![0u8; 64 * 1024];
    let (mut out_open, mut err_open) = (true, true);
    loop {
        tokio::select! {
            n = control.read_buf(&mut buf) => {
                match n {
                    Ok(0) | Err(_) => break,
                    Ok(_) => {
                        while let Some((kind, payload)) = take_frame(&mut buf) {
                            if drain(&mut stdout, &mut stderr, &tx).await.is_err() {
                                return;
                            }
                            let item = match kind {
                                b'O' => ReplItem::Stdout(payload),
                                b'E' => ReplItem::Stderr(payload),
                                b'V' | b'M' if payload.len() > MAX_BUNDLE => continue,
                                b'V' => match serde_json::from_slice(&payload) { Ok(v) => ReplItem::Result(v), Err(_) => continue },
                                b'M' => match serde_json::from_slice(&payload) { Ok(v) => ReplItem::Display(v), Err(_) => continue },
                                b'D' => match serde_json::from_slice(&payload) { Ok(d) => ReplItem::Done(d), Err(_) => continue },
                                b'f' => match serde_json::from_slice(&payload) { Ok(f) => ReplItem::Forked(f), Err(_) => continue },
                                b'R' => {
                                    if let (Some(t), Ok(r)) = (ready_tx.take(), serde_json::from_slice::<Ready>(&payload)) {
                                        let _ = t.send(r);
                                    }
                                    continue;
                                }
                                _ => continue,
                            };
                            if tx.send(item).await.is_err() {
                                return;
                            }
                        }
                        if buf.len() > MAX_FRAME + 5 {
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
    let _ = drain(&mut stdout, &mut stderr, &tx).await;
    let _ = tx.send(ReplItem::Died(status)).await;
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

fn take_frame(buf: &mut BytesMut) -> Option<(u8, Vec<u8>)> {
    if buf.len() < 4 {
        return None;
    }
    let len = u32::from_be_bytes([buf[0], buf[1], buf[2], buf[3]]) as usize;
    if len == 0 {
        buf.advance(4);
        return None;
    }
    if buf.len() < 4 + len {
        buf.reserve(4 + len - buf.len());
        return None;
    }
    buf.advance(4);
    let kind = buf[0];
    let payload = buf[1..len].to_vec();
    buf.advance(len);
    Some((kind, payload))
}
