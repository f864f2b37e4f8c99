//! The disk under the state directory. Sandbox layers live in the volume,
//! whose image is allocated up front (crates/jail/src/volume.rs), so a full
//! disk cannot fail the writes of sandboxes already running; what still
//! needs room on it is new work: the record of each new sandbox and the
//! copies a freeze makes. Those are refused with 507 while the disk is
//! nearly full, and work again once room is made.

use std::path::Path;

use crate::error::ApiError;

/// Space kept free for records, logs and the server's own bookkeeping.
pub const RESERVE_BYTES: u64 = 256 << 20;

/// Bytes an unprivileged writer could still put on the filesystem of `dir`.
pub fn available_bytes(dir: &Path) -> std::io::Result<u64> {
    let st = nix::sys::statvfs::statvfs(dir).map_err(std::io::Error::from)?;
    Ok(st.blocks_available() as u64 * st.fragment_size() as u64)
}

/// 507 when the disk under `state_dir` has less than the reserve left.
pub fn ensure_room(state_dir: &Path) -> Result<(), ApiError> {
    let Ok(avail) = available_bytes(state_dir) else { return Ok(()) };
    if avail < RESERVE_BYTES {
        return Err(ApiError::NoSpace(format!(
            "the disk under the server's state directory is full ({} MiB free, {} MiB kept in reserve); free space on it and try again",
            avail >> 20,
            RESERVE_BYTES >> 20
        )));
    }
    Ok(())
}
