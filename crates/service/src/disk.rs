//! Room for new work. Sandbox layers live in the volume, whose image is
//! allocated before btrfs may use it (crates/jail/src/volume), so a full
//! disk cannot fail the writes of sandboxes already running; what still
//! needs room on the disk is new work: the record of each new sandbox and
//! the copies a freeze makes. And a new sandbox needs room in the volume.
//! New work is refused with 507 while either is full, and works again once
//! room is made.

use std::path::Path;

use crate::error::Error;

/// Space kept free for records, logs and the server's own bookkeeping.
pub const RESERVE_BYTES: u64 = 256 << 20;

/// Bytes an unprivileged writer could still put on the filesystem of `dir`.
pub fn available_bytes(dir: &Path) -> std::io::Result<u64> {
    let st = nix::sys::statvfs::statvfs(dir).map_err(std::io::Error::from)?;
    Ok(st.blocks_available() as u64 * st.fragment_size() as u64)
}

/// Free space in the volume under which new sandboxes are refused, when it
/// cannot grow.
pub const VOLUME_FLOOR_BYTES: u64 = 64 << 20;

/// 507 when the disk under `state_dir` has less than the reserve left, or
/// the sandbox volume is full and cannot grow.
pub fn ensure_room_for_sandboxes(state_dir: &Path, engine: &dyn crate::engine::Engine) -> Result<(), Error> {
    ensure_room(state_dir)?;
    let Ok(usage) = engine.volume_usage() else { return Ok(()) };
    if usage.free_bytes >= VOLUME_FLOOR_BYTES || usage.can_grow() {
        return Ok(());
    }
    let why = if usage.size_bytes >= usage.max_bytes {
        format!("it is at its cap of {} MiB (--volume-gib)", usage.max_bytes >> 20)
    } else {
        "the disk under it keeps its reserve (--disk-reserve-gib)".to_string()
    };
    Err(Error::NoSpace(format!(
        "the sandbox volume is full ({} MiB free of {} MiB) and cannot grow: {why}; delete sandboxes or checkpoints and try again",
        usage.free_bytes >> 20,
        usage.size_bytes >> 20
    )))
}

/// 507 when the disk under `state_dir` has less than the reserve left.
pub fn ensure_room(state_dir: &Path) -> Result<(), Error> {
    let Ok(avail) = available_bytes(state_dir) else { return Ok(()) };
    if avail < RESERVE_BYTES {
        return Err(Error::NoSpace(format!(
            "the disk under the server's state directory is full ({} MiB free, {} MiB kept in reserve); free space on it and try again",
            avail >> 20,
            RESERVE_BYTES >> 20
        )));
    }
    Ok(())
}
