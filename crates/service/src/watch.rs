//! Change events for a directory tree, from inotify on the sandbox's overlay (changes by the
//! REPL, bash, PTYs and the files API all pass through it).
//!
//! Directories are opened through `jail::fs` (so never outside the
//! sandbox's root) and watched through their own descriptor's
//! `/proc/self/fd` link, which names exactly the directory opened.

use std::collections::HashMap;
use std::os::fd::{AsFd, AsRawFd, OwnedFd};
use std::sync::Arc;
use std::time::Duration;

use jail::fs::{EntryType, SandboxFs, SandboxPath};
use protocol::FileEvent;
use rustix::fs::inotify::{self, ReadFlags, WatchFlags};
use tokio::io::unix::AsyncFd;
use tokio::sync::mpsc;

use crate::error::Error;
use crate::sandbox::{CapSlot, SandboxEntry};
use repl_host::events::now_ms;

/// Most directories one watch follows; beyond it new directories are not
/// watched and the stream says `overflow`.
pub const MAX_WATCHED_DIRS: usize = 10_000;
/// Concurrent watch streams per sandbox (429 beyond).
pub const MAX_WATCHES_PER_SANDBOX: usize = 8;
/// How often a watch checks that its sandbox still exists.
const LIVENESS_PERIOD: Duration = Duration::from_millis(250);

const MASK: WatchFlags = WatchFlags::CREATE
    .union(WatchFlags::DELETE)
    .union(WatchFlags::MODIFY)
    .union(WatchFlags::ATTRIB)
    .union(WatchFlags::MOVED_FROM)
    .union(WatchFlags::MOVED_TO)
    .union(WatchFlags::DELETE_SELF)
    .union(WatchFlags::ONLYDIR)
    .union(WatchFlags::EXCL_UNLINK);

/// The inotify instance and what each watch descriptor stands for.
struct Watcher {
    fs: SandboxFs,
    inotify: AsyncFd<OwnedFd>,
    dirs: HashMap<i32, SandboxPath>,
    recursive: bool,
    overflowed: bool,
}

impl Watcher {
    /// Watch `path` (and, recursively, the directories below it). Returns
    /// the entries found below it, for a caller that must report them
    /// (a directory that appeared with contents already in it).
    fn add(&mut self, path: &SandboxPath, found: &mut Vec<(SandboxPath, bool)>) -> Result<(), jail::fs::FsError> {
        if self.dirs.len() >= MAX_WATCHED_DIRS {
            self.overflowed = true;
            return Ok(());
        }
        let dir = self.fs.open_dir(path)?;
        let via = format!("/proc/self/fd/{}", dir.as_raw_fd());
        let wd =
            inotify::add_watch(self.inotify.get_ref(), via.as_str(), MASK).map_err(|e| jail::fs::FsError::invalid(format!("{path}: cannot watch: {e}")))?;
        self.dirs.insert(wd, path.clone());
        if !self.recursive {
            return Ok(());
        }
        let (entries, _) = self.fs.list(path, MAX_WATCHED_DIRS)?;
        for e in entries {
            let child = path.join(&e.name);
            let is_dir = e.kind == EntryType::Dir;
            found.push((child.clone(), is_dir));
            if is_dir {
                // Gone again already: nothing to watch.
                let _ = self.add(&child, found);
            }
        }
        Ok(())
    }
}

fn event(kind: &str, path: Option<&SandboxPath>, dir: bool) -> FileEvent {
    FileEvent { kind: kind.into(), path: path.map(|p| p.to_string()), dir, ts: now_ms() }
}

/// Watch `path` (and, if `recursive`, the tree below it) in `entry`: a
/// `ready` event, then change events until the receiver is dropped, the
/// directory goes or the sandbox does. At most `MAX_WATCHES_PER_SANDBOX`
/// at once per sandbox.
pub async fn watch(entry: &Arc<SandboxEntry>, path: SandboxPath, recursive: bool) -> Result<mpsc::Receiver<FileEvent>, Error> {
    let slot = CapSlot::take(entry, |e| &e.watches, MAX_WATCHES_PER_SANDBOX, || format!("a sandbox may have at most {MAX_WATCHES_PER_SANDBOX} watches open"))?;
    entry.revive().await?;
    let engine = Arc::clone(&entry.engine);
    let watcher = tokio::task::spawn_blocking(move || -> Result<Watcher, Error> {
        let fs = engine.fs().map_err(|e| Error::Conflict(format!("the sandbox's filesystem is not reachable right now ({e}); retry")))?;
        let inotify = inotify::init(inotify::CreateFlags::CLOEXEC | inotify::CreateFlags::NONBLOCK).map_err(|e| Error::internal("inotify_init", e))?;
        // SAFETY: the AsyncFd owns the descriptor, so it stays open and the
        // same for the AsyncFd's whole life.
        let inotify = unsafe { AsyncFd::register(inotify) }.map_err(|e| Error::internal("register inotify", e.into_parts().1))?;
        let mut w = Watcher { fs, inotify, dirs: HashMap::new(), recursive, overflowed: false };
        w.add(&path, &mut Vec::new())?;
        Ok(w)
    })
    .await
    .map_err(|e| Error::internal("watch setup failed", e))??;
    let (tx, rx) = mpsc::channel::<FileEvent>(256);
    tokio::spawn(run(watcher, Arc::clone(entry), tx, slot));
    Ok(rx)
}

