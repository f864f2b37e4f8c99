//! The copy-on-write volume that holds every sandbox's writable layer.
//!
//! Each sandbox's upper layer is a btrfs subvolume, so a fork takes an O(1)
//! snapshot of it. When the state directory is on btrfs, the volume is a
//! directory there. Elsewhere it is an image file formatted as btrfs and
//! loop-mounted at `<state>/volume` (image.rs), allocated, never sparse, so
//! a full host disk cannot turn it read-only; it starts small and grows with
//! use up to a cap, leaving the host disk a reserve (growth.rs).
//!
//! Each sandbox's disk (`rootfs_gb`) is a btrfs *simple quota* (squota,
//! Linux ≥ 6.7) on its subvolume: every extent is charged to the subvolume
//! that wrote it, for as long as it exists, so a snapshot (a fork child)
//! starts with nothing charged and pays only for what it writes; the
//! extents it shares stay its parent's. The limit is set in the same ioctl
//! that makes the subvolume. The kernel removes a dropped subvolume's quota
//! group when nothing is charged to it; one whose extents outlived it (a
//! fork parent deleted before its children) is removed by
//! `sweep_quota_groups` once they are freed.

mod btrfs;
mod growth;
mod image;

use std::fs;
use std::os::fd::AsRawFd;
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use crate::error::{Error, Result};
pub(crate) use btrfs::fsid as btrfs_fsid;
use btrfs::*;
pub use growth::{default_reserve, Usage, VolumeSize, MIN_IMAGE_BYTES};

/// The mounted volume.
#[derive(Clone)]
pub struct Volume {
    root: PathBuf,
    /// The image file when we loop-mounted one (so we unmount it at shutdown).
    image: Option<PathBuf>,
    /// Grows the image (None: the volume is a directory on the host's btrfs,
    /// or no loop device was found under it).
    grower: Option<Arc<growth::Grower>>,
    /// `/sys/fs/btrfs/<fsid>/qgroups` when quotas are on: subvolumes get
    /// their limits.
    qgroups: Option<PathBuf>,
}

impl std::fmt::Debug for Volume {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Volume").field("root", &self.root).field("image", &self.image).finish_non_exhaustive()
    }
}

impl Volume {
    /// Mount (or adopt) the volume under `state_dir`; `size` says how big a
    /// new image starts, how far it grows and what it leaves the host.
    pub fn open(state_dir: &Path, size: VolumeSize) -> Result<Volume> {
        let mut volume = Self::mount(state_dir, size)?;
        if let Some(image) = &volume.image {
            match image::loop_device(&volume.root) {
                Some(device) => {
                    image::set_direct_io(&device);
                    let sysfs = sysfs_dir(&volume.root);
                    let grower = growth::Grower::new(image.clone(), device, volume.root.clone(), sysfs, policy(state_dir, size)?);
                    grower.watch();
                    volume.grower = Some(grower);
                }
                None => tracing::warn!(volume = %volume.root.display(), "no loop device found under the volume: no direct I/O, and it will not grow"),
            }
        }
        volume.qgroups = volume.quotas();
        Ok(volume)
    }

    /// Remove the image under `state_dir` if it is not mounted and is
    /// larger than `max_bytes`, so that the next `open` makes a small one.
    /// For engines that adopt nothing (tests): an image is allocated and
    /// outlives its engine, so one grown large by an older run would go on
    /// taking its room on the disk.
    pub fn discard_larger(state_dir: &Path, max_bytes: u64) -> Result<()> {
        let image = state_dir.join("volume.img");
        let Ok(meta) = fs::metadata(&image) else { return Ok(()) };
        if meta.len() <= max_bytes || is_btrfs(&state_dir.join("volume")).unwrap_or(true) {
            return Ok(());
        }
        fs::remove_file(&image).map_err(|e| Error::io("remove a volume image larger than the cap", e))
    }

