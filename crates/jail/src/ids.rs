//! Host uid/gid ranges for families. Each family maps uid 0..65536 inside to
//! its own block of host ids, far above any real user's. Each server takes a
//! slot of blocks, claimed with a host-wide lock file, so two servers on one
//! host never hand out the same host ids; within a slot, blocks are handed
//! out round-robin so a freed block is not reused at once.

use std::path::Path;

use crate::error::{Error, Result};

/// First host id used for sandboxes (2^28, far above distro-managed ids).
pub const FIRST_ID: u32 = 1 << 28;
/// Ids per family (uid 0..65535 inside).
pub const BLOCK: u32 = 65536;
/// Families per server (its slot).
pub const SLOT_BLOCKS: u32 = 1024;
/// Slots between 2^28 and 2^32.
pub const SLOTS: u32 = ((u32::MAX - FIRST_ID) / (SLOT_BLOCKS * BLOCK)) - 1;
/// Where servers claim slots (host-wide; tmpfs, so a reboot frees them).
pub const SLOT_LOCK_DIR: &str = "/run/forkbox/id-slots";

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct IdRange {
    pub base: u32,
    pub count: u32,
}

#[derive(Debug)]
pub struct IdAllocator {
    first: u32,
    used: Vec<bool>,
    next: usize,
    /// Held for the allocator's life: our claim on the slot.
    _slot_lock: Option<std::fs::File>,
}

impl IdAllocator {
    /// Claim the first free slot on this host.
    pub fn claim(lock_dir: &Path) -> Result<IdAllocator> {
        std::fs::create_dir_all(lock_dir).map_err(|e| Error::io("create id slot dir", e))?;
        for slot in 0..SLOTS {
            if let Some(a) = Self::try_claim(lock_dir, slot)? {
                return Ok(a);
            }
        }
        Err(Error::NoUidRange)
    }

    /// Claim `slot` if no other server holds it.
    fn try_claim(lock_dir: &Path, slot: u32) -> Result<Option<IdAllocator>> {
        let file = std::fs::OpenOptions::new()
            .create(true)
            .truncate(false)
            .write(true)
            .open(lock_dir.join(format!("{slot}.lock")))
            .map_err(|e| Error::io("open id slot lock", e))?;
        if !crate::sys::try_lock_exclusive(&file) {
            return Ok(None);
        }
        let mut a = IdAllocator::in_slot(slot);
        a._slot_lock = Some(file);
        Ok(Some(a))
    }

    /// Claim `preferred` if it is free (the slot a crashed predecessor on
    /// the same state directory used, whose families may be adopted), else
    /// the first free slot.
    pub fn claim_preferring(lock_dir: &Path, preferred: Option<u32>) -> Result<IdAllocator> {
        if let Some(slot) = preferred.filter(|s| *s < SLOTS) {
            std::fs::create_dir_all(lock_dir).map_err(|e| Error::io("create id slot dir", e))?;
            if let Some(a) = Self::try_claim(lock_dir, slot)? {
                return Ok(a);
            }
        }
        Self::claim(lock_dir)
    }

    /// The slot this allocator hands out from.
    pub fn slot(&self) -> u32 {
        (self.first - FIRST_ID) / (SLOT_BLOCKS * BLOCK)
    }

    /// Mark `range` used (an adopted family's); false if it is not a whole
    /// block of this slot, or is taken.
    pub fn take(&mut self, range: IdRange) -> bool {
        if range.count != BLOCK || range.base < self.first || !(range.base - self.first).is_multiple_of(BLOCK) {
            return false;
        }
        match self.used.get_mut(((range.base - self.first) / BLOCK) as usize) {
            Some(used) if !*used => {
                *used = true;
                true
            }
            _ => false,
        }
    }

    /// The allocator of `slot`, without claiming it (for tests).
    pub fn in_slot(slot: u32) -> IdAllocator {
        IdAllocator { first: FIRST_ID + slot * SLOT_BLOCKS * BLOCK, used: vec![false; SLOT_BLOCKS as usize], next: 0, _slot_lock: None }
    }

    pub fn allocate(&mut self) -> Result<IdRange> {
        for i in 0..self.used.len() {
            let idx = (self.next + i) % self.used.len();
            if !self.used[idx] {
                self.used[idx] = true;
                self.next = idx + 1;
                return Ok(IdRange { base: self.first + idx as u32 * BLOCK, count: BLOCK });
            }
        }
        Err(Error::NoUidRange)
    }

    pub fn release(&mut self, range: IdRange) {
        if range.base < self.first {
            return;
        }
        let idx = ((range.base - self.first) / BLOCK) as usize;
        if let Some(slot) = self.used.get_mut(idx) {
            *slot = false;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ranges_are_distinct_and_round_robin() {
        let mut a = IdAllocator::in_slot(0);
        let r1 = a.allocate().unwrap();
        let r2 = a.allocate().unwrap();
        assert_ne!(r1, r2);
        assert_eq!(r2.base - r1.base, BLOCK);
        a.release(r1);
        // The freed block is not handed out again right away.
        assert_ne!(a.allocate().unwrap(), r1);
    }

    #[test]
    fn adopted_ranges_are_taken_once_and_only_from_the_slot() {
        let mut a = IdAllocator::in_slot(2);
        let r = a.allocate().unwrap();
        a.release(r);
        assert!(a.take(r));
        assert!(!a.take(r));
        assert!(!a.take(IdRange { base: r.base + 1, count: BLOCK }));
        assert!(!a.take(IdRange { base: IdAllocator::in_slot(3).first, count: BLOCK }));
        assert_eq!(a.slot(), 2);
    }

    #[test]
    fn exhaustion_is_an_error() {
        let mut a = IdAllocator::in_slot(3);
        for _ in 0..SLOT_BLOCKS {
            a.allocate().unwrap();
        }
        assert!(matches!(a.allocate(), Err(Error::NoUidRange)));
    }

    #[test]
    fn slots_stay_within_32_bit_ids_and_do_not_overlap() {
        let last = IdAllocator::in_slot(SLOTS - 1);
        let end = last.first as u64 + SLOT_BLOCKS as u64 * BLOCK as u64;
        assert!(end <= u32::MAX as u64);
        assert_eq!(IdAllocator::in_slot(1).first - IdAllocator::in_slot(0).first, SLOT_BLOCKS * BLOCK);
    }

    #[test]
    fn two_claims_get_different_slots() {
        let dir = tempfile::tempdir().unwrap();
        let a = IdAllocator::claim(dir.path()).unwrap();
        let b = IdAllocator::claim(dir.path()).unwrap();
        assert_ne!(a.first, b.first);
        drop(a);
        // Other tests of this process fork; a child forked while `a` was
        // open holds a copy of its lock until it exits, so give it a moment.
        let mut again = None;
        for _ in 0..100 {
            again = IdAllocator::try_claim(dir.path(), 0).unwrap();
            if again.is_some() {
                break;
            }
            std::thread::sleep(std::time::Duration::from_millis(50));
        }
        assert_eq!(again.map(|c| c.first), Some(FIRST_ID), "a released slot is claimed again");
        assert_ne!(IdAllocator::claim(dir.path()).unwrap().first, b.first);
    }
}
