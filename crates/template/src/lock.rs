//! Per-template file locks, so two builders (or a builder and a remover) never race.

use std::fs::{File, OpenOptions};
use std::path::Path;

use nix::errno::Errno;
use nix::fcntl::{Flock, FlockArg};

use crate::error::TemplateError;

/// Held until dropped; the kernel also drops it if the process dies.
#[derive(Debug)]
pub(crate) struct Lock {
    _flock: Flock<File>,
}

/// Takes the exclusive lock at `path`, calling `on_wait` first if someone else holds it.
pub(crate) fn exclusive(path: &Path, on_wait: impl FnOnce()) -> Result<Lock, TemplateError> {
    let file = open(path)?;
    match Flock::lock(file, FlockArg::LockExclusiveNonblock) {
        Ok(flock) => Ok(Lock { _flock: flock }),
        Err((file, Errno::EWOULDBLOCK)) => {
            on_wait();
            wait(path, file, FlockArg::LockExclusive)
        }
        Err((_, errno)) => Err(error(path, errno)),
    }
}

/// Takes the shared lock at `path`: readers of a template keep removers out.
pub(crate) fn shared(path: &Path) -> Result<Lock, TemplateError> {
    wait(path, open(path)?, FlockArg::LockShared)
}

fn wait(path: &Path, mut file: File, arg: FlockArg) -> Result<Lock, TemplateError> {
    loop {
        match Flock::lock(file, arg) {
            Ok(flock) => return Ok(Lock { _flock: flock }),
            Err((f, Errno::EINTR)) => file = f,
            Err((_, errno)) => return Err(error(path, errno)),
        }
    }
}

fn open(path: &Path) -> Result<File, TemplateError> {
    OpenOptions::new().create(true).truncate(false).write(true).open(path).map_err(TemplateError::io(format!("opening lock {}", path.display())))
}

fn error(path: &Path, errno: Errno) -> TemplateError {
    TemplateError::io(format!("locking {}", path.display()))(errno.into())
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::cell::Cell;

    #[test]
    fn exclusive_excludes_and_reports_waiting() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("t.lock");
        let first = exclusive(&path, || panic!("uncontended lock waited")).unwrap();
        let waited = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
        let w = waited.clone();
        let p = path.clone();
        let second = std::thread::spawn(move || {
            exclusive(&p, || w.store(true, std::sync::atomic::Ordering::SeqCst)).unwrap();
        });
        std::thread::sleep(std::time::Duration::from_millis(200));
        drop(first);
        second.join().unwrap();
        assert!(waited.load(std::sync::atomic::Ordering::SeqCst));

        let called = Cell::new(false);
        let _a = shared(&path).unwrap();
        let _b = shared(&path).unwrap();
        drop((_a, _b));
        let _c = exclusive(&path, || called.set(true)).unwrap();
        assert!(!called.get());
    }
}