/// Forward inotify events until the client goes, the watched directory
/// goes, or the sandbox does.
async fn run(mut w: Watcher, entry: Arc<SandboxEntry>, tx: mpsc::Sender<FileEvent>, _slot: CapSlot) {
    if tx.send(event("ready", None, true)).await.is_err() {
        return;
    }
    let mut buf = vec![std::mem::MaybeUninit::<u8>::uninit(); 64 * 1024];
    let mut liveness = tokio::time::interval(LIVENESS_PERIOD);
    let mut last: Option<(String, Option<String>, u64)> = None;
    loop {
        let ready = tokio::select! {
            r = w.inotify.readable() => r,
            _ = liveness.tick() => {
                if entry.is_destroyed() || tx.is_closed() {
                    return;
                }
                continue;
            }
        };
        let Ok(mut guard) = ready else { return };
        let mut raw: Vec<(i32, ReadFlags, Option<String>)> = Vec::new();
        let mut reader = inotify::Reader::new(guard.get_ref().as_fd(), &mut buf);
        loop {
            match reader.next() {
                Ok(ev) => raw.push((ev.wd(), ev.events(), ev.file_name().map(|n| n.to_string_lossy().into_owned()))),
                Err(rustix::io::Errno::WOULDBLOCK) => break,
                Err(_) => return,
            }
        }
        guard.clear_ready();
        let (out, root_gone) = w.translate(raw);
        for ev in out {
            // A burst of writes to one file is one event.
            let key = (ev.kind.clone(), ev.path.clone());
            if last.as_ref().is_some_and(|(k, p, ts)| (k, p) == (&key.0, &key.1) && ev.ts.saturating_sub(*ts) < COALESCE_MS) {
                continue;
            }
            last = Some((key.0, key.1, ev.ts));
            if tx.send(ev).await.is_err() {
                return;
            }
        }
        if root_gone {
            return;
        }
    }
}

/// Identical events closer together than this are reported once.
const COALESCE_MS: u64 = 100;

impl Watcher {
    /// Turn raw inotify records into change events, watching directories
    /// that appear (and reporting what is already inside them, made before
    /// their watch was in place). True once the watched root is gone.
    fn translate(&mut self, raw: Vec<(i32, ReadFlags, Option<String>)>) -> (Vec<FileEvent>, bool) {
        let mut out = Vec::new();
        let mut root_gone = false;
        for (wd, flags, name) in raw {
            if flags.contains(ReadFlags::QUEUE_OVERFLOW) {
                out.push(event("overflow", None, false));
                continue;
            }
            let Some(dir) = self.dirs.get(&wd).cloned() else { continue };
            if flags.intersects(ReadFlags::IGNORED | ReadFlags::DELETE_SELF | ReadFlags::UNMOUNT) {
                self.dirs.remove(&wd);
                root_gone |= self.dirs.is_empty();
                continue;
            }
            // The files API's own temporary files are not changes anyone made.
            let Some(name) = name.filter(|n| !n.starts_with(jail::fs::UPLOAD_TEMP_PREFIX)) else { continue };
            let path = dir.join(&name);
            let is_dir = flags.contains(ReadFlags::ISDIR);
            if flags.intersects(ReadFlags::CREATE | ReadFlags::MOVED_TO) {
                out.push(event("created", Some(&path), is_dir));
                if is_dir && self.recursive {
                    let mut found = Vec::new();
                    let _ = self.add(&path, &mut found);
                    out.extend(found.iter().map(|(p, d)| event("created", Some(p), *d)));
                }
            } else if flags.intersects(ReadFlags::DELETE | ReadFlags::MOVED_FROM) {
                out.push(event("removed", Some(&path), is_dir));
            } else {
                out.push(event("modified", Some(&path), is_dir));
            }
        }
        if std::mem::take(&mut self.overflowed) {
            out.push(event("overflow", None, false));
        }
        (out, root_gone)
    }
}
