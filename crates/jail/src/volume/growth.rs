//! A volume image that grows with use (docs/operations.md#disk): it starts
//! at `initial_bytes`, and a watcher thread grows it a step at a time
//! whenever its free space runs low, up to `max_bytes`, and never so far
//! that the host disk keeps less than its reserve free. At the cap, or
//! with the host disk at its reserve, the volume stays as it is and
//! sandboxes that fill it get ENOSPC (the image is allocated: no EIO, no
//! read-only file system); the watcher grows it again once room is made.
//! It never shrinks.
//!
//! Free space is what `statfs` says less what btrfs has promised to
//! buffered writes not yet on disk (`bytes_may_use`, `bytes_reserved` in
//! sysfs): a writer fills the page cache far faster than the disk, and
//! btrfs refuses a write once its promises reach the volume's size, while
//! `statfs` still shows the space free (seen here: 1.4 GiB promised and
//! `df` unchanged). The watcher also measures how fast that space goes,
//! and grows early and by more for a fast writer.

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, Weak};
use std::time::Duration;

use crate::error::{Error, Result};

const MIB: u64 = 1 << 20;
const GIB: u64 = 1 << 30;
/// The smallest image made (below about 1 GiB mkfs.btrfs mixes data and
/// metadata in one kind of chunk, which it then keeps at every size).
pub const MIN_IMAGE_BYTES: u64 = GIB;
/// How often the watcher looks at the volume's free space.
const WATCH_EVERY: Duration = Duration::from_millis(100);
/// A writer going on at the rate measured must not fill the volume within
/// this long (a step takes 10 ms to 1.5 s, longer under heavy writes).
const LEAD: Duration = Duration::from_secs(3);
/// The rate is measured over this long: a burst (a `pip install`, a
/// sandbox made) is not a writer that goes on.
const RATE_WINDOW: Duration = Duration::from_secs(1);

/// How big the volume may be, and what it leaves the host.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct VolumeSize {
    /// Size of a new image (at least `MIN_IMAGE_BYTES`, at most `max_bytes`).
    pub initial_bytes: u64,
    /// Largest size it grows to.
    pub max_bytes: u64,
    /// Free space the volume leaves on the disk under the state directory;
    /// `None`: `default_reserve` of that disk.
    pub host_reserve_bytes: Option<u64>,
}

impl VolumeSize {
    /// A volume of at most `max_gib`, starting at 2 GiB (or less, if the
    /// cap is less), with the default reserve.
    pub fn up_to_gib(max_gib: u64) -> VolumeSize {
        VolumeSize { initial_bytes: 2 * GIB, max_bytes: max_gib * GIB, host_reserve_bytes: None }
    }
}

/// The default reserve: 5% of the disk, between 1 and 16 GiB.
pub fn default_reserve(disk_bytes: u64) -> u64 {
    (disk_bytes / 20).clamp(GIB, 16 * GIB)
}

/// The growth rule, with no I/O: what size to go to, given what is used.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct Policy {
    pub max: u64,
    pub reserve: u64,
}

impl Policy {
    /// Free space below which the volume grows: a quarter of it, between
    /// 512 MiB and 4 GiB. The watcher looks five times a second and a step
    /// takes about 20 ms, so a sandbox writing at disk speed would have to
    /// write 512 MiB in a fifth of a second to meet ENOSPC before the step.
    pub fn headroom(size: u64) -> u64 {
        (size / 4).clamp(512 * MIB, 4 * GIB)
    }

    /// How much one step adds: a quarter, at least 1 GiB, so a volume in
    /// heavy use takes few steps.
    pub fn step(size: u64) -> u64 {
        (size / 4).max(GIB)
    }

    /// The size of a new image: `initial` (within the cap and the room
    /// beyond the reserve), or an error saying what is missing.
    pub fn initial(&self, initial: u64, host_free: u64) -> std::result::Result<u64, String> {
        let room = host_free.saturating_sub(self.reserve);
        let wanted = initial.min(self.max).max(MIN_IMAGE_BYTES);
        if room >= wanted {
            return Ok(wanted);
        }
        Err(format!(
            "only {} MiB free on the disk beyond the {} MiB it keeps free (--disk-reserve-gib): the sandbox volume needs {} MiB to start",
            host_free >> 20,
            self.reserve >> 20,
            wanted >> 20
        ))
    }