    fn mount(state_dir: &Path, size: VolumeSize) -> Result<Volume> {
        let root = state_dir.join("volume");
        if is_btrfs(state_dir)? {
            fs::create_dir_all(&root).map_err(|e| Error::io("create volume dir", e))?;
            return Ok(Volume { root, image: None, grower: None, qgroups: None });
        }
        let image = state_dir.join("volume.img");
        fs::create_dir_all(&root).map_err(|e| Error::io("create volume dir", e))?;
        if is_btrfs(&root)? {
            // A predecessor mounted it and did not unmount (crash): adopt it.
            reclaim_deleted(&root);
            return Ok(Volume { root, image: Some(image), grower: None, qgroups: None });
        }
        if !image.exists() {
            let (_, host_free) = growth::free_bytes(state_dir)?;
            let bytes =
                policy(state_dir, size)?.initial(size.initial_bytes, host_free).map_err(|e| Error::io("make the volume image", std::io::Error::other(e)))?;
            image::create(&image, bytes)?;
            tracing::info!(mib = bytes >> 20, max_mib = size.max_bytes >> 20, image = %image.display(), "made the sandbox volume; it grows with use");
        } else {
            image::allocate_existing(&image);
        }
        image::mount(&image, &root)?;
        reclaim_deleted(&root);
        Ok(Volume { root, image: Some(image), grower: None, qgroups: None })
    }

    /// The volume's size and room now (the host's file system's when the
    /// volume is a directory on it).
    pub fn usage(&self) -> Result<Usage> {
        if let Some(g) = &self.grower {
            return g.usage();
        }
        let (size, free) = growth::free_bytes(&self.root)?;
        Ok(Usage { size_bytes: size, free_bytes: free, max_bytes: size, host_free_bytes: free, host_reserve_bytes: 0 })
    }

    /// Grow the volume now by a step if one fits (a writer of the server's
    /// own met ENOSPC); answers whether it grew.
    pub fn grow_now(&self) -> bool {
        // Deleted sandboxes may hold space the cleaner has not given back.
        let _ = wake_cleaner(&self.root);
        self.grower.as_ref().is_some_and(|g| g.grow(true))
    }

    /// Turn simple quotas on (a no-op when they are): on our own image
    /// only. A state directory on the host's btrfs is not ours to change
    /// (simple quotas set an incompatible-feature flag): there quotas are
    /// used if the operator turned them on. None: `rootfs_gb` is not
    /// enforced (logged).
    fn quotas(&self) -> Option<PathBuf> {
        let Some(sysfs) = sysfs_dir(&self.root) else {
            tracing::warn!(volume = %self.root.display(), "rootfs_gb is not enforced: cannot read the volume's id");
            return None;
        };
        let qgroups = sysfs.join("qgroups");
        if self.image.is_some() {
            let started = std::time::Instant::now();
            let mut args = QuotaCtlArgs { cmd: BTRFS_QUOTA_CTL_ENABLE_SIMPLE_QUOTA, status: 0 };
            let enabled = fs::File::open(&self.root).map_err(|e| Error::io("open volume", e)).and_then(|root| {
                // SAFETY: `args` is a valid btrfs_ioctl_quota_ctl_args; the fd is open.
                unsafe { btrfs_quota_ctl(root.as_raw_fd(), &mut args) }.map_err(|e| Error::sys("enable simple quotas", e))
            });
            match enabled {
                Ok(_) => tracing::info!(ms = started.elapsed().as_millis() as u64, "simple quotas on the volume"),
                Err(err) => {
                    tracing::warn!(%err, "rootfs_gb is not enforced: simple quotas need Linux 6.7 or later");
                    return None;
                }
            }
        }
        match fs::read_to_string(qgroups.join("mode")) {
            Ok(mode) if mode.trim() == "squota" => Some(qgroups),
            Ok(mode) => {
                tracing::warn!(mode = mode.trim(), "rootfs_gb is not enforced: the volume has full qgroups, not simple quotas");
                None
            }
            Err(_) => {
                tracing::warn!(volume = %self.root.display(), "rootfs_gb is not enforced: enable simple quotas on the state directory's btrfs (btrfs quota enable --simple)");
                None
            }
        }
    }

    pub fn root(&self) -> &Path {
        &self.root
    }

