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

#[repr(C)]
struct VolArgsV2 {
    fd: i64,
    transid: u64,
    flags: u64,
    unused: [u64; 4],
    name: [u8; 4040],
}

nix::ioctl_write_ptr!(btrfs_subvol_create, 0x94, 14, VolArgs);
nix::ioctl_write_ptr!(btrfs_snap_destroy, 0x94, 15, VolArgs);
nix::ioctl_write_ptr!(btrfs_snap_create_v2, 0x94, 23, VolArgsV2);

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
}

impl Volume {
    /// Mount (or adopt) the volume under `state_dir`; `image_gib` sizes a new
    /// sparse image file.
    pub fn open(state_dir: &Path, image_gib: u64) -> Result<Volume> {
        if is_btrfs(state_dir)? {
            let root = state_dir.join("volume");
            fs::create_dir_all(&root).map_err(|e| Error::io("create volume dir", e))?;
            return Ok(Volume { root, image: None });
        }
        let root = state_dir.join("volume");
        let image = state_dir.join("volume.img");
        fs::create_dir_all(&root).map_err(|e| Error::io("create volume dir", e))?;
        if is_btrfs(&root)? {
            // A predecessor mounted it and did not unmount (crash): adopt it.
            return Ok(Volume { root, image: Some(image) });
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
        Ok(Volume { root, image: Some(image) })
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

    /// Create an empty subvolume at `path` (its parent must exist).
    pub fn create_subvolume(&self, path: &Path) -> Result<()> {
        // SAFETY: the ioctl gets a valid btrfs_ioctl_vol_args and an open directory.
        name_ioctl(path, "create subvolume", |dir, args| unsafe { btrfs_subvol_create(dir, args) })
    }

    /// Snapshot the subvolume `src` to `dst` (copy-on-write, O(1)).
    pub fn snapshot(&self, src: &Path, dst: &Path) -> Result<()> {
        let (parent, name) = split(dst)?;
        let dir = fs::File::open(parent).map_err(|e| Error::io("open snapshot parent", e))?;
        let source = fs::File::open(src).map_err(|e| Error::io("open snapshot source", e))?;
        let mut args = VolArgsV2 { fd: source.as_raw_fd() as i64, transid: 0, flags: 0, unused: [0; 4], name: [0; 4040] };
        args.name[..name.len()].copy_from_slice(name);
        // SAFETY: `args` is a valid btrfs_ioctl_vol_args_v2; both fds are open.
        unsafe { btrfs_snap_create_v2(dir.as_raw_fd(), &args) }.map_err(|e| Error::sys("snapshot subvolume", e))?;
        Ok(())
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
