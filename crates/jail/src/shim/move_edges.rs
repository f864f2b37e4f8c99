//! A restored solo member's edges moved into its own network namespace.
//!
//! criu hands a restored tree new edges (`--inherit-fd`) that the shim made
//! before the tree's network namespace existed, so in the host's. criu
//! finds a unix socket only in the namespaces of the tree it dumps, so a
//! second dump would refuse those: right after the restore, init's channel
//! and the REPL's control socket move to sockets made in the member's own
//! namespace (the output pipes belong to no namespace and stay), and init
//! executes itself afresh (`init::renew` says why).

use std::io::{IoSlice, Read};
use std::os::fd::{AsFd, AsRawFd, OwnedFd};
use std::os::unix::net::UnixStream;
use std::time::Duration;

use nix::sched::{setns, CloneFlags};
use nix::sys::socket::{sendmsg, ControlMessage, MsgFlags};

use super::messages::{InitMessage, InitRequest};
use crate::channel;
use crate::error::{Error, Result};

/// How long the restored REPL may take to take its new control socket.
const REPL_MOVE_TIMEOUT: Duration = Duration::from_secs(10);
/// The REPL's move frame and its answer (docs/repl-protocol.md).
const MOVE_FRAME: u8 = b'C';
const MOVED_FRAME: u8 = b'c';

/// Run `make` with the shim inside `netns` (the shim is single-threaded,
/// so nothing else runs there meanwhile), then come back.
pub fn in_netns<T>(netns: &OwnedFd, make: impl FnOnce() -> Result<T>) -> Result<T> {
    let own = std::fs::File::open("/proc/self/ns/net").map_err(|e| Error::io("open own netns", e))?;
    setns(netns, CloneFlags::CLONE_NEWNET).map_err(|e| Error::sys("enter the new netns", e))?;
    let made = make();
    setns(&own, CloneFlags::CLONE_NEWNET).map_err(|e| Error::sys("return to own netns", e))?;
    made
}

/// Give init a channel made in `netns` and have it execute itself afresh
/// (`InitRequest::Renew`); the old channel is closed once init said it
/// moved (nothing comes on it after that).
pub fn renew_init(netns: &OwnedFd, old: OwnedFd) -> Result<OwnedFd> {
    let (ours, theirs) = in_netns(netns, channel::pair)?;
    channel::send(old.as_fd(), &InitRequest::Renew, &[theirs.as_raw_fd()])?;
    drop(theirs);
    let died = || Error::Died("the restored init died".into());
    loop {
        match channel::recv::<InitMessage>(old.as_fd())?.ok_or_else(died)?.msg {
            InitMessage::ChannelMoved => break,
            // Nothing was asked of the restored init yet: whatever it says
            // before it moves (a dumped command's end) has no one waiting.
            other => tracing::debug!(?other, "restored init spoke before moving its channel"),
        }
    }
    drop(old);
    match channel::recv::<InitMessage>(ours.as_fd())?.ok_or_else(died)?.msg {
        InitMessage::Renewed => Ok(ours),
        InitMessage::SetupFailed { error } => Err(Error::Setup(error)),
        other => Err(Error::Protocol(format!("expected the renewed init, got {other:?}"))),
    }
}

/// Give the REPL a control socket made in `netns`: a `C` frame carrying
/// it, answered by a `c` frame, the first thing on the new socket.
pub fn move_repl_control(netns: &OwnedFd, old: UnixStream) -> Result<UnixStream> {
    let (mut ours, theirs) = in_netns(netns, || UnixStream::pair().map_err(|e| Error::io("socketpair", e)))?;
    let frame = repl_frame(MOVE_FRAME, b"{}");
    let fds = [theirs.as_raw_fd()];
    sendmsg::<()>(old.as_raw_fd(), &[IoSlice::new(&frame)], &[ControlMessage::ScmRights(&fds)], MsgFlags::MSG_NOSIGNAL, None)
        .map_err(|e| Error::sys("send the REPL its new control socket", e))?;
    drop(theirs);
    ours.set_read_timeout(Some(REPL_MOVE_TIMEOUT)).map_err(|e| Error::io("control socket timeout", e))?;
    let mut head = [0u8; 5];
    ours.read_exact(&mut head).map_err(|e| Error::io("wait for the restored REPL to move its control socket", e))?;
    let len = u32::from_be_bytes([head[0], head[1], head[2], head[3]]) as usize;
    if head[4] != MOVED_FRAME || !(1..=64).contains(&len) {
        return Err(Error::Protocol(format!("the restored REPL answered its move with {head:?}")));
    }
    let mut rest = vec![0u8; len - 1];
    ours.read_exact(&mut rest).map_err(|e| Error::io("read the REPL's move answer", e))?;
    ours.set_read_timeout(None).map_err(|e| Error::io("control socket timeout", e))?;
    // The old socket is dropped only now: the REPL wrote nothing more to it.
    drop(old);
    Ok(ours)
}

/// One REPL protocol frame: length (kind + payload, big-endian), kind, payload.
fn repl_frame(kind: u8, payload: &[u8]) -> Vec<u8> {
    let mut frame = ((payload.len() + 1) as u32).to_be_bytes().to_vec();
    frame.push(kind);
    frame.extend_from_slice(payload);
    frame
}
