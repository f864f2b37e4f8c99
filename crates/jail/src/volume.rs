//! The copy-on-write volume that holds every sandbox's writable layer.
//!
//! Each sandbox's upper layer is a btrfs subvolume, so the fork issue can take
//! an O(1) snapshot of it. When the state directory is not on btrfs, the
//! volume is an image file formatted as btrfs and loop-mounted at
//! `<state>/volume` (one loop device for the whole server, detached when the
//! volume is unmounted because the mount sets `autoclear`).
//!
//! The image is allocated in full, not sparse: when the disk under a sparse
//! image fills up, the loop device fails btrfs's writes with EIO and btrfs
//! turns the whole volume read-only, breaking every sandbox at once (seen
//! here). Allocated, the volume's own free space is all a sandbox can run
//! out of, and btrfs answers that with a clean ENOSPC to the writer. For the
//! same reason it is mounted `nodiscard`: discards would punch holes back
//! into the image.
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

use std::ffi::CString;
use std::fs;
use std::os::fd::AsRawFd;
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};
use std::process::Command;

use crate::error::{Error, Result};
use crate::tools::require_tool;

const BTRFS_SUPER_MAGIC: i64 = 0x9123_683e;
const BTRFS_PATH_NAME_MAX: usize = 4087;

#[repr(C)]
struct VolArgs {
    fd: i64,
    name: [u8; BTRFS_PATH_NAME_MAX + 1],
}

/// `struct btrfs_ioctl_vol_args_v2` as the create and snapshot ioctls read it.
#[repr(C)]
struct VolArgsV2 {
    fd: i64,
    transid: u64,
    flags: u64,
    /// With `BTRFS_SUBVOL_QGROUP_INHERIT`: the size of and a pointer to
    /// a `btrfs_qgroup_inherit`.
    inherit_size: u64,
    inherit: *const QgroupInherit,
    unused: [u64; 2],
    name: [u8; 4040],
}

/// `struct btrfs_qgroup_limit`.
#[repr(C)]
#[derive(Default)]
struct QgroupLimit {
    flags: u64,
    max_rfer: u64,
    max_excl: u64,
    rsv_rfer: u64,
    rsv_excl: u64,
}

/// `struct btrfs_qgroup_inherit` with no qgroups to copy or join: only
/// the new subvolume's limit.
#[repr(C)]
struct QgroupInherit {
    flags: u64,
    num_qgroups: u64,
    num_ref_copies: u64,
    num_excl_copies: u64,
    lim: QgroupLimit,
}

#[repr(C)]
struct QuotaCtlArgs {
    cmd: u64,
    status: u64,
}

#[repr(C)]
struct QgroupCreateArgs {
    create: u64,
    qgroupid: u64,
}

#[repr(C)]
struct QgroupLimitArgs {
    /// 0: the subvolume the ioctl's descriptor is in.
    qgroupid: u64,
    lim: QgroupLimit,
}

/// `struct btrfs_ioctl_fs_info_args`, of which we need the filesystem id.
#[repr(C)]
struct FsInfoArgs {
    max_id: u64,
    num_devices: u64,
    fsid: [u8; 16],
    rest: [u8; 992],
}

const BTRFS_SUBVOL_QGROUP_INHERIT: u64 = 1 << 2;
const BTRFS_QGROUP_INHERIT_SET_LIMITS: u64 = 1 << 0;
const BTRFS_QGROUP_LIMIT_MAX_RFER: u64 = 1 << 0;
/// `max_rfer` value that removes a limit.
const BTRFS_QGROUP_LIMIT_CLEAR: u64 = u64::MAX;
const BTRFS_QUOTA_CTL_ENABLE_SIMPLE_QUOTA: u64 = 4;
/// Subvolume ids start here (below: the filesystem's own trees).
const BTRFS_FIRST_FREE_OBJECTID: u64 = 256;

