//! `ShimHandle`: the server's connection to one family's shim. Requests go
//! out with an id and their reply comes back through a oneshot; events
//! (REPL and command exits) are routed to whoever waits for them. When the
//! shim goes away, everything still waiting fails at once.

use std::collections::HashMap;
use std::os::fd::{AsFd, AsRawFd, OwnedFd};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex as StdMutex};
use std::time::Duration;

use tokio::io::unix::AsyncFd;
use tokio::sync::{oneshot, Mutex};

use crate::channel;
use crate::error::{Error, Result};
use crate::shim::messages::*;

type Pending = HashMap<u64, oneshot::Sender<(Reply, Vec<OwnedFd>)>>;

/// A request sent to the shim whose reply has not been read yet.
pub(crate) struct Replying(oneshot::Receiver<(Reply, Vec<OwnedFd>)>);

impl Replying {
    pub(crate) async fn reply(self) -> Result<(Reply, Vec<OwnedFd>)> {
        let (reply, fds) = self.0.await.map_err(|_| Error::SupervisorGone)?;
        match reply {
            Reply::Failed { error } => Err(Error::Failed(error)),
            r => Ok((r, fds)),
        }
    }
}

/// Who waits for a command's start and exit.
pub(crate) struct CommandWaiters {
    pub(crate) started: Option<oneshot::Sender<()>>,
    pub(crate) exited: oneshot::Sender<ExitStatus>,
}

/// How a family's supervisor is started: its binary, and the cgroup it
/// runs in (none where that cgroup could not be made: it runs where the
/// server does, as before).
#[derive(Debug, Clone)]
pub(crate) struct ShimLauncher {
    pub(crate) exe: PathBuf,
    pub(crate) group: Option<crate::cgroup::SupervisorGroup>,
}

impl ShimLauncher {
    /// Move a supervisor into the group. Not fatal: it only decides how
    /// soon the supervisor runs under load.
    pub(crate) fn place(&self, pid: u32) {
        if let Some(group) = &self.group {
            if let Err(e) = group.place(pid) {
                tracing::warn!(pid, err = %e, "could not move a family's supervisor into its cgroup");
            }
        }
    }
}

/// The server's connection to one family's shim.
pub(crate) struct ShimHandle {
    sock: AsyncFd<OwnedFd>,
    child: StdMutex<Option<std::process::Child>>,
    send_lock: Mutex<()>,
    next_req: std::sync::atomic::AtomicU64,
    pending: Mutex<Pending>,
    pub(crate) repl_exits: Mutex<HashMap<String, oneshot::Sender<ExitStatus>>>,
    pub(crate) commands: Mutex<HashMap<(String, u64), CommandWaiters>>,
    /// Members whose network gate is closed → who starts their way out
    /// when the shim says one wants it (`Sandbox::hold_network`).
    pub(crate) network_wanted: Mutex<HashMap<String, oneshot::Sender<()>>>,
    closed: std::sync::atomic::AtomicBool,
    pub(crate) range: crate::ids::IdRange,
    /// Host pid of a shim we did not start (adopted after a restart).
    adopted_pid: Option<i32>,
    /// The shim's `messages::PROTOCOL`: ours for a shim we started; an
    /// adopted one's says so in `Reply::Members` (`set_protocol`).
    protocol: std::sync::atomic::AtomicU32,
}

impl ShimHandle {
    fn new(sock: AsyncFd<OwnedFd>, child: Option<std::process::Child>, range: crate::ids::IdRange, adopted_pid: Option<i32>) -> Arc<ShimHandle> {
        // A shim we did not start is the oldest until it says its number.
        let protocol = if child.is_some() { crate::shim::messages::PROTOCOL } else { 1 };
        Arc::new(ShimHandle {
            sock,
            child: StdMutex::new(child),
            send_lock: Mutex::new(()),
            next_req: std::sync::atomic::AtomicU64::new(1),
            pending: Mutex::new(HashMap::new()),
            repl_exits: Mutex::new(HashMap::new()),
            commands: Mutex::new(HashMap::new()),
            network_wanted: Mutex::new(HashMap::new()),
            closed: std::sync::atomic::AtomicBool::new(false),
            range,
            adopted_pid,
            protocol: std::sync::atomic::AtomicU32::new(protocol),
        })
    }

    /// Host pid of a shim we did not start (adopted after a restart).
    pub(crate) fn adopted_pid(&self) -> Option<i32> {
        self.adopted_pid
    }

    pub(crate) fn protocol(&self) -> u32 {
        self.protocol.load(std::sync::atomic::Ordering::Relaxed)
    }

