//! The real view: the [`FamilyView`] of a running family, read from procfs.

use std::ffi::OsStr;
use std::fs;
use std::io;
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, OwnedFd};
use std::os::unix::ffi::OsStrExt;
use std::path::PathBuf;

use nix::fcntl::OFlag;
use nix::sys::stat::Mode;

use super::vet::{Caller, FamilyProcess, FamilyView};

/// The [`FamilyView`] of a running family: targets are read from a procfs
/// mounted for the family pid namespace (see [`mount_family_proc`](super::mount_family_proc)), the
/// caller from the host's `/proc`.
///
/// The shim needs, over the family's processes, what reading
/// `/proc/<pid>/ns/mnt` needs (`PTRACE_MODE_READ`: host root with
/// `CAP_SYS_PTRACE`) and what signalling them needs (`CAP_KILL`).
///
/// A process of a member that has unshared its mount namespace
/// (`unshare -m` inside the sandbox) counts as no member's: its REPL can no
/// longer signal it (it fails closed).
#[derive(Debug, Clone)]
pub struct ProcFamilyView {
    family_proc: PathBuf,
    host_proc: PathBuf,
    family_level: usize,
}

impl ProcFamilyView {
    /// `family_proc`: a procfs of the family pid namespace; `family_level`:
    /// index of the family namespace in the `NSpid:` lines of the host
    /// `/proc` (1 when the shim is in the pid namespace that host `/proc`
    /// shows and the family's is its child).
    pub fn new(family_proc: impl Into<PathBuf>, family_level: usize) -> ProcFamilyView {
        ProcFamilyView { family_proc: family_proc.into(), host_proc: PathBuf::from("/proc"), family_level }
    }

    /// As [`ProcFamilyView::new`], with the family level read from the
    /// `NSpid:` line of the family's init (host pid `reaper`), whose last
    /// entry is 1.
    pub fn for_reaper(family_proc: impl Into<PathBuf>, reaper: i32) -> io::Result<ProcFamilyView> {
        let status = fs::read_to_string(format!("/proc/{reaper}/status"))?;
        let nspid = status_ids(&status, "NSpid:").unwrap_or_default();
        match nspid.last() {
            Some(1) if nspid.len() >= 2 => Ok(ProcFamilyView::new(family_proc, nspid.len() - 1)),
            _ => Err(io::Error::new(io::ErrorKind::InvalidInput, format!("process {reaper} is no pid namespace's init"))),
        }
    }

    /// The index of the family pid namespace in the host's `NSpid:` lines.
    pub fn family_level(&self) -> usize {
        self.family_level
    }

    fn open_family(&self, pid: i32) -> io::Result<OwnedFd> {
        nix::fcntl::open(&self.family_proc.join(pid.to_string()), OFlag::O_RDONLY | OFlag::O_DIRECTORY | OFlag::O_CLOEXEC, Mode::empty())
            .map_err(io::Error::from)
    }

    /// The member of the process whose family-procfs directory is `dir`.
    /// Its own `ns/mnt` if it has one; else (its leader has exited) that of
    /// any of its live threads; else, for a zombie, its parent's (the only
    /// process entitled to know about it; signalling a zombie does nothing).
    fn member_at(&self, dir: BorrowedFd<'_>) -> Option<u64> {
        if let Some(m) = ns_inode_at(dir, "ns/mnt") {
            return Some(m);
        }
        let tasks = read_dir_at(dir, "task")?;
        for tid in tasks.iter().filter_map(|n| pid_name(n)) {
            if let Some(m) = ns_inode_at(dir, &format!("task/{tid}/ns/mnt")) {
                return Some(m);
            }
        }
        let status = read_at(dir, "status")?;
        if status_field(&status, "State:").is_some_and(|s| s.starts_with('Z')) {
            let ppid = status_ids(&status, "PPid:")?.first().copied()?;
            if ppid > 0 {
                let parent = self.open_family(ppid).ok()?;
                return ns_inode_at(parent.as_fd(), "ns/mnt");
            }
        }
        None
    }
}