nix::ioctl_write_ptr!(btrfs_snap_destroy, 0x94, 15, VolArgs);
nix::ioctl_write_ptr!(btrfs_snap_create_v2, 0x94, 23, VolArgsV2);
nix::ioctl_write_ptr!(btrfs_subvol_create_v2, 0x94, 24, VolArgsV2);
nix::ioctl_read!(btrfs_fs_info, 0x94, 31, FsInfoArgs);
nix::ioctl_readwrite!(btrfs_quota_ctl, 0x94, 40, QuotaCtlArgs);
nix::ioctl_write_ptr!(btrfs_qgroup_create, 0x94, 42, QgroupCreateArgs);
nix::ioctl_read!(btrfs_qgroup_limit, 0x94, 43, QgroupLimitArgs);

/// Size of a new volume image: `gib`, or half the disk's free space when
/// that is less (a server must not take a disk whole; it says so).
fn image_bytes(state_dir: &Path, gib: u64) -> Result<u64> {
    let st = nix::sys::statvfs::statvfs(state_dir).map_err(|e| Error::sys("statvfs state dir", e))?;
    let free = st.blocks_available() as u64 * st.fragment_size() as u64;
    let wanted = gib << 30;
    let half = (free / 2) & !((1 << 30) - 1);
    if wanted <= half {
        return Ok(wanted);
    }
    if half < 1 << 30 {
        return Err(Error::io(
            "allocate the volume image",
            std::io::Error::other(format!("only {} MiB free under {}: the volume needs at least 2 GiB free", free >> 20, state_dir.display())),
        ));
    }
    tracing::warn!(wanted_gib = gib, gib = half >> 30, "the disk has room for a smaller volume only (--volume-gib)");
    Ok(half)
}

/// An image made sparse by an older forkbox: allocate its holes, so that a
/// full disk cannot turn the volume read-only. Without room, go on as it
/// was, but say what that risks.
fn allocate_existing(image: &Path) {
    use std::os::unix::fs::MetadataExt;
    let allocated = fs::OpenOptions::new().write(true).open(image).and_then(|f| {
        let meta = f.metadata()?;
        let missing = meta.len().saturating_sub(meta.blocks() * 512);
        let st = nix::sys::statvfs::statvfs(image).map_err(std::io::Error::from)?;
        let free = st.blocks_available() as u64 * st.fragment_size() as u64;
        // A fallocate that fails half-way keeps what it allocated: never
        // start one that would leave the disk (nearly) full.
        if missing > free / 2 {
            return Err(std::io::Error::other(format!("{} MiB are missing and only {} MiB are free", missing >> 20, free >> 20)));
        }
        rustix::fs::fallocate(&f, rustix::fs::FallocateFlags::KEEP_SIZE, 0, meta.len()).map_err(std::io::Error::from)
    });
    if let Err(e) = allocated {
        tracing::warn!(image = %image.display(), err = %e, "could not allocate the volume image: if the disk fills up, the volume turns read-only");
    }
}

/// The mounted volume.
#[derive(Debug, Clone)]
pub struct Volume {
    root: PathBuf,
    /// The image file when we loop-mounted one (so we unmount it at shutdown).
    image: Option<PathBuf>,
    /// `/sys/fs/btrfs/<fsid>/qgroups` when quotas are on: subvolumes get
    /// their limits.
    qgroups: Option<PathBuf>,
}

impl Volume {
    /// Mount (or adopt) the volume under `state_dir`; `image_gib` sizes a new
    /// sparse image file.
    pub fn open(state_dir: &Path, image_gib: u64) -> Result<Volume> {
        let mut volume = Self::mount(state_dir, image_gib)?;
        if volume.image.is_some() {
            volume.loop_direct_io();
        }
        volume.qgroups = volume.quotas();
        Ok(volume)
    }

