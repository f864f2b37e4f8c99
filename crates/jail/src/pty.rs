//! Terminals for PTY sessions, allocated on the sandbox's own devpts
//! instance (so `tty` inside the sandbox names them, and they count against
//! nothing of the host's).

use std::os::fd::OwnedFd;

use rustix::fs::{Mode, OFlags, ResolveFlags};

use crate::error::{Error, Result};
use crate::fs::SandboxFs;

/// A terminal's size in character cells.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Size {
    pub cols: u16,
    pub rows: u16,
}

/// Both ends of a new terminal.
pub struct Terminal {
    /// Non-blocking, for the server.
    pub master: OwnedFd,
    /// For the command's stdio.
    pub slave: OwnedFd,
}

/// devpts' `statfs` magic number.
const DEVPTS_SUPER_MAGIC: i64 = 0x1cd1;
/// Group `tty` in Debian (owner group of terminals).
const TTY_GID: u32 = 5;

/// Set a terminal's size (the kernel sends SIGWINCH to its foreground group).
pub fn resize(master: &OwnedFd, size: Size) -> Result<()> {
    let ws = rustix::termios::Winsize { ws_col: size.cols, ws_row: size.rows, ws_xpixel: 0, ws_ypixel: 0 };
    rustix::termios::tcsetwinsize(master, ws).map_err(|e| Error::io("set the terminal size", e.into()))
}

impl SandboxFs {
    /// A new terminal from the sandbox's `/dev/pts/ptmx`, its slave owned by
    /// the sandbox's root and group tty, sized `size`.
    pub fn open_terminal(&self, size: Size) -> Result<Terminal> {
        // Not NO_XDEV: ptmx lives on the devpts mount, which is the point.
        let resolve = ResolveFlags::IN_ROOT | ResolveFlags::NO_MAGICLINKS | ResolveFlags::NO_SYMLINKS;
        let flags = OFlags::RDWR | OFlags::NOCTTY | OFlags::CLOEXEC | OFlags::NONBLOCK;
        let master = rustix::fs::openat2(self.root(), "dev/pts/ptmx", flags, Mode::empty(), resolve)
            .map_err(|e| Error::io("open the sandbox's /dev/pts/ptmx", e.into()))?;
        // Whatever sits at that path must really be a devpts multiplexer.
        let fs = rustix::fs::fstatfs(&master).map_err(|e| Error::io("statfs ptmx", e.into()))?;
        if fs.f_type as i64 != DEVPTS_SUPER_MAGIC {
            return Err(Error::Invalid("the sandbox's /dev/pts/ptmx is not on devpts".into()));
        }
        rustix::pty::unlockpt(&master).map_err(|e| Error::io("unlockpt", e.into()))?;
        let slave =
            rustix::pty::ioctl_tiocgptpeer(&master, rustix::pty::OpenptFlags::RDWR | rustix::pty::OpenptFlags::NOCTTY | rustix::pty::OpenptFlags::CLOEXEC)
                .map_err(|e| Error::io("open the terminal's peer", e.into()))?;
        let (uid, gid) = self.root_ids();
        rustix::fs::fchown(&slave, Some(rustix::fs::Uid::from_raw(uid)), Some(rustix::fs::Gid::from_raw(gid + TTY_GID)))
            .and_then(|_| rustix::fs::fchmod(&slave, Mode::from_raw_mode(0o620)))
            .map_err(|e| Error::io("give the terminal to the sandbox's root", e.into()))?;
        resize(&master, size)?;
        Ok(Terminal { master, slave })
    }
}
