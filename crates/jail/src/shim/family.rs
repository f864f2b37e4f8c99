//! A family: one user namespace (uid 0 inside ↔ an unprivileged host range)
//! and one pid namespace whose PID 1 (the reaper) lives as long as the shim
//! and reports every death in the family to it.

use std::fs;
use std::io::Write;
use std::os::fd::{AsFd, AsRawFd, OwnedFd};
use std::path::{Path, PathBuf};

use nix::sys::wait::{waitpid, WaitStatus};
use nix::unistd::{pipe, read, Pid};

use super::messages::ExitStatus;
use crate::error::{Error, Result};
use crate::sys::{self, Forked};

pub struct Family {
    reaper: Pid,
    pub userns: OwnedFd,
    pub pidns: OwnedFd,
    /// Read end of the reaper's death reports (12-byte records).
    pub deaths: OwnedFd,
    /// The template, id-mapped into the family, mounted read-only here.
    pub lower: PathBuf,
}

/// A death the reaper saw: pid in the family's pid namespace.
pub struct Death {
    pub pid: i32,
    pub status: ExitStatus,
}

impl Family {
    pub fn create(id_base: u32, id_count: u32, template: &Path, run_dir: &Path) -> Result<Family> {
        let (go_r, go_w) = pipe().map_err(|e| Error::sys("pipe", e))?;
        let (dead_r, dead_w) = pipe().map_err(|e| Error::sys("pipe", e))?;
        // SAFETY: the shim is single-threaded.
        match unsafe { sys::fork_with(libc::CLONE_NEWUSER | libc::CLONE_NEWPID) }.map_err(|e| Error::sys("clone family", e))? {
            Forked::Child => {
                drop(go_w);
                drop(dead_r);
                reaper(go_r, dead_w)
            }
            Forked::Parent(pid) => {
                drop(go_r);
                drop(dead_w);
                let map = format!("0 {id_base} {id_count}\n");
                let write_map = |file: &str, text: &str| {
                    fs::write(format!("/proc/{pid}/{file}"), text).map_err(|e| Error::io("write id map", e))
                };
                write_map("uid_map", &map)?;
                write_map("setgroups", "deny")?;
                write_map("gid_map", &map)?;
                let mut go = fs::File::from(go_w);
                go.write_all(b"g").map_err(|e| Error::io("start reaper", e))?;
                let userns = open_ns(pid, "user")?;
                let pidns = open_ns(pid, "pid")?;
                let lower = run_dir.join("lower");
                fs::create_dir_all(&lower).map_err(|e| Error::io("create lower mount point", e))?;
                let tree = sys::open_tree_clone(template).map_err(|e| Error::sys("open template", e))?;
                sys::mount_setattr_idmap(tree.as_fd(), userns.as_fd(), true).map_err(|e| Error::sys("id-map template", e))?;
                sys::move_mount_to(tree.as_fd(), &lower).map_err(|e| Error::sys("mount template", e))?;
                Ok(Family { reaper: pid, userns, pidns, deaths: dead_r, lower })
            }
        }
    }

    /// Kill the reaper and wait for it: the kernel kills every process of
    /// the family's pid namespace and reaps them before the reaper's wait
    /// completes, so when this returns nothing of the family is left.
    pub fn terminate(&self) {
        let _ = nix::sys::signal::kill(self.reaper, nix::sys::signal::Signal::SIGKILL);
        let _ = waitpid(self.reaper, None);
    }

    /// Read one death report (blocking; call when the pipe is readable).
    pub fn read_death(&self) -> Option<Death> {
        let mut buf = [0u8; 12];
        let mut got = 0;
        while got < buf.len() {
            match read(self.deaths.as_fd(), &mut buf[got..]) {
                Ok(0) => return None,
                Ok(n) => got += n,
                Err(nix::errno::Errno::EINTR) => {}
                Err(_) => return None,
            }
        }
        let word = |i: usize| i32::from_ne_bytes([buf[i], buf[i + 1], buf[i + 2], buf[i + 3]]);
        let status = if word(4) == 0 { ExitStatus::Code(word(8)) } else { ExitStatus::Signal(word(8)) };
        Some(Death { pid: word(0), status })
    }
}

pub fn open_ns(pid: Pid, kind: &str) -> Result<OwnedFd> {
    fs::File::open(format!("/proc/{pid}/ns/{kind}")).map(OwnedFd::from).map_err(|e| Error::io("open namespace", e))
}

/// PID 1 of the family's pid namespace: reap everything, report each death.
fn reaper(go: OwnedFd, deaths: OwnedFd) -> ! {
    // Die with the shim; everything in the family dies with us.
    let _ = sys::set_parent_death_signal(nix::sys::signal::Signal::SIGKILL);
    let mut b = [0u8; 1];
    if !matches!(read(go.as_fd(), &mut b), Ok(1)) {
        std::process::exit(1);
    }
    let keep = deaths.as_raw_fd();
    let _ = sys::dup_to(keep, 3);
    sys::close_fds_from(4);
    let _ = sys::set_not_dumpable();
    let out = 3;
    loop {
        match waitpid(Pid::from_raw(-1), None) {
            Ok(WaitStatus::Exited(pid, code)) => report(out, pid, 0, code),
            Ok(WaitStatus::Signaled(pid, sig, _)) => report(out, pid, 1, sig as i32),
            Ok(_) => {}
            Err(nix::errno::Errno::ECHILD) => std::thread::sleep(std::time::Duration::from_millis(50)),
            Err(_) => {}
        }
    }
}

fn report(fd: i32, pid: Pid, kind: i32, value: i32) {
    let mut rec = [0u8; 12];
    rec[..4].copy_from_slice(&pid.as_raw().to_ne_bytes());
    rec[4..8].copy_from_slice(&kind.to_ne_bytes());
    rec[8..].copy_from_slice(&value.to_ne_bytes());
    // SAFETY: writing a stack buffer to a pipe we own.
    unsafe { libc::write(fd, rec.as_ptr().cast(), rec.len()) };
}
