//! A family: one user namespace (uid 0 inside ↔ an unprivileged host range)
//! and one pid namespace whose PID 1 (the reaper) lives as long as the shim
//! and reaps the family's orphans.

use std::fs;
use std::io::Write;
use std::os::fd::{AsFd, OwnedFd};
use std::path::{Path, PathBuf};

use nix::sys::wait::waitpid;
use nix::unistd::{pipe, read, Pid};

use crate::error::{Error, Result};
use crate::sys::{self, Forked};

pub struct Family {
    reaper: Pid,
    pub userns: OwnedFd,
    pub pidns: OwnedFd,
    /// The template's layers (top first), each id-mapped into the family
    /// and mounted read-only here.
    pub lowers: Vec<PathBuf>,
}

impl Family {
    pub fn create(id_base: u32, id_count: u32, layers: &[PathBuf], run_dir: &Path) -> Result<Family> {
        let (go_r, go_w) = pipe().map_err(|e| Error::sys("pipe", e))?;
        // For the reaper to see whether we died before it asked to die with us.
        let shim = sys::pidfd_open(nix::unistd::getpid()).map_err(|e| Error::sys("pidfd_open the shim", e))?;
        // The namespace is made with our effective uid set to the family's
        // host root: the kernel charges what the family's users hold against
        // per-user limits (inotify instances, message queue bytes, ...) to the
        // namespace's owner at the host level too. Owned by host root, every
        // family shared host root's own counters, so one sandbox could use up
        // the host's inotify instances.
        let owner = nix::unistd::Uid::from_raw(id_base);
        nix::unistd::setresuid(nix::unistd::Uid::from_raw(u32::MAX), owner, nix::unistd::Uid::from_raw(u32::MAX))
            .map_err(|e| Error::sys("take the family's owner uid", e))?;
        // SAFETY: the shim is single-threaded.
        let forked = unsafe { sys::fork_with(libc::CLONE_NEWUSER | libc::CLONE_NEWPID) };
        // Back to root (the permitted set was kept: only the effective uid moved).
        if !matches!(forked, Ok(sys::Forked::Child)) {
            nix::unistd::setresuid(nix::unistd::Uid::from_raw(u32::MAX), nix::unistd::Uid::from_raw(0), nix::unistd::Uid::from_raw(u32::MAX))
                .map_err(|e| Error::sys("return to root", e))?;
        }
        match forked.map_err(|e| Error::sys("clone family", e))? {
            Forked::Child => {
                drop(go_w);
                reaper(go_r, shim)
            }
            Forked::Parent(pid) => {
                drop((go_r, shim));
                let map = format!("0 {id_base} {id_count}\n");
                let write_map = |file: &str, text: &str| fs::write(format!("/proc/{pid}/{file}"), text).map_err(|e| Error::io("write id map", e));
                write_map("uid_map", &map)?;
                write_map("setgroups", "deny")?;
                write_map("gid_map", &map)?;
                let mut go = fs::File::from(go_w);
                go.write_all(b"g").map_err(|e| Error::io("start reaper", e))?;
                let userns = open_ns(pid, "user")?;
                let pidns = open_ns(pid, "pid")?;
                let mut lowers = Vec::with_capacity(layers.len());
                for (i, layer) in layers.iter().enumerate() {
                    // The single-layer name stays `lower`, as families made
                    // before stacked templates have it.
                    let lower = run_dir.join(if i == 0 { "lower".to_string() } else { format!("lower{i}") });
                    fs::create_dir_all(&lower).map_err(|e| Error::io("create lower mount point", e))?;
                    let tree = sys::open_tree_clone(layer).map_err(|e| Error::sys("open template", e))?;
                    sys::mount_setattr_idmap(tree.as_fd(), userns.as_fd(), true).map_err(|e| Error::sys("id-map template", e))?;
                    sys::move_mount_to(tree.as_fd(), &lower).map_err(|e| Error::sys("mount template", e))?;
                    lowers.push(lower);
                }
                Ok(Family { reaper: pid, userns, pidns, lowers })
            }
        }
    }