    /// Unmount a loop-mounted volume (the loop device goes with it).
    pub fn close(&self) -> Result<()> {
        if let Some(g) = &self.grower {
            g.stop();
        }
        if self.image.is_some() {
            nix::mount::umount2(&self.root, nix::mount::MntFlags::MNT_DETACH).map_err(|e| Error::sys("unmount volume", e))?;
        }
        Ok(())
    }

    /// Whether subvolumes get the limits they are made with.
    pub fn quotas_on(&self) -> bool {
        self.qgroups.is_some()
    }

    /// Create an empty subvolume at `path` (its parent must exist) that may
    /// hold `limit` bytes (0: no limit).
    pub fn create_subvolume(&self, path: &Path, limit: u64) -> Result<()> {
        self.make_subvolume(None, path, limit)
    }

    /// Snapshot the subvolume `src` to `dst` (copy-on-write, O(1)); the
    /// snapshot may write `limit` bytes of its own (0: no limit).
    pub fn snapshot(&self, src: &Path, dst: &Path, limit: u64) -> Result<()> {
        let source = fs::File::open(src).map_err(|e| Error::io("open snapshot source", e))?;
        self.make_subvolume(Some(&source), dst, limit)
    }

    /// A new subvolume at `path`: a snapshot of `source`, or empty; its
    /// quota group gets `limit` in the same transaction.
    fn make_subvolume(&self, source: Option<&fs::File>, path: &Path, limit: u64) -> Result<()> {
        let (parent, name) = split(path)?;
        let dir = fs::File::open(parent).map_err(|e| Error::io("open subvolume parent", e))?;
        let inherit = QgroupInherit {
            flags: BTRFS_QGROUP_INHERIT_SET_LIMITS,
            num_qgroups: 0,
            num_ref_copies: 0,
            num_excl_copies: 0,
            lim: QgroupLimit { flags: BTRFS_QGROUP_LIMIT_MAX_RFER, max_rfer: limit, ..Default::default() },
        };
        let limited = limit > 0 && self.quotas_on();
        let mut args = VolArgsV2 {
            fd: source.map_or(0, |s| s.as_raw_fd() as i64),
            transid: 0,
            flags: if limited { BTRFS_SUBVOL_QGROUP_INHERIT } else { 0 },
            inherit_size: if limited { std::mem::size_of::<QgroupInherit>() as u64 } else { 0 },
            inherit: if limited { &inherit } else { std::ptr::null() },
            unused: [0; 2],
            name: [0; 4040],
        };
        args.name[..name.len()].copy_from_slice(name);
        let made = match source {
            // SAFETY: `args` is a valid btrfs_ioctl_vol_args_v2 whose
            // `inherit` (when set) points at `inherit`, alive until the
            // call returns; both fds are open.
            Some(_) => unsafe { btrfs_snap_create_v2(dir.as_raw_fd(), &args) }.map_err(|e| Error::sys("snapshot subvolume", e)),
            // SAFETY: as above.
            None => unsafe { btrfs_subvol_create_v2(dir.as_raw_fd(), &args) }.map_err(|e| Error::sys("create subvolume", e)),
        };
        made.map(|_| ())
    }

    /// Change the limit of the subvolume at `path` (0: none).
    pub fn set_limit(&self, path: &Path, limit: u64) -> Result<()> {
        if !self.quotas_on() {
            return Ok(());
        }
        let subvolume = fs::File::open(path).map_err(|e| Error::io("open subvolume", e))?;
        let max_rfer = if limit == 0 { BTRFS_QGROUP_LIMIT_CLEAR } else { limit };
        let mut args = QgroupLimitArgs { qgroupid: 0, lim: QgroupLimit { flags: BTRFS_QGROUP_LIMIT_MAX_RFER, max_rfer, ..Default::default() } };
        // SAFETY: `args` is a valid btrfs_ioctl_qgroup_limit_args; the fd is open.
        unsafe { btrfs_qgroup_limit(subvolume.as_raw_fd(), &mut args) }.map_err(|e| Error::sys("limit subvolume", e))?;
        Ok(())
    }

