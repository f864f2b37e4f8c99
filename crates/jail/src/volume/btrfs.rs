//! The btrfs ioctls the volume uses, as the kernel's uapi
//! (`linux/btrfs.h`) defines them, and small safe wrappers.

use std::ffi::CString;
use std::fs;
use std::os::fd::AsRawFd;
use std::os::unix::ffi::OsStrExt;
use std::path::Path;

use crate::error::{Error, Result};

pub(super) const BTRFS_SUPER_MAGIC: i64 = 0x9123_683e;
const BTRFS_PATH_NAME_MAX: usize = 4087;

#[repr(C)]
pub(super) struct VolArgs {
    pub fd: i64,
    pub name: [u8; BTRFS_PATH_NAME_MAX + 1],
}

impl VolArgs {
    /// Arguments naming `name` (at most `BTRFS_PATH_NAME_MAX` bytes).
    pub fn named(name: &[u8]) -> VolArgs {
        let mut args = VolArgs { fd: 0, name: [0; BTRFS_PATH_NAME_MAX + 1] };
        args.name[..name.len()].copy_from_slice(name);
        args
    }
}

/// `struct btrfs_ioctl_vol_args_v2` as the create and snapshot ioctls read it.
#[repr(C)]
pub(super) struct VolArgsV2 {
    pub fd: i64,
    pub transid: u64,
    pub flags: u64,
    /// With `BTRFS_SUBVOL_QGROUP_INHERIT`: the size of and a pointer to
    /// a `btrfs_qgroup_inherit`.
    pub inherit_size: u64,
    pub inherit: *const QgroupInherit,
    pub unused: [u64; 2],
    pub name: [u8; 4040],
}

/// `struct btrfs_qgroup_limit`.
#[repr(C)]
#[derive(Default)]
pub(super) struct QgroupLimit {
    pub flags: u64,
    pub max_rfer: u64,
    pub max_excl: u64,
    pub rsv_rfer: u64,
    pub rsv_excl: u64,
}

/// `struct btrfs_qgroup_inherit` with no qgroups to copy or join: only
/// the new subvolume's limit.
#[repr(C)]
pub(super) struct QgroupInherit {
    pub flags: u64,
    pub num_qgroups: u64,
    pub num_ref_copies: u64,
    pub num_excl_copies: u64,
    pub lim: QgroupLimit,
}

#[repr(C)]
pub(super) struct QuotaCtlArgs {
    pub cmd: u64,
    pub status: u64,
}

#[repr(C)]
pub(super) struct QgroupCreateArgs {
    pub create: u64,
    pub qgroupid: u64,
}

#[repr(C)]
pub(super) struct QgroupLimitArgs {
    /// 0: the subvolume the ioctl's descriptor is in.
    pub qgroupid: u64,
    pub lim: QgroupLimit,
}

/// `struct btrfs_ioctl_fs_info_args`, of which we need the filesystem id.
#[repr(C)]
pub(super) struct FsInfoArgs {
    pub max_id: u64,
    pub num_devices: u64,
    pub fsid: [u8; 16],
    pub rest: [u8; 992],
}

pub(super) const BTRFS_SUBVOL_QGROUP_INHERIT: u64 = 1 << 2;
pub(super) const BTRFS_QGROUP_INHERIT_SET_LIMITS: u64 = 1 << 0;
pub(super) const BTRFS_QGROUP_LIMIT_MAX_RFER: u64 = 1 << 0;
/// `max_rfer` value that removes a limit.
pub(super) const BTRFS_QGROUP_LIMIT_CLEAR: u64 = u64::MAX;
pub(super) const BTRFS_QUOTA_CTL_ENABLE_SIMPLE_QUOTA: u64 = 4;
/// `struct btrfs_ioctl_search_key`: a slice of one tree's keys.
#[repr(C)]
#[derive(Default)]
pub(super) struct SearchKey {
    pub tree_id: u64,
    pub min_objectid: u64,
    pub max_objectid: u64,
    pub min_offset: u64,
    pub max_offset: u64,
    pub min_transid: u64,
    pub max_transid: u64,
    pub min_type: u32,
    pub max_type: u32,
    pub nr_items: u32,
    pub unused: u32,
    pub unused_more: [u64; 4],
}

/// `struct btrfs_ioctl_search_args`: the key and room for what it finds.
#[repr(C)]
pub(super) struct SearchArgs {
    pub key: SearchKey,
    pub buf: [u8; 4096 - std::mem::size_of::<SearchKey>()],
}

const BTRFS_ROOT_TREE_OBJECTID: u64 = 1;
/// A deleted subvolume's root waits under this id, as an orphan item
/// keyed by its own id, until the cleaner has dropped it.
const BTRFS_ORPHAN_OBJECTID: u64 = -5i64 as u64;
const BTRFS_ORPHAN_ITEM_KEY: u32 = 48;