impl FamilyView for ProcFamilyView {
    fn caller(&self, host_pid: i32) -> Option<Caller> {
        if host_pid <= 0 {
            return None;
        }
        let host = self.host_proc.join(host_pid.to_string());
        let status = fs::read_to_string(host.join("status")).ok()?;
        let nspid = status_ids(&status, "NSpid:")?;
        let nstgid = status_ids(&status, "NStgid:")?;
        let tgid = *nstgid.get(self.family_level)?;
        if nspid.len() <= self.family_level {
            return None;
        }
        let member = parse_ns_inode(fs::read_link(host.join("ns/mnt")).ok()?.as_os_str())?;
        let stat = fs::read_to_string(self.family_proc.join(tgid.to_string()).join("stat")).ok()?;
        let pgid = stat_pgid(&stat)?;
        Some(Caller { member, tgid, pgid, in_leaf: nspid.len() > self.family_level + 1 })
    }

    fn member_of(&self, pid: i32) -> Option<u64> {
        if pid <= 0 {
            return None;
        }
        let dir = self.open_family(pid).ok()?;
        self.member_at(dir.as_fd())
    }

    fn processes(&self) -> Vec<FamilyProcess> {
        let Ok(entries) = fs::read_dir(&self.family_proc) else {
            return Vec::new();
        };
        let mut out = Vec::new();
        for pid in entries.flatten().filter_map(|e| pid_name(e.file_name().as_bytes())) {
            // A process that vanishes mid-scan is skipped.
            let Ok(dir) = self.open_family(pid) else {
                continue;
            };
            let Some(member) = self.member_at(dir.as_fd()) else {
                continue;
            };
            let Some(pgid) = read_at(dir.as_fd(), "stat").as_deref().and_then(stat_pgid) else {
                continue;
            };
            let Some(nspid) = read_at(dir.as_fd(), "status").as_deref().and_then(|s| status_ids(s, "NSpid:")) else {
                continue;
            };
            let is_init = nspid.len() >= 2 && nspid.last() == Some(&1);
            out.push(FamilyProcess { pid, member, pgid, is_init });
        }
        out
    }

    fn signal(&self, pid: i32, member: u64, sig: i32) -> io::Result<()> {
        let esrch = || io::Error::from_raw_os_error(libc::ESRCH);
        if pid <= 0 {
            return Err(esrch());
        }
        // The directory fd names this process, not its number: a process
        // that has taken the number since the caller's scan has another
        // directory, and this one then fails with ESRCH.
        let dir = self.open_family(pid).map_err(|_| esrch())?;
        if self.member_at(dir.as_fd()) != Some(member) {
            return Err(esrch());
        }
        // SAFETY: a /proc/<pid> directory fd is accepted as a pidfd; a null
        // siginfo means "as kill(2) would".
        let r = unsafe { libc::syscall(libc::SYS_pidfd_send_signal, dir.as_raw_fd(), sig, std::ptr::null::<libc::siginfo_t>(), 0) };
        if r < 0 {
            return Err(io::Error::last_os_error());
        }
        Ok(())
    }
}

fn pid_name(name: &[u8]) -> Option<i32> {
    std::str::from_utf8(name).ok()?.parse().ok().filter(|p: &i32| *p > 0)
}

/// `mnt:[4026531841]` → 4026531841.
fn parse_ns_inode(link: &OsStr) -> Option<u64> {
    let s = std::str::from_utf8(link.as_bytes()).ok()?;
    let (_, rest) = s.split_once(":[")?;
    rest.strip_suffix(']')?.parse().ok()
}

/// The value of the `key` line of a `/proc/<pid>/status`.
fn status_field<'a>(status: &'a str, key: &str) -> Option<&'a str> {
    status.lines().find_map(|l| l.strip_prefix(key)).map(str::trim)
}

/// The numbers of the `key` line of a `/proc/<pid>/status` (`NSpid:`,
/// `NStgid:`, `PPid:`).
pub(crate) fn status_ids(status: &str, key: &str) -> Option<Vec<i32>> {
    status_field(status, key)?.split_whitespace().map(|n| n.parse().ok()).collect()
}

