//! The lock a criu dump holds for as long as it runs, so a server started
//! while its predecessor's dump still runs waits for that dump to end
//! before it reads that server's Spaces or takes the sandbox back
//! (docs/state.md, `processes` Spaces).
//!
//! A dump must not die with the server: killed while its parasite code
//! runs inside a task of the tree, criu leaves that task to die of the
//! parasite's trap, and the sandbox's REPL is lost. So criu runs on to
//! its end (a dump of a GiB takes seconds), but the next server must not
//! touch the tree before then: criu sets the freezer back to what it
//! found when it ends, and would pause again a sandbox the next server
//! had let run. The lock tells the two apart without a race: the server
//! takes it before it starts criu, criu inherits it, and it is free again
//! only once neither holds it. criu writes its pid into the file, so a
//! dump that outlives criu's longest run can be ended by the next server
//! (which kills that pid only if it holds the lock open).

use std::fs::File;
use std::io::Read;
use std::os::fd::{AsRawFd, RawFd};
use std::path::{Path, PathBuf};
use std::time::{Duration, SystemTime};

use crate::error::{Error, Result};

/// How often a waiting server tries the lock again.
const POLL: Duration = Duration::from_millis(20);
/// How long a killed criu is given to let go of the lock.
const AFTER_KILL: Duration = Duration::from_secs(10);

/// The lock of member `member`'s dumps, in its family's run directory.
pub(super) fn path(run_dir: &Path, member: &str) -> PathBuf {
    run_dir.join(format!("{member}{SUFFIX}"))
}

const SUFFIX: &str = ".dump-lock";

/// A dump's lock, held by this server and by the criu it starts.
pub(super) struct DumpLock {
    file: File,
    path: PathBuf,
}

impl DumpLock {
    /// Take the lock at `path` (made if missing). A lock that is taken
    /// means a dump of the member is already running.
    pub(super) fn take(path: PathBuf) -> Result<DumpLock> {
        use std::os::unix::fs::OpenOptionsExt;
        let file = std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .truncate(false)
            .mode(0o600)
            .open(&path)
            .map_err(|e| Error::io("open the dump's lock", e))?;
        if !crate::sys::try_lock_exclusive(&file) {
            return Err(Error::Invalid("a dump of this sandbox is already running".into()));
        }
        Ok(DumpLock { file, path })
    }

    /// The descriptor criu inherits ([`hand_to_child`] in its `pre_exec`).
    pub(super) fn raw_fd(&self) -> RawFd {
        self.file.as_raw_fd()
    }
}

impl Drop for DumpLock {
    /// The dump ended under this server: nobody needs the file.
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.path);
    }
}

/// In criu's process, between fork and exec: keep `fd` (the lock) open
/// across exec and write this process's pid into it. Only system calls,
/// no allocation.
pub(super) fn hand_to_child(fd: RawFd) -> std::io::Result<()> {
    // SAFETY: fcntl, getpid and pwrite on a descriptor the parent opened;
    // the buffer is on this stack.
    unsafe {
        if libc::fcntl(fd, libc::F_SETFD, 0) != 0 {
            return Err(std::io::Error::last_os_error());
        }
        let mut digits = [0u8; 12];
        let mut at = digits.len();
        let mut pid = libc::getpid() as u32;
        loop {
            at -= 1;
            digits[at] = b'0' + (pid % 10) as u8;
            pid /= 10;
            if pid == 0 {
                break;
            }
        }
        let len = digits.len() - at;
        if libc::ftruncate(fd, 0) != 0 || libc::pwrite(fd, digits[at..].as_ptr().cast(), len, 0) != len as isize {
            return Err(std::io::Error::last_os_error());
        }
    }
    Ok(())
}