    /// Have the loop device read and write the image with direct I/O.
    /// Buffered, every block of the volume sits in the page cache twice
    /// (btrfs's and the image file's) and the host's writeback threads,
    /// which no sandbox's cgroup pays for, copy each write once more: a
    /// sandbox rewriting a file with fsync then costs its neighbours'
    /// exec latency (bench/noisy.py). A file system that cannot do direct
    /// I/O under the image keeps the buffered loop (logged).
    fn loop_direct_io(&self) {
        const LOOP_SET_DIRECT_IO: libc::c_ulong = 0x4C08;
        let Some(device) = mount_source(&self.root).filter(|d| d.starts_with("/dev/loop")) else {
            tracing::warn!(volume = %self.root.display(), "no loop device found under the volume: direct I/O not set");
            return;
        };
        let set = fs::File::open(&device).map_err(|e| e.to_string()).and_then(|f| {
            // SAFETY: LOOP_SET_DIRECT_IO takes its flag by value on an open loop device.
            let rc = unsafe { libc::ioctl(f.as_raw_fd(), LOOP_SET_DIRECT_IO, 1 as libc::c_ulong) };
            if rc == 0 { Ok(()) } else { Err(std::io::Error::last_os_error().to_string()) }
        });
        if let Err(e) = set {
            tracing::warn!(device, error = %e, "the volume's loop device stays buffered (no direct I/O)");
        }
    }

    /// Remove the image under `state_dir` if it is not mounted and is not
    /// `image_gib` GiB, so that the next `open` makes one of that size. For
    /// engines that adopt nothing (tests): an image is allocated in full and
    /// outlives its engine, so one made larger by an older run would go on
    /// taking its room on the disk.
    pub fn discard_other_size(state_dir: &Path, image_gib: u64) -> Result<()> {
        let image = state_dir.join("volume.img");
        let Ok(meta) = fs::metadata(&image) else { return Ok(()) };
        if meta.len() == image_gib << 30 || is_btrfs(&state_dir.join("volume")).unwrap_or(true) {
            return Ok(());
        }
        fs::remove_file(&image).map_err(|e| Error::io("remove a volume image of another size", e))
    }

    fn mount(state_dir: &Path, image_gib: u64) -> Result<Volume> {
        if is_btrfs(state_dir)? {
            let root = state_dir.join("volume");
            fs::create_dir_all(&root).map_err(|e| Error::io("create volume dir", e))?;
            return Ok(Volume { root, image: None, qgroups: None });
        }
        let root = state_dir.join("volume");
        let image = state_dir.join("volume.img");
        fs::create_dir_all(&root).map_err(|e| Error::io("create volume dir", e))?;
        if is_btrfs(&root)? {
            // A predecessor mounted it and did not unmount (crash): adopt it.
            return Ok(Volume { root, image: Some(image), qgroups: None });
        }
        if !image.exists() {
            require_tool("mkfs.btrfs", "btrfs-progs")?;
            let bytes = image_bytes(state_dir, image_gib)?;
            let partial = state_dir.join("volume.img.partial");
            let file = fs::File::create(&partial).map_err(|e| Error::io("create volume image", e))?;
            rustix::fs::fallocate(&file, rustix::fs::FallocateFlags::empty(), 0, bytes)
                .map_err(|e| Error::io("allocate the volume image", e.into()))?;
            drop(file);
            run(Command::new("mkfs.btrfs").args(["-q", "-K", "-L", "forkbox", "-m", "single"]).arg(&partial), "mkfs.btrfs")?;
            fs::rename(&partial, &image).map_err(|e| Error::io("name the volume image", e))?;
        } else {
            allocate_existing(&image);
        }
        run(
            Command::new("mount").args(["-t", "btrfs", "-o", "loop,noatime,nodiscard,user_subvol_rm_allowed"]).arg(&image).arg(&root),
            "mount volume",
        )?;
        Ok(Volume { root, image: Some(image), qgroups: None })
    }