/// Subvolume ids start here (below: the filesystem's own trees).
pub(super) const BTRFS_FIRST_FREE_OBJECTID: u64 = 256;

nix::ioctl_write_ptr!(btrfs_resize, 0x94, 3, VolArgs);
nix::ioctl_none!(btrfs_sync, 0x94, 8);
nix::ioctl_write_ptr!(btrfs_snap_destroy, 0x94, 15, VolArgs);
nix::ioctl_readwrite!(btrfs_tree_search, 0x94, 17, SearchArgs);
nix::ioctl_write_ptr!(btrfs_snap_create_v2, 0x94, 23, VolArgsV2);
nix::ioctl_write_ptr!(btrfs_subvol_create_v2, 0x94, 24, VolArgsV2);
nix::ioctl_read!(btrfs_fs_info, 0x94, 31, FsInfoArgs);
nix::ioctl_readwrite!(btrfs_quota_ctl, 0x94, 40, QuotaCtlArgs);
nix::ioctl_write_ptr!(btrfs_qgroup_create, 0x94, 42, QgroupCreateArgs);
nix::ioctl_read!(btrfs_qgroup_limit, 0x94, 43, QgroupLimitArgs);

/// Grow the (single-device) btrfs mounted at `root` to all of its device.
pub(super) fn resize_to_device(root: &Path) -> Result<()> {
    let dir = fs::File::open(root).map_err(|e| Error::io("open volume", e))?;
    let args = VolArgs::named(b"max");
    // SAFETY: `args` is a valid btrfs_ioctl_vol_args naming "max"; the fd is open.
    unsafe { btrfs_resize(dir.as_raw_fd(), &args) }.map_err(|e| Error::sys("resize the volume's file system", e))?;
    Ok(())
}

/// Commit the file system and wake its cleaner: subvolumes deleted before
/// an unmount are only reclaimed once the cleaner runs, which otherwise
/// waits for the next periodic commit (30 s), and space a crashed or
/// short-lived predecessor deleted would read as used until then.
pub(super) fn wake_cleaner(root: &Path) -> Result<()> {
    let dir = fs::File::open(root).map_err(|e| Error::io("open volume", e))?;
    // SAFETY: BTRFS_IOC_SYNC takes no argument; the fd is open.
    unsafe { btrfs_sync(dir.as_raw_fd()) }.map_err(|e| Error::sys("sync the volume", e))?;
    Ok(())
}

/// Whether a deleted subvolume still waits for the cleaner (its space
/// is not free yet).
pub(super) fn deletions_pending(root: &Path) -> Result<bool> {
    let dir = fs::File::open(root).map_err(|e| Error::io("open volume", e))?;
    let mut args = SearchArgs {
        key: SearchKey {
            tree_id: BTRFS_ROOT_TREE_OBJECTID,
            min_objectid: BTRFS_ORPHAN_OBJECTID,
            max_objectid: BTRFS_ORPHAN_OBJECTID,
            max_offset: u64::MAX,
            max_transid: u64::MAX,
            min_type: BTRFS_ORPHAN_ITEM_KEY,
            max_type: BTRFS_ORPHAN_ITEM_KEY,
            nr_items: 1,
            ..Default::default()
        },
        buf: [0; 4096 - std::mem::size_of::<SearchKey>()],
    };
    // SAFETY: `args` is a valid btrfs_ioctl_search_args the ioctl fills in; the fd is open.
    unsafe { btrfs_tree_search(dir.as_raw_fd(), &mut args) }.map_err(|e| Error::sys("search the volume's root tree", e))?;
    Ok(args.key.nr_items > 0)
}

/// The id of the btrfs filesystem `file` is on; None elsewhere.
pub(crate) fn fsid(file: &fs::File) -> Option<[u8; 16]> {
    if nix::sys::statfs::fstatfs(file).ok()?.filesystem_type() != nix::sys::statfs::BTRFS_SUPER_MAGIC {
        return None;
    }
    let mut info = FsInfoArgs { max_id: 0, num_devices: 0, fsid: [0; 16], rest: [0; 992] };
    // SAFETY: `info` is a zeroed `struct btrfs_ioctl_fs_info_args` the ioctl fills in.
    unsafe { btrfs_fs_info(file.as_raw_fd(), &mut info) }.ok()?;
    Some(info.fsid)
}

pub(super) fn is_btrfs(path: &Path) -> Result<bool> {
    let c = CString::new(path.as_os_str().as_bytes()).map_err(|_| Error::Invalid("path with NUL".into()))?;
    // SAFETY: zeroed statfs is a valid out-parameter; `c` is NUL-terminated.
    let mut st: libc::statfs = unsafe { std::mem::zeroed() };
    // SAFETY: see above.
    if unsafe { libc::statfs(c.as_ptr(), &mut st) } != 0 {
        return Err(Error::io("statfs", std::io::Error::last_os_error()));
    }
    Ok(st.f_type as i64 == BTRFS_SUPER_MAGIC)
}