    /// Remove the quota groups of subvolumes that are gone and have nothing
    /// charged any more (on our own image only: on the host's btrfs they
    /// may be someone else's). The kernel refuses the group of a live
    /// subvolume (EBUSY). Returns how many went.
    pub fn sweep_quota_groups(&self) -> usize {
        let (Some(qgroups), Some(_)) = (&self.qgroups, &self.image) else { return 0 };
        let Ok(entries) = fs::read_dir(qgroups) else { return 0 };
        let Ok(root) = fs::File::open(&self.root) else { return 0 };
        let charged = |dir: &Path, what: &str| fs::read_to_string(dir.join(what)).map_or(true, |v| v.trim() != "0");
        let mut removed = 0;
        for e in entries.flatten() {
            let name = e.file_name();
            let Some(id) = name.to_str().and_then(|n| n.strip_prefix("0_")).and_then(|n| n.parse::<u64>().ok()) else { continue };
            if id < BTRFS_FIRST_FREE_OBJECTID || charged(&e.path(), "referenced") || charged(&e.path(), "exclusive") {
                continue;
            }
            let args = QgroupCreateArgs { create: 0, qgroupid: id };
            // SAFETY: `args` is a valid btrfs_ioctl_qgroup_create_args; the fd is open.
            if unsafe { btrfs_qgroup_create(root.as_raw_fd(), &args) }.is_ok() {
                removed += 1;
            }
        }
        removed
    }

    /// Delete the subvolume at `path` with everything in it.
    pub fn delete_subvolume(&self, path: &Path) -> Result<()> {
        // SAFETY: the ioctl gets a valid btrfs_ioctl_vol_args and an open directory.
        name_ioctl(path, "delete subvolume", |dir, args| unsafe { btrfs_snap_destroy(dir, args) })
    }
}

/// Give back, soon and in the background, the space of subvolumes a
/// predecessor deleted but did not see cleaned: the cleaner would wait for
/// the periodic commit (30 s), and what it frees reads as used until the
/// commit after it. A run shorter than that (a test binary, a quick
/// restart) would otherwise leave its deletions counted against the next.
fn reclaim_deleted(root: &Path) {
    // Not only while deletions are pending: the cleaner may have dropped
    // them during the mount, and what it freed still waits for a commit.
    if wake_cleaner(root).is_err() {
        return;
    }
    let root = root.to_path_buf();
    let started = std::time::Instant::now();
    let spawned = std::thread::Builder::new().name("forkbox-reclaim".into()).spawn(move || {
        while deletions_pending(&root).unwrap_or(false) && started.elapsed() < RECLAIM_WAIT {
            std::thread::sleep(std::time::Duration::from_millis(100));
        }
        if wake_cleaner(&root).is_ok() {
            tracing::debug!(ms = started.elapsed().as_millis() as u64, "reclaimed the space of subvolumes deleted by the last run");
        }
    });
    if let Err(e) = spawned {
        tracing::warn!(err = %e, "could not start reclaiming deleted subvolumes: their space is free after the next commit");
    }
}

/// How long the reclaimer waits for the cleaner before it leaves the rest
/// to the periodic commit.
const RECLAIM_WAIT: std::time::Duration = std::time::Duration::from_secs(120);

/// Run a btrfs ioctl that takes `btrfs_ioctl_vol_args` naming `path`'s last
/// component, on `path`'s parent directory.
fn name_ioctl(path: &Path, what: &'static str, ioctl: impl FnOnce(i32, &VolArgs) -> nix::Result<i32>) -> Result<()> {
    let (parent, name) = split(path)?;
    let dir = fs::File::open(parent).map_err(|e| Error::io("open subvolume parent", e))?;
    let args = VolArgs::named(name);
    ioctl(dir.as_raw_fd(), &args).map_err(|e| Error::sys(what, e))?;
    Ok(())
}

fn split(path: &Path) -> Result<(&Path, &[u8])> {
    let parent = path.parent().ok_or_else(|| Error::Invalid(format!("no parent: {}", path.display())))?;
    let name = path.file_name().ok_or_else(|| Error::Invalid(format!("no name: {}", path.display())))?.as_bytes();
    if name.len() > 255 {
        return Err(Error::Invalid("subvolume name too long".into()));
    }
    Ok((parent, name))
}