    /// Turn simple quotas on (a no-op when they are): on our own image
    /// only. A state directory on the host's btrfs is not ours to change
    /// (simple quotas set an incompatible-feature flag): there quotas are
    /// used if the operator turned them on. None: `rootfs_gb` is not
    /// enforced (logged).
    fn quotas(&self) -> Option<PathBuf> {
        let fsid = fs::File::open(&self.root).ok().as_ref().and_then(btrfs_fsid);
        let Some(fsid) = fsid else {
            tracing::warn!(volume = %self.root.display(), "rootfs_gb is not enforced: cannot read the volume's id");
            return None;
        };
        let hex: String = fsid.iter().map(|b| format!("{b:02x}")).collect();
        let uuid = format!("{}-{}-{}-{}-{}", &hex[..8], &hex[8..12], &hex[12..16], &hex[16..20], &hex[20..]);
        let qgroups = Path::new("/sys/fs/btrfs").join(uuid).join("qgroups");
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
        if self.image.is_some() {
            nix::mount::umount2(&self.root, nix::mount::MntFlags::MNT_DETACH)
                .map_err(|e| Error::sys("unmount volume", e))?;
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

/// Run a btrfs ioctl that takes `btrfs_ioctl_vol_args` naming `path`'s last
/// component, on `path`'s parent directory.
fn name_ioctl(path: &Path, what: &'static str, ioctl: impl FnOnce(i32, &VolArgs) -> nix::Result<i32>) -> Result<()> {
    let (parent, name) = split(path)?;
    let dir = fs::File::open(parent).map_err(|e| Error::io("open subvolume parent", e))?;
    let mut args = VolArgs { fd: 0, name: [0; BTRFS_PATH_NAME_MAX + 1] };
    args.name[..name.len()].copy_from_slice(name);
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

/// The id of the btrfs filesystem `file` is on; None elsewhere.
pub(crate) fn btrfs_fsid(file: &fs::File) -> Option<[u8; 16]> {
    if nix::sys::statfs::fstatfs(file).ok()?.filesystem_type() != nix::sys::statfs::BTRFS_SUPER_MAGIC {
        return None;
    }
    let mut info = FsInfoArgs { max_id: 0, num_devices: 0, fsid: [0; 16], rest: [0; 992] };
    // SAFETY: `info` is a zeroed `struct btrfs_ioctl_fs_info_args` the ioctl fills in.
    unsafe { btrfs_fs_info(file.as_raw_fd(), &mut info) }.ok()?;
    Some(info.fsid)
}

fn is_btrfs(path: &Path) -> Result<bool> {
    let c = CString::new(path.as_os_str().as_bytes()).map_err(|_| Error::Invalid("path with NUL".into()))?;
    // SAFETY: zeroed statfs is a valid out-parameter; `c` is NUL-terminated.
    let mut st: libc::statfs = unsafe { std::mem::zeroed() };
    // SAFETY: see above.
    if unsafe { libc::statfs(c.as_ptr(), &mut st) } != 0 {
        return Err(Error::io("statfs", std::io::Error::last_os_error()));
    }
    Ok(st.f_type as i64 == BTRFS_SUPER_MAGIC)
}

fn run(cmd: &mut Command, what: &'static str) -> Result<()> {
    let out = cmd.output().map_err(|e| Error::io(what, e))?;
    if !out.status.success() {
        return Err(Error::Command { what: what.to_string(), stderr: String::from_utf8_lossy(&out.stderr).trim().to_string() });
    }
    Ok(())
}

/// The source (`/dev/loop0`, ...) of the file system mounted at `root`,
/// from this process's mountinfo (the last mount there wins).
fn mount_source(root: &Path) -> Option<String> {
    let root = fs::canonicalize(root).ok()?;
    let info = fs::read_to_string("/proc/self/mountinfo").ok()?;
    info.lines()
        .rev()
        .find_map(|line| {
            // `id parent major:minor root mount-point options... - fstype source super-options`
            let (left, right) = line.split_once(" - ")?;
            let point = left.split(' ').nth(4)?;
            (Path::new(point) == root).then(|| right.split(' ').nth(1).map(str::to_string))?
        })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_unmounted_image_of_another_size_is_discarded_and_one_of_the_size_asked_is_kept() {
        let state = tempfile::tempdir().unwrap();
        fs::create_dir(state.path().join("volume")).unwrap();
        let image = state.path().join("volume.img");
        // Sparse: the sizes are what counts, not the blocks.
        fs::File::create(&image).unwrap().set_len(4 << 30).unwrap();
        Volume::discard_other_size(state.path(), 4).unwrap();
        assert!(image.exists(), "the size asked for");
        Volume::discard_other_size(state.path(), 2).unwrap();
        assert!(!image.exists(), "another size");
        Volume::discard_other_size(state.path(), 2).unwrap();
    }
}