    /// Kill the reaper and wait for it: the kernel kills every process of
    /// the family's pid namespace and reaps them before the reaper's wait
    /// completes, so when this returns nothing of the family is left.
    ///
    /// The reaper's exit waits until every process of the namespace is
    /// reaped, and the REPLs are our children (we are their subreaper), so
    /// reap any child here, not only the reaper, or both would wait forever.
    pub fn terminate(&self) {
        let _ = nix::sys::signal::kill(self.reaper, nix::sys::signal::Signal::SIGKILL);
        loop {
            match waitpid(Pid::from_raw(-1), None) {
                Ok(status) if status.pid() == Some(self.reaper) => break,
                Ok(_) => {}
                Err(nix::errno::Errno::EINTR) => {}
                Err(_) => break,
            }
        }
        // Nothing else may stay a zombie of ours after we exit.
        while let Ok(status) = waitpid(Pid::from_raw(-1), Some(nix::sys::wait::WaitPidFlag::WNOHANG)) {
            if status == nix::sys::wait::WaitStatus::StillAlive {
                break;
            }
        }
        for lower in &self.lowers {
            let _ = nix::mount::umount2(lower, nix::mount::MntFlags::MNT_DETACH);
        }
    }

    pub fn reaper(&self) -> Pid {
        self.reaper
    }
}

pub fn open_ns(pid: Pid, kind: &str) -> Result<OwnedFd> {
    fs::File::open(format!("/proc/{pid}/ns/{kind}")).map(OwnedFd::from).map_err(|e| Error::io("open namespace", e))
}

/// PID 1 of the family's pid namespace: reap whatever is orphaned into it.
fn reaper(go: OwnedFd, shim: OwnedFd) -> ! {
    // Die with the shim; everything in the family dies with us. (A change
    // of our uids would clear this: the reaper keeps the ones it was cloned
    // with, host root's real uid and the family's effective one.) A shim
    // that died before we asked sends nothing: then we end here, or we
    // would outlive it for good.
    let _ = sys::set_parent_death_signal(nix::sys::signal::Signal::SIGKILL);
    if process_ended(&shim) {
        std::process::exit(1);
    }
    drop(shim);
    let mut b = [0u8; 1];
    if !matches!(read(go.as_fd(), &mut b), Ok(1)) {
        std::process::exit(1);
    }
    // Allocate the family's pids from LEAF_PID_MAX up, so a forked REPL's
    // pid is never the number of a process in its sandbox's /proc (a leaf
    // namespace never goes that high). The write applies to the writer's
    // own pid namespace, which is why the reaper does it.
    let _ = std::fs::write("/proc/sys/kernel/ns_last_pid", crate::shim::LEAF_PID_MAX.to_string());
    sys::close_fds_from(0);
    let _ = sys::set_not_dumpable();
    loop {
        if let Err(nix::errno::Errno::ECHILD) = waitpid(Pid::from_raw(-1), None) {
            std::thread::sleep(std::time::Duration::from_millis(100));
        }
    }
}

/// Whether the process of `pidfd` has ended (a pidfd polls readable then).
fn process_ended(pidfd: &OwnedFd) -> bool {
    let mut fds = [nix::poll::PollFd::new(pidfd.as_fd(), nix::poll::PollFlags::POLLIN)];
    matches!(nix::poll::poll(&mut fds, nix::poll::PollTimeout::ZERO), Ok(n) if n > 0)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_reaper_tells_a_shim_that_died_from_one_that_lives() {
        assert!(!process_ended(&sys::pidfd_open(nix::unistd::getpid()).unwrap()));
        let mut child = std::process::Command::new("true").spawn().unwrap();
        let pidfd = sys::pidfd_open(Pid::from_raw(child.id() as i32)).unwrap();
        child.wait().unwrap();
        assert!(process_ended(&pidfd));
    }
}