    pub(crate) fn set_protocol(&self, protocol: u32) {
        self.protocol.store(protocol, std::sync::atomic::Ordering::Relaxed)
    }

    pub(crate) async fn start(launcher: &ShimLauncher, config: &ShimConfig, range: crate::ids::IdRange) -> Result<Arc<ShimHandle>> {
        use std::os::unix::process::CommandExt;
        let (ours, theirs) = channel::pair()?;
        let theirs_raw = theirs.as_raw_fd();
        let json = serde_json::to_string(config).map_err(|e| Error::Protocol(e.to_string()))?;
        let mut cmd = std::process::Command::new(&launcher.exe);
        cmd.arg("__shim").arg(json).stdin(std::process::Stdio::null());
        // SAFETY: only async-signal-safe calls (dup2/fcntl) in the child.
        unsafe {
            cmd.pre_exec(move || {
                crate::sys::dup_to(theirs_raw, crate::shim::SHIM_SOCKET_FD).map_err(std::io::Error::from)?;
                Ok(())
            });
        }
        let child = cmd.spawn().map_err(|e| Error::io("start sandbox supervisor", e))?;
        // Before it builds anything: what it forks starts in the group too.
        launcher.place(child.id());
        drop(theirs);
        nix::fcntl::fcntl(&ours, nix::fcntl::FcntlArg::F_SETFL(nix::fcntl::OFlag::O_NONBLOCK)).map_err(|e| Error::sys("nonblocking", e))?;
        // SAFETY: the AsyncFd owns `ours`, so the descriptor stays open and
        // the same for the AsyncFd's whole life.
        let sock = unsafe { AsyncFd::register(ours) }.map_err(|e| Error::io("register shim socket", e.into_parts().1))?;
        let handle = Self::new(sock, Some(child), range, None);
        // The first message says whether the family came up.
        let first = tokio::time::timeout(Duration::from_secs(30), handle.recv()).await;
        match first {
            Ok(Ok(Some((ShimMessage::Ready, _)))) => {}
            Ok(Ok(Some((ShimMessage::Reply { reply: Reply::Failed { error }, .. }, _)))) => {
                handle.shutdown().await;
                return Err(Error::Failed(error));
            }
            Ok(Ok(other)) => {
                handle.shutdown().await;
                return Err(Error::Died(format!("supervisor did not start: {:?}", other.map(|m| m.0))));
            }
            Ok(Err(e)) => {
                handle.shutdown().await;
                return Err(e);
            }
            Err(_) => {
                handle.shutdown().await;
                return Err(Error::Died("supervisor did not start within 30 s".into()));
            }
        }
        tokio::spawn(Arc::clone(&handle).read_loop());
        Ok(handle)
    }

    /// Connect to the shim of a family a previous server left (waiting on
    /// its adoption socket, see `ShimConfig::orphan_grace_ms`).
    pub(crate) async fn connect(socket: &Path, range: crate::ids::IdRange) -> Result<Arc<ShimHandle>> {
        let fd = channel::connect(socket)?;
        let pid = channel::peer_pid(fd.as_fd());
        // SAFETY: the AsyncFd owns `fd` for its whole life.
        let sock = unsafe { AsyncFd::register(fd) }.map_err(|e| Error::io("register shim socket", e.into_parts().1))?;
        let handle = Self::new(sock, None, range, pid);
        tokio::spawn(Arc::clone(&handle).read_loop());
        Ok(handle)
    }

    pub(crate) fn alive(&self) -> bool {
        !self.closed.load(std::sync::atomic::Ordering::Relaxed)
    }

    async fn recv(&self) -> Result<Option<(ShimMessage, Vec<OwnedFd>)>> {
        loop {
            let mut guard = self.sock.readable().await.map_err(|e| Error::io("wait for shim", e))?;
            match channel::recv::<ShimMessage>(self.sock.get_ref().as_fd()) {
                Ok(Some(r)) => return Ok(Some((r.msg, r.fds))),
                Ok(None) => return Ok(None),
                Err(Error::Sys { source: nix::errno::Errno::EAGAIN, .. }) => guard.clear_ready(),
                Err(e) => return Err(e),
            }
        }
    }