/// Wait until no dump a previous server started under `run` (the
/// engine's run directory: one directory per family) still runs.
pub(super) async fn wait_for_all(run: &Path) {
    let Ok(families) = std::fs::read_dir(run) else {
        return;
    };
    let locks = families.flatten().filter_map(|family| std::fs::read_dir(family.path()).ok()).flatten().flatten();
    for lock in locks {
        let name = lock.file_name().to_string_lossy().into_owned();
        if let Some(member) = name.strip_suffix(SUFFIX) {
            if let Err(e) = wait_for(&lock.path(), member).await {
                tracing::warn!(sandbox = %member, error = %e, "could not wait for a dump to end");
            }
        }
    }
}

/// Wait until the dump of `member` whose lock is at `path` has ended: at
/// once when none runs. A dump still running past criu's longest run
/// (counted from its start) is killed. Errs only when a killed dump will
/// not let go.
async fn wait_for(path: &Path, member: &str) -> Result<()> {
    let Ok(mut file) = File::open(path) else {
        return Ok(());
    };
    let mut waited = false;
    let mut killed_at: Option<std::time::Instant> = None;
    loop {
        if crate::sys::try_lock_exclusive(&file) {
            if waited {
                tracing::info!(sandbox = %member, "the dump a previous server started has ended");
            }
            let _ = std::fs::remove_file(path);
            return Ok(());
        }
        if !waited {
            tracing::info!(sandbox = %member, "a dump a previous server started still runs: waiting for it to end");
            waited = true;
        }
        let started = file.metadata().and_then(|m| m.modified()).unwrap_or_else(|_| SystemTime::now());
        let overdue = SystemTime::now().duration_since(started).unwrap_or_default() > criu::LONGEST_RUN;
        match killed_at {
            None if overdue => {
                let mut text = String::new();
                let _ = std::io::Seek::rewind(&mut file);
                let _ = file.read_to_string(&mut text);
                match text.trim().parse::<i32>() {
                    Ok(pid @ 1..) if holds(pid, &file) => {
                        tracing::warn!(sandbox = %member, pid, "a dump a previous server started ran past criu's longest run: killing it");
                        // SAFETY: kill of a process that holds the lock open.
                        unsafe { libc::kill(pid, libc::SIGKILL) };
                    }
                    _ => tracing::warn!(sandbox = %member, "a dump a previous server started ran past criu's longest run, and its pid is not known"),
                }
                killed_at = Some(std::time::Instant::now());
            }
            Some(at) if at.elapsed() > AFTER_KILL => {
                return Err(Error::Invalid("a killed dump still holds its lock".into()));
            }
            _ => {}
        }
        tokio::time::sleep(POLL).await;
    }
}

