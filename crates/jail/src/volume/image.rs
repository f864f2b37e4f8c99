//! The volume's image file, when the state directory is not on btrfs: a
//! file formatted as btrfs and loop-mounted at `<state>/volume` (one loop
//! device for the whole server, detached when the volume is unmounted
//! because the mount sets `autoclear`).
//!
//! The image is always allocated, never sparse: when the disk under a
//! sparse image fills up, the loop device fails btrfs's writes with EIO and
//! btrfs turns the whole volume read-only, breaking every sandbox at once
//! (seen here). Allocated, the volume's own free space is all a sandbox can
//! run out of, and btrfs answers that with a clean ENOSPC to the writer.
//! The image starts small and grows (growth.rs): each step allocates the
//! new blocks first and only then tells the loop device and btrfs, so the
//! file system never has a block the disk does not. For the same reason it
//! is mounted `nodiscard`: discards would punch holes back into the image.

use std::fs;
use std::os::fd::AsRawFd;
use std::path::{Path, PathBuf};
use std::process::Command;

use crate::error::{Error, Result};
use crate::tools::require_tool;

/// `LOOP_SET_DIRECT_IO` and `LOOP_SET_CAPACITY` (linux/loop.h).
const LOOP_SET_DIRECT_IO: libc::c_ulong = 0x4C08;
const LOOP_SET_CAPACITY: libc::c_ulong = 0x4C07;

/// Make a new image of `bytes` at `image`: allocate it, format it, and
/// only then give it its name, so a crash leaves no half-made image.
pub(super) fn create(image: &Path, bytes: u64) -> Result<()> {
    require_tool("mkfs.btrfs", "btrfs-progs")?;
    let partial = image.with_extension("img.partial");
    let file = fs::File::create(&partial).map_err(|e| Error::io("create volume image", e))?;
    if let Err(e) = rustix::fs::fallocate(&file, rustix::fs::FallocateFlags::empty(), 0, bytes) {
        drop(file);
        let _ = fs::remove_file(&partial);
        return Err(Error::io("allocate the volume image", e.into()));
    }
    drop(file);
    run(Command::new("mkfs.btrfs").args(["-q", "-K", "-L", "forkbox", "-m", "single"]).arg(&partial), "mkfs.btrfs")?;
    fs::rename(&partial, image).map_err(|e| Error::io("name the volume image", e))
}

/// An image made sparse by an older forkbox: allocate its holes, so that a
/// full disk cannot turn the volume read-only. Without room, go on as it
/// was, but say what that risks.
pub(super) fn allocate_existing(image: &Path) {
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

/// Loop-mount `image` at `root`.
///
/// `metadata_ratio=8` has btrfs allocate a metadata chunk after every 8
/// data chunks, so a volume that fills up with file data keeps some room
/// for metadata. Without it all of a full volume's space can be in data
/// chunks: deleting part of a file then frees data space, but no file can
/// be created until btrfs hands back a chunk a delete emptied (about 15 s
/// later). Seen by hand on a 1 GiB image grown to 2 GiB and filled:
/// after 172 MiB were deleted, no file could be made without the option
/// and 2,000 with it; a volume grown while being written may still get
/// its metadata chunk late.
pub(super) fn mount(image: &Path, root: &Path) -> Result<()> {
    run(
        Command::new("mount").args(["-t", "btrfs", "-o", "loop,noatime,nodiscard,user_subvol_rm_allowed,metadata_ratio=8"]).arg(image).arg(root),
        "mount volume",
    )
}

/// The loop device under the volume mounted at `root`.
pub(super) fn loop_device(root: &Path) -> Option<PathBuf> {
    mount_source(root).filter(|d| d.starts_with("/dev/loop")).map(PathBuf::from)
}

/// Have the loop device read and write the image with direct I/O.
/// Buffered, every block of the volume sits in the page cache twice
/// (btrfs's and the image file's) and the host's writeback threads,
/// which no sandbox's cgroup pays for, copy each write once more: a
/// sandbox rewriting a file with fsync then costs its neighbours'
/// exec latency (bench/noisy.py). A file system that cannot do direct
/// I/O under the image keeps the buffered loop (logged).
pub(super) fn set_direct_io(device: &Path) {
    if let Err(e) = loop_ioctl(device, LOOP_SET_DIRECT_IO, 1) {
        tracing::warn!(device = %device.display(), error = %e, "the volume's loop device stays buffered (no direct I/O)");
    }
}

/// Grow the image to `bytes` and the file system on it with it: allocate
/// the new blocks, have the loop device read the new size, resize btrfs.
/// A failure at any step leaves a volume that works at its old size (an
/// image longer than its file system is harmless, and the next grow picks
/// it up).
pub(super) fn extend(image: &Path, device: &Path, root: &Path, bytes: u64) -> Result<()> {
    let file = fs::OpenOptions::new().write(true).open(image).map_err(|e| Error::io("open the volume image", e))?;
    rustix::fs::fallocate(&file, rustix::fs::FallocateFlags::empty(), 0, bytes).map_err(|e| Error::io("allocate the volume image", e.into()))?;
    loop_ioctl(device, LOOP_SET_CAPACITY, 0).map_err(|e| Error::io("tell the loop device the image's new size", e))?;
    super::btrfs::resize_to_device(root)
}

fn loop_ioctl(device: &Path, request: libc::c_ulong, arg: libc::c_ulong) -> std::io::Result<()> {
    let f = fs::File::open(device)?;
    // SAFETY: both loop ioctls take their argument by value on an open loop device.
    let rc = unsafe { libc::ioctl(f.as_raw_fd(), request, arg) };
    if rc == 0 {
        Ok(())
    } else {
        Err(std::io::Error::last_os_error())
    }
}

pub(super) fn run(cmd: &mut Command, what: &'static str) -> Result<()> {
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
    info.lines().rev().find_map(|line| {
        // `id parent major:minor root mount-point options... - fstype source super-options`
        let (left, right) = line.split_once(" - ")?;
        let point = left.split(' ').nth(4)?;
        (Path::new(point) == root).then(|| right.split(' ').nth(1).map(str::to_string))?
    })
}