/// Field 5 (pgrp) of a `/proc/<pid>/stat`. The command name (field 2) is in
/// parentheses and may contain spaces and parentheses, so count from the
/// last `)`: state, ppid, pgrp.
fn stat_pgid(stat: &str) -> Option<i32> {
    let (_, rest) = stat.rsplit_once(')')?;
    rest.split_whitespace().nth(2)?.parse().ok()
}

fn ns_inode_at(dir: BorrowedFd<'_>, path: &str) -> Option<u64> {
    let link = nix::fcntl::readlinkat(dir, path).ok()?;
    parse_ns_inode(&link)
}

fn read_at(dir: BorrowedFd<'_>, path: &str) -> Option<String> {
    let fd = nix::fcntl::openat(dir, path, OFlag::O_RDONLY | OFlag::O_CLOEXEC, Mode::empty()).ok()?;
    io::read_to_string(fs::File::from(fd)).ok()
}

/// The names in directory `path` under `dir`, read through the descriptor
/// (`/proc/self/fd/N/...`) so that it is this process's directory.
fn read_dir_at(dir: BorrowedFd<'_>, path: &str) -> Option<Vec<Vec<u8>>> {
    let entries = fs::read_dir(format!("/proc/self/fd/{}/{path}", dir.as_raw_fd())).ok()?;
    Some(entries.flatten().map(|e| e.file_name().as_bytes().to_vec()).collect())
}

#[cfg(test)]
mod tests {
    use super::*;

    // --- procfs parsing -----------------------------------------------------

    #[test]
    fn parses_procfs() {
        assert_eq!(parse_ns_inode(OsStr::new("mnt:[4026531841]")), Some(4_026_531_841));
        assert_eq!(parse_ns_inode(OsStr::new("mnt:[]")), None);
        assert_eq!(parse_ns_inode(OsStr::new("/dev/null")), None);
        let stat = "1234 (a) b) (c 9) S 1 77 77 0 -1 4194560 100 0 0 0";
        assert_eq!(stat_pgid(stat), Some(77));
        assert_eq!(stat_pgid("12 (x) R 3"), None);
        let status = "Name:\tpython3\nState:\tS (sleeping)\nTgid:\t99\nPPid:\t7\nNStgid:\t99\t12\t1\nNSpid:\t100\t13\t2\n";
        assert_eq!(status_ids(status, "NSpid:"), Some(vec![100, 13, 2]));
        assert_eq!(status_ids(status, "NStgid:"), Some(vec![99, 12, 1]));
        assert_eq!(status_ids(status, "PPid:"), Some(vec![7]));
        assert_eq!(status_field(status, "State:"), Some("S (sleeping)"));
        assert_eq!(status_ids(status, "Nope:"), None);
        assert_eq!(pid_name(b"123"), Some(123));
        assert_eq!(pid_name(b"self"), None);
        assert_eq!(pid_name(b"0"), None);
    }

    #[test]
    fn proc_view_knows_this_process() {
        // Against the host /proc as if it were the family's, level 0.
        let view = ProcFamilyView::new("/proc", 0);
        let me = std::process::id() as i32;
        let mine = view.member_of(me).expect("own member");
        let link = fs::read_link("/proc/self/ns/mnt").unwrap();
        assert_eq!(Some(mine), parse_ns_inode(link.as_os_str()));
        let caller = view.caller(me).expect("caller");
        assert_eq!(caller.member, mine);
        assert_eq!(caller.tgid, me);
        // SAFETY: getpgrp has no preconditions.
        assert_eq!(caller.pgid, unsafe { libc::getpgrp() });
        assert!(view.processes().iter().any(|p| p.pid == me && p.member == mine));
        assert_eq!(view.signal(me, mine, 0).map_err(|e| e.raw_os_error()), Ok(()));
        assert_eq!(view.signal(me, mine + 1, 0).map_err(|e| e.raw_os_error()), Err(Some(libc::ESRCH)));
        assert_eq!(view.member_of(-3), None);
    }
}