    async fn read_loop(self: Arc<Self>) {
        loop {
            match self.recv().await {
                Ok(Some((ShimMessage::Reply { req, reply }, fds))) => {
                    if let Some(tx) = self.pending.lock().await.remove(&req) {
                        let _ = tx.send((reply, fds));
                    }
                }
                Ok(Some((ShimMessage::Event(ev), _))) => Arc::clone(&self).on_event(ev).await,
                Ok(Some((ShimMessage::Ready, _))) => {}
                Ok(None) | Err(_) => break,
            }
        }
        self.closed.store(true, std::sync::atomic::Ordering::Relaxed);
        // Fail everything still waiting on this shim.
        self.pending.lock().await.clear();
        self.repl_exits.lock().await.clear();
        self.commands.lock().await.clear();
        self.network_wanted.lock().await.clear();
    }

    async fn on_event(self: Arc<Self>, ev: ShimEvent) {
        match ev {
            ShimEvent::ReplExited { member, status, .. } => {
                // An unknown status drops the sender: the waiter sees None.
                if let (Some(tx), Some(status)) = (self.repl_exits.lock().await.remove(&member), status) {
                    let _ = tx.send(status);
                }
            }
            ShimEvent::CommandStarted { member, id } => {
                if let Some(w) = self.commands.lock().await.get_mut(&(member, id)) {
                    if let Some(tx) = w.started.take() {
                        let _ = tx.send(());
                    }
                }
            }
            ShimEvent::CommandExited { member, id, status } => {
                if let Some(w) = self.commands.lock().await.remove(&(member, id)) {
                    let _ = w.exited.send(status);
                }
            }
            ShimEvent::InitExited { member } => {
                // Commands it ran are gone with it; a family's other members
                // (warm-pool sandboxes share one shim) keep theirs.
                self.commands.lock().await.retain(|(m, _), _| *m != member);
            }
            ShimEvent::NetworkWanted { member } => {
                let waiter = self.network_wanted.lock().await.remove(&member);
                if waiter.is_none_or(|tx| tx.send(()).is_err()) {
                    // Nobody will start its way out: let its sockets
                    // through rather than leave them waiting (off this
                    // loop, which must read the answer).
                    tokio::spawn(async move {
                        let _ = self.call(Request::OpenNetwork { member }, &[]).await;
                    });
                }
            }
        }
    }

    pub(crate) async fn call(&self, request: Request, fds: &[i32]) -> Result<(Reply, Vec<OwnedFd>)> {
        self.send(request, fds).await?.reply().await
    }

    /// Send `request`; its reply comes through what this returns. The
    /// shim reads requests in the order they were sent.
    pub(crate) async fn send(&self, request: Request, fds: &[i32]) -> Result<Replying> {
        if !self.alive() {
            return Err(Error::SupervisorGone);
        }
        let req = self.next_req.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let (tx, rx) = oneshot::channel();
        self.pending.lock().await.insert(req, tx);
        let _g = self.send_lock.lock().await;
        let env = Envelope { req, request };
        loop {
            let mut guard = self.sock.writable().await.map_err(|e| Error::io("wait for shim", e))?;
            match channel::send(self.sock.get_ref().as_fd(), &env, fds) {
                Ok(()) => return Ok(Replying(rx)),
                Err(Error::Sys { source: nix::errno::Errno::EAGAIN, .. }) => guard.clear_ready(),
                Err(e) => {
                    self.pending.lock().await.remove(&req);
                    return Err(e);
                }
            }
        }
    }

    /// Stop the shim: `Shutdown` tells it to exit (closing the socket
    /// without it would leave the family waiting for a new server); its
    /// reaper dies with it and takes the family's processes along.
    pub(crate) async fn shutdown(&self) {
        if !self.closed.swap(true, std::sync::atomic::Ordering::Relaxed) {
            let _g = self.send_lock.lock().await;
            let bye = Envelope { req: 0, request: Request::Shutdown };
            let _ = channel::send(self.sock.get_ref().as_fd(), &bye, &[]);
        }
        let _ = nix::sys::socket::shutdown(self.sock.get_ref().as_raw_fd(), nix::sys::socket::Shutdown::Both);
        if let Some(pid) = self.adopted_pid {
            // Not our child: wait (briefly) for it to be gone, so its id
            // range is free when we release it.
            for _ in 0..500 {
                if nix::sys::signal::kill(nix::unistd::Pid::from_raw(pid), None).is_err() {
                    break;
                }
                tokio::time::sleep(Duration::from_millis(2)).await;
            }
        }
        let child = self.child.lock().ok().and_then(|mut c| c.take());
        if let Some(mut child) = child {
            let _ = tokio::task::spawn_blocking(move || {
                for _ in 0..500 {
                    if let Ok(Some(_)) = child.try_wait() {
                        return;
                    }
                    std::thread::sleep(Duration::from_millis(2));
                }
                let _ = child.kill();
                let _ = child.wait();
            })
            .await;
        }
    }
}