    /// The size to grow to, if the volume should grow now: when its free
    /// space is under the headroom, or under what `rate` (bytes a second
    /// the free space is going) uses in `LEAD`, by a step (at least twice
    /// that), within the cap and the room beyond the host's reserve; `None`
    /// when there is no need or no room for a step of at least 64 MiB.
    pub fn next(&self, size: u64, volume_free: u64, host_free: u64, rate: u64) -> Option<u64> {
        let soon = rate.saturating_mul(LEAD.as_secs());
        if volume_free >= Self::headroom(size).max(soon) || size >= self.max {
            return None;
        }
        let room = host_free.saturating_sub(self.reserve);
        let step = Self::step(size).max(soon.saturating_mul(2));
        let target = size.saturating_add(step).min(self.max).min(size + room) & !(MIB - 1);
        (target >= size + 64 * MIB).then_some(target)
    }
}

/// The volume's size and room as the server reports them.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Usage {
    /// The file system's size and what an unprivileged writer may still use.
    pub size_bytes: u64,
    pub free_bytes: u64,
    /// The size it may grow to (`size_bytes` when it cannot grow).
    pub max_bytes: u64,
    /// Free on the disk under the state directory, and the part of it the
    /// volume leaves alone.
    pub host_free_bytes: u64,
    pub host_reserve_bytes: u64,
}

impl Usage {
    /// Whether a step of growth fits now.
    pub fn can_grow(&self) -> bool {
        let policy = Policy { max: self.max_bytes, reserve: self.host_reserve_bytes };
        // As if it were full: is there room for a step?
        policy.next(self.size_bytes, 0, self.host_free_bytes, 0).is_some()
    }
}

/// Grows one loop-mounted image.
pub(super) struct Grower {
    image: PathBuf,
    device: PathBuf,
    root: PathBuf,
    /// `/sys/fs/btrfs/<fsid>`, for what buffered writes hold.
    sysfs: Option<PathBuf>,
    policy: Policy,
    /// The free space seen in the last `RATE_WINDOW` and when, for the
    /// rate it goes at.
    seen: Mutex<std::collections::VecDeque<(std::time::Instant, u64)>>,
    /// Held by a step (the watcher's or `grow_now`'s).
    step: Mutex<()>,
    /// Why the last step could not be taken (logged once per reason).
    stuck: Mutex<Option<String>>,
    stopped: AtomicBool,
}

pub(super) fn free_bytes(path: &Path) -> Result<(u64, u64)> {
    let st = nix::sys::statvfs::statvfs(path).map_err(|e| Error::sys("statvfs", e))?;
    let frag = st.fragment_size() as u64;
    Ok((st.blocks() as u64 * frag, st.blocks_available() as u64 * frag))
}

impl Grower {
    pub fn new(image: PathBuf, device: PathBuf, root: PathBuf, sysfs: Option<PathBuf>, policy: Policy) -> Arc<Grower> {
        Arc::new(Grower {
            image,
            device,
            root,
            sysfs,
            policy,
            seen: Default::default(),
            step: Mutex::new(()),
            stuck: Mutex::new(None),
            stopped: AtomicBool::new(false),
        })
    }

    /// Data space btrfs has promised to writes not yet on disk.
    fn promised(&self) -> u64 {
        let Some(sysfs) = &self.sysfs else { return 0 };
        let read = |f: &str| std::fs::read_to_string(sysfs.join("allocation/data").join(f)).ok().and_then(|v| v.trim().parse::<u64>().ok()).unwrap_or(0);
        read("bytes_may_use") + read("bytes_reserved")
    }