/// Whether process `pid` has `lock` open: the pid in the file is only
/// trusted with a kill when it is.
fn holds(pid: i32, lock: &File) -> bool {
    use std::os::unix::fs::MetadataExt;
    let Ok(ours) = lock.metadata() else {
        return false;
    };
    let Ok(fds) = std::fs::read_dir(format!("/proc/{pid}/fd")) else {
        return false;
    };
    fds.flatten().any(|fd| std::fs::metadata(fd.path()).is_ok_and(|m| m.dev() == ours.dev() && m.ino() == ours.ino()))
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::process::{CommandExt, ExitStatusExt};
    use std::time::Instant;

    /// A dump's lock in `run`, held by a `sleep seconds` started as the
    /// server starts criu, then let go by the "server" (its crash).
    fn orphaned_dump(run: &Path, seconds: &str) -> (std::process::Child, PathBuf) {
        let family = run.join("sb-family");
        std::fs::create_dir_all(&family).unwrap();
        let lock = DumpLock::take(path(&family, "sb-member")).unwrap();
        let fd = lock.raw_fd();
        let mut command = std::process::Command::new("sleep");
        command.arg(seconds);
        // SAFETY: hand_to_child only makes system calls.
        unsafe { command.pre_exec(move || hand_to_child(fd)) };
        let child = command.spawn().unwrap();
        // The server dies: its descriptor closes, its Drop never runs.
        let lock = std::mem::ManuallyDrop::new(lock);
        // SAFETY: `lock` is never used or dropped after this read.
        drop(unsafe { std::ptr::read(&lock.file) });
        (child, lock.path.clone())
    }

    #[test]
    fn a_taken_lock_cannot_be_taken_twice() {
        let dir = tempfile::tempdir().unwrap();
        let first = DumpLock::take(path(dir.path(), "sb-a")).unwrap();
        assert!(DumpLock::take(path(dir.path(), "sb-a")).is_err());
        drop(first);
        assert!(!path(dir.path(), "sb-a").exists(), "a dump that ended leaves no file");
        DumpLock::take(path(dir.path(), "sb-a")).unwrap();
    }

    #[tokio::test]
    async fn the_next_server_waits_as_long_as_the_dump_runs() {
        let run = tempfile::tempdir().unwrap();
        let (mut child, lock) = orphaned_dump(run.path(), "0.6");
        assert_eq!(std::fs::read_to_string(&lock).unwrap(), child.id().to_string(), "criu wrote its pid");
        let started = Instant::now();
        wait_for_all(run.path()).await;
        assert!(started.elapsed() >= Duration::from_millis(400), "returned after {:?}", started.elapsed());
        assert!(child.try_wait().unwrap().is_some(), "the dump had ended");
        assert!(!lock.exists());
    }

    #[tokio::test]
    async fn a_dump_past_criu_longest_run_is_killed() {
        let run = tempfile::tempdir().unwrap();
        let (mut child, lock) = orphaned_dump(run.path(), "1000");
        // Started one second more than criu's longest run ago.
        let long_ago = SystemTime::now() - criu::LONGEST_RUN - Duration::from_secs(1);
        File::options().write(true).open(&lock).unwrap().set_modified(long_ago).unwrap();
        let started = Instant::now();
        wait_for_all(run.path()).await;
        assert!(started.elapsed() < AFTER_KILL, "waited {:?}", started.elapsed());
        assert_eq!(child.wait().unwrap().signal(), Some(libc::SIGKILL));
        assert!(!lock.exists());
    }

    #[tokio::test]
    async fn a_dump_within_criu_longest_run_is_not_killed() {
        let run = tempfile::tempdir().unwrap();
        let (mut child, _) = orphaned_dump(run.path(), "1000");
        // One second short of criu's longest run: still waited for.
        let lately = SystemTime::now() - criu::LONGEST_RUN + Duration::from_secs(1);
        File::options().write(true).open(path(&run.path().join("sb-family"), "sb-member")).unwrap().set_modified(lately).unwrap();
        let waited = tokio::time::timeout(Duration::from_millis(500), wait_for_all(run.path())).await;
        assert!(waited.is_err(), "the next server stopped waiting on a dump within its time");
        assert!(child.try_wait().unwrap().is_none(), "a dump within its time was killed");
        child.kill().unwrap();
        child.wait().unwrap();
    }

    #[tokio::test]
    async fn a_pid_that_does_not_hold_the_lock_is_never_killed() {
        let run = tempfile::tempdir().unwrap();
        let (mut dump, lock) = orphaned_dump(run.path(), "1000");
        let mut bystander = std::process::Command::new("sleep").arg("1000").spawn().unwrap();
        std::fs::write(&lock, bystander.id().to_string()).unwrap();
        let long_ago = SystemTime::now() - criu::LONGEST_RUN - Duration::from_secs(1);
        File::options().write(true).open(&lock).unwrap().set_modified(long_ago).unwrap();
        let waited = tokio::time::timeout(Duration::from_millis(500), wait_for_all(run.path())).await;
        assert!(waited.is_err(), "the lock is still held");
        assert!(bystander.try_wait().unwrap().is_none(), "a process named in the file but not holding the lock was killed");
        for child in [&mut dump, &mut bystander] {
            child.kill().unwrap();
            child.wait().unwrap();
        }
    }
}
