//! Host uid/gid ranges for families. Each family maps uid 0..65536 inside to
//! its own block of host ids, far above any real user's, and blocks are
//! handed out round-robin so a freed block is not reused at once.

use crate::error::{Error, Result};

/// First host id used for sandboxes (2^28, far above distro-managed ids).
pub const FIRST_ID: u32 = 1 << 28;
/// Ids per family (uid 0..65535 inside).
pub const BLOCK: u32 = 65536;
/// Number of blocks (2^28 ids in all).
pub const BLOCKS: u32 = 4096;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct IdRange {
    pub base: u32,
    pub count: u32,
}

#[derive(Debug)]
pub struct IdAllocator {
    used: Vec<bool>,
    next: usize,
}

impl Default for IdAllocator {
    fn default() -> Self {
        Self::new()
    }
}

impl IdAllocator {
    pub fn new() -> IdAllocator {
        IdAllocator { used: vec![false; BLOCKS as usize], next: 0 }
    }

    pub fn allocate(&mut self) -> Result<IdRange> {
        for i in 0..self.used.len() {
            let idx = (self.next + i) % self.used.len();
            if !self.used[idx] {
                self.used[idx] = true;
                self.next = idx + 1;
                return Ok(IdRange { base: FIRST_ID + idx as u32 * BLOCK, count: BLOCK });
            }
        }
        Err(Error::NoUidRange)
    }

    pub fn release(&mut self, range: IdRange) {
        let idx = ((range.base - FIRST_ID) / BLOCK) as usize;
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
        let mut a = IdAllocator::new();
        let r1 = a.allocate().unwrap();
        let r2 = a.allocate().unwrap();
        assert_ne!(r1, r2);
        assert_eq!(r2.base - r1.base, BLOCK);
        a.release(r1);
        // The freed block is not handed out again right away.
        assert_ne!(a.allocate().unwrap(), r1);
    }

    #[test]
    fn exhaustion_is_an_error() {
        let mut a = IdAllocator::new();
        for _ in 0..BLOCKS {
            a.allocate().unwrap();
        }
        assert!(matches!(a.allocate(), Err(Error::NoUidRange)));
    }
}