    /// How fast (bytes a second) the free space went over the last
    /// `RATE_WINDOW`; 0 until there is a window's worth of looks.
    fn rate(&self, free: u64) -> u64 {
        let now = std::time::Instant::now();
        let mut seen = self.seen.lock().unwrap_or_else(|e| e.into_inner());
        while seen.len() > 1 && seen.get(1).is_some_and(|(t, _)| now - *t >= RATE_WINDOW) {
            seen.pop_front();
        }
        let rate = match seen.front() {
            Some((then, was)) if now - *then >= RATE_WINDOW / 2 => (was.saturating_sub(free) as f64 / (now - *then).as_secs_f64()) as u64,
            _ => 0,
        };
        seen.push_back((now, free));
        rate
    }

    fn host_dir(&self) -> &Path {
        self.image.parent().unwrap_or(Path::new("/"))
    }

    pub fn usage(&self) -> Result<Usage> {
        let (size, free) = free_bytes(&self.root)?;
        let free = free.saturating_sub(self.promised());
        let (_, host_free) = free_bytes(self.host_dir())?;
        Ok(Usage {
            size_bytes: size,
            free_bytes: free,
            max_bytes: self.policy.max.max(size),
            host_free_bytes: host_free,
            host_reserve_bytes: self.policy.reserve,
        })
    }

    /// Take a step if the volume needs one (or, with `force`, if one fits).
    /// Answers whether it grew.
    pub fn grow(&self, force: bool) -> bool {
        let _step = self.step.lock().unwrap_or_else(|e| e.into_inner());
        let image_len = std::fs::metadata(&self.image).map(|m| m.len()).unwrap_or(0);
        let Ok(usage) = self.usage() else { return false };
        // The image's length, not the file system's size, is what the disk
        // holds (btrfs reports a little less than its device).
        let size = image_len.max(usage.size_bytes);
        let rate = self.rate(usage.free_bytes);
        let free = if force { 0 } else { usage.free_bytes };
        let Some(target) = self.policy.next(size, free, usage.host_free_bytes, rate) else {
            if usage.free_bytes < Policy::headroom(size) {
                self.stuck_because(if size >= self.policy.max {
                    format!("it is at its cap of {} MiB (--volume-gib)", self.policy.max >> 20)
                } else {
                    format!("the disk has {} MiB free and keeps {} MiB (--disk-reserve-gib)", usage.host_free_bytes >> 20, self.policy.reserve >> 20)
                });
            }
            return false;
        };
        let started = std::time::Instant::now();
        match super::image::extend(&self.image, &self.device, &self.root, target) {
            Ok(()) => {
                *self.stuck.lock().unwrap_or_else(|e| e.into_inner()) = None;
                tracing::info!(from_mib = size >> 20, to_mib = target >> 20, ms = started.elapsed().as_millis() as u64, "the sandbox volume grew");
                true
            }
            Err(e) => {
                self.stuck_because(e.to_string());
                false
            }
        }
    }

    fn stuck_because(&self, why: String) {
        let mut stuck = self.stuck.lock().unwrap_or_else(|e| e.into_inner());
        if stuck.as_deref() != Some(why.as_str()) {
            tracing::warn!(why = %why, "the sandbox volume is low on space and cannot grow: sandboxes that fill it get ENOSPC");
            *stuck = Some(why);
        }
    }

    /// Watch the volume on a thread of its own until `stop` (or until the
    /// last handle to it is gone).
    pub fn watch(self: &Arc<Grower>) {
        let me: Weak<Grower> = Arc::downgrade(self);
        let spawned = std::thread::Builder::new().name("forkbox-volume".into()).spawn(move || loop {
            std::thread::sleep(WATCH_EVERY);
            let Some(grower) = me.upgrade() else { return };
            if grower.stopped.load(Ordering::Relaxed) {
                return;
            }
            grower.grow(false);
        });
        if let Err(e) = spawned {
            tracing::warn!(err = %e, "could not start the volume's watcher: the volume will not grow");
        }
    }