/// `/sys/fs/btrfs/<fsid>` of the btrfs mounted at `root`.
fn sysfs_dir(root: &Path) -> Option<PathBuf> {
    let fsid = fs::File::open(root).ok().as_ref().and_then(btrfs_fsid)?;
    let hex: String = fsid.iter().map(|b| format!("{b:02x}")).collect();
    let uuid = format!("{}-{}-{}-{}-{}", &hex[..8], &hex[8..12], &hex[12..16], &hex[16..20], &hex[20..]);
    Some(Path::new("/sys/fs/btrfs").join(uuid))
}

/// The growth rule for a volume under `state_dir`.
fn policy(state_dir: &Path, size: VolumeSize) -> Result<growth::Policy> {
    let reserve = match size.host_reserve_bytes {
        Some(r) => r,
        None => default_reserve(growth::free_bytes(state_dir)?.0),
    };
    Ok(growth::Policy { max: size.max_bytes.max(MIN_IMAGE_BYTES), reserve })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_unmounted_image_over_the_cap_is_discarded_and_one_within_it_is_kept() {
        let state = tempfile::tempdir().unwrap();
        fs::create_dir(state.path().join("volume")).unwrap();
        let image = state.path().join("volume.img");
        // Sparse: the sizes are what counts, not the blocks.
        fs::File::create(&image).unwrap().set_len(4 << 30).unwrap();
        Volume::discard_larger(state.path(), 4 << 30).unwrap();
        Volume::discard_larger(state.path(), 8 << 30).unwrap();
        assert!(image.exists(), "within the cap");
        Volume::discard_larger(state.path(), 2 << 30).unwrap();
        assert!(!image.exists(), "over the cap");
        Volume::discard_larger(state.path(), 2 << 30).unwrap();
    }

    /// Data used on the volume, as btrfs counts it (deleted subvolumes not
    /// yet cleaned still count).
    fn data_used(root: &Path) -> u64 {
        let sysfs = sysfs_dir(root).expect("the volume's sysfs dir");
        fs::read_to_string(sysfs.join("allocation/data/bytes_used")).unwrap().trim().parse().unwrap()
    }

    #[test]
    fn space_deleted_before_an_unmount_is_reclaimed_soon_after_the_next_mount() {
        let state = tempfile::tempdir().unwrap();
        let size = VolumeSize { initial_bytes: MIN_IMAGE_BYTES, max_bytes: MIN_IMAGE_BYTES, host_reserve_bytes: Some(0) };
        let volume = Volume::mount(state.path(), size).unwrap();
        let sub = volume.root().join("big");
        volume.create_subvolume(&sub, 0).unwrap();
        fs::write(sub.join("data"), vec![7u8; 300 << 20]).unwrap();
        fs::File::open(&sub).unwrap().sync_all().unwrap();
        nix::unistd::syncfs(fs::File::open(volume.root()).unwrap()).unwrap();
        volume.delete_subvolume(&sub).unwrap();
        // As a run that ends right after its last destroy does.
        volume.close().unwrap();
        assert!(data_used_offline(state.path()) >= 300 << 20, "the test needs the deleted data still counted");

        let volume = Volume::mount(state.path(), size).unwrap();
        // The cleaner would otherwise wait for the periodic commit (30 s).
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
        while data_used(volume.root()) >= 100 << 20 {
            assert!(
                std::time::Instant::now() < deadline,
                "{} MiB still used 10 s after the mount (deletions pending: {:?})",
                data_used(volume.root()) >> 20,
                deletions_pending(volume.root())
            );
            std::thread::sleep(std::time::Duration::from_millis(100));
        }
        volume.close().unwrap();
    }

    /// Data used on the unmounted image at `state`/volume.img, read from a
    /// read-only mount (which runs no cleaner).
    fn data_used_offline(state: &Path) -> u64 {
        let probe = state.join("probe");
        fs::create_dir_all(&probe).unwrap();
        let status = std::process::Command::new("mount").args(["-o", "loop,ro"]).arg(state.join("volume.img")).arg(&probe).status().unwrap();
        assert!(status.success());
        let used = data_used(&probe);
        nix::mount::umount2(&probe, nix::mount::MntFlags::MNT_DETACH).unwrap();
        used
    }
}
