//! Write-behind for a durable dump: the disk writes criu's images while
//! criu is still writing them, so the one `syncfs` that makes the Space
//! durable finds little left to do.
//!
//! Without it a freeze is serial: criu fills the page cache (a host with
//! plenty of memory starts no writeback of 1 GiB by itself), and only then
//! does the sync write it all. Measured on a 1 GiB freeze, 2 cores:
//! docs/state.md#cost.

use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

/// How often the images are looked at while criu writes them.
const TICK: Duration = Duration::from_millis(20);

/// Starts writeback of every file in a directory, over and over, until
/// dropped. Never waits for the disk: what it started, the sync finishes.
pub(crate) struct WriteBehind {
    stop: Arc<AtomicBool>,
}

impl WriteBehind {
    /// Watch `dir` (it may not exist yet) on a thread of its own.
    pub(crate) fn start(dir: PathBuf) -> Self {
        let stop = Arc::new(AtomicBool::new(false));
        let flag = Arc::clone(&stop);
        let spawned = std::thread::Builder::new().name("write-behind".into()).spawn(move || {
            while !flag.load(Ordering::Relaxed) {
                start_writeback(&dir);
                std::thread::sleep(TICK);
            }
        });
        if let Err(e) = spawned {
            // Only slower: the sync writes everything anyway.
            tracing::warn!(err = %e, "no write-behind thread for a dump");
        }
        Self { stop }
    }
}

impl Drop for WriteBehind {
    fn drop(&mut self) {
        // Not joined: the thread ends within a tick, and a late pass over
        // a renamed or removed directory does nothing.
        self.stop.store(true, Ordering::Relaxed);
    }
}

/// Ask the kernel to start writing the dirty pages of `dir`'s files.
fn start_writeback(dir: &std::path::Path) {
    use std::os::fd::AsRawFd;
    let Ok(entries) = std::fs::read_dir(dir) else { return };
    for entry in entries.flatten() {
        if !entry.file_type().is_ok_and(|t| t.is_file()) {
            continue;
        }
        let Ok(file) = std::fs::File::open(entry.path()) else { continue };
        // SAFETY: `file` is an open descriptor for the whole call; the
        // call reads no memory of ours. Neither rustix nor nix wraps it.
        unsafe { libc::sync_file_range(file.as_raw_fd(), 0, 0, libc::SYNC_FILE_RANGE_WRITE) };
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Write;

    /// Dirty pages a write-behind finds go to the disk with no sync: the
    /// host's `Dirty:` drops by most of them (without it they would wait
    /// 30 s, the kernel's default dirty_expire).
    #[test]
    fn writes_what_it_finds_without_a_sync() {
        // /var/tmp: on a disk where /tmp may be a tmpfs, which has no writeback.
        let dir = std::path::Path::new("/var/tmp").join(format!("write-behind-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let mut file = std::fs::File::create(dir.join("pages-1.img")).unwrap();
        file.write_all(&vec![7u8; 64 << 20]).unwrap();
        let before = dirty_kib();
        let behind = WriteBehind::start(dir.clone());
        let mut after = before;
        for _ in 0..100 {
            std::thread::sleep(TICK);
            after = dirty_kib();
            if after + (32 << 10) < before {
                break;
            }
        }
        drop(behind);
        std::fs::remove_dir_all(&dir).unwrap();
        // Other writers on the host move Dirty too, far less than 32 MiB.
        assert!(after + (32 << 10) < before, "Dirty went from {before} KiB to {after} KiB");
    }

    fn dirty_kib() -> u64 {
        let meminfo = std::fs::read_to_string("/proc/meminfo").unwrap();
        let line = meminfo.lines().find(|l| l.starts_with("Dirty:")).unwrap();
        line.split_whitespace().nth(1).unwrap().parse().unwrap()
    }
}