    pub fn stop(&self) {
        self.stopped.store(true, Ordering::Relaxed);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const P: Policy = Policy { max: 64 * GIB, reserve: 4 * GIB };

    #[test]
    fn it_grows_only_when_low_and_by_a_step() {
        // Plenty free: no step.
        assert_eq!(P.next(2 * GIB, 512 * MIB, 100 * GIB, 0), None);
        // Under the 512 MiB headroom: a 1 GiB step.
        assert_eq!(P.next(2 * GIB, 512 * MIB - 1, 100 * GIB, 0), Some(3 * GIB));
        // A mid-size volume: a quarter is the headroom and the step.
        assert_eq!(P.next(8 * GIB, 2 * GIB, 100 * GIB, 0), None);
        assert_eq!(P.next(8 * GIB, 2 * GIB - 1, 100 * GIB, 0), Some(10 * GIB));
        // A big one: the headroom stops at 4 GiB, the step does not.
        assert_eq!(P.next(32 * GIB, 4 * GIB, 100 * GIB, 0), None);
        assert_eq!(P.next(32 * GIB, 4 * GIB - 1, 100 * GIB, 0), Some(40 * GIB));
    }

    #[test]
    fn a_fast_writer_makes_it_grow_early_and_by_more() {
        // 1 GiB free is plenty at rest, not for 500 MiB/s: three seconds of
        // it are wanted free, and the step is twice that.
        assert_eq!(P.next(4 * GIB, GIB, 100 * GIB, 0), None);
        assert_eq!(P.next(4 * GIB, GIB, 100 * GIB, 500 * MIB), Some(4 * GIB + 3000 * MIB));
        // The cap and the reserve still bound it.
        assert_eq!(P.next(60 * GIB, GIB, 100 * GIB, 4 * GIB), Some(64 * GIB));
        assert_eq!(P.next(4 * GIB, GIB, 6 * GIB, 4 * GIB), Some(6 * GIB));
    }

    #[test]
    fn it_stops_at_the_cap_and_at_the_hosts_reserve() {
        // The cap cuts the step short, then stops growth.
        assert_eq!(P.next(60 * GIB, 0, 100 * GIB, 0), Some(64 * GIB));
        assert_eq!(P.next(64 * GIB, 0, 100 * GIB, 0), None);
        // 4.5 GiB free on the host with 4 GiB reserved: half a GiB more.
        assert_eq!(P.next(2 * GIB, 0, 4 * GIB + 512 * MIB, 0), Some(2 * GIB + 512 * MIB));
        // Under 64 MiB of room beyond the reserve: no step.
        assert_eq!(P.next(2 * GIB, 0, 4 * GIB + 63 * MIB, 0), None);
        assert_eq!(P.next(2 * GIB, 0, GIB, 0), None);
    }

    #[test]
    fn steps_are_whole_mebibytes() {
        let odd = 4 * GIB + 12_345;
        let to = P.next(2 * GIB, 0, odd + 4 * GIB, 0).unwrap();
        assert_eq!(to % MIB, 0);
        assert!(to <= 2 * GIB + odd);
    }

    #[test]
    fn a_new_image_fits_beyond_the_reserve_or_is_refused() {
        assert_eq!(P.initial(2 * GIB, 10 * GIB), Ok(2 * GIB));
        // A cap under the initial size wins; never below the minimum.
        assert_eq!(Policy { max: GIB, reserve: GIB }.initial(2 * GIB, 10 * GIB), Ok(GIB));
        assert_eq!(Policy { max: 64 * GIB, reserve: GIB }.initial(256 * MIB, 10 * GIB), Ok(MIN_IMAGE_BYTES));
        let err = P.initial(2 * GIB, 5 * GIB).unwrap_err();
        assert!(err.contains("--disk-reserve-gib") && err.contains("2048 MiB"), "{err}");
    }

    #[test]
    fn the_default_reserve_is_a_twentieth_within_bounds() {
        assert_eq!(default_reserve(3 * GIB), GIB);
        assert_eq!(default_reserve(100 * GIB), 5 * GIB);
        assert_eq!(default_reserve(10_000 * GIB), 16 * GIB);
    }

    #[test]
    fn usage_says_whether_a_step_fits() {
        let u = Usage { size_bytes: 2 * GIB, free_bytes: 0, max_bytes: 4 * GIB, host_free_bytes: 10 * GIB, host_reserve_bytes: GIB };
        assert!(u.can_grow());
        assert!(!Usage { max_bytes: 2 * GIB, ..u }.can_grow());
        assert!(!Usage { host_free_bytes: GIB + 10 * MIB, ..u }.can_grow());
    }
}
