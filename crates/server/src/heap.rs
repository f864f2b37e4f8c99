//! Gives the heap malloc holds free back to the kernel.
//!
//! glibc's malloc keeps an arena per busy thread and returns freed memory
//! to the kernel only from the top of a heap; what is freed between live
//! allocations stays resident. Under bench/load.py (50 clients, 36 server
//! threads) the server's RSS rose from 45 to 160–220 MiB and stayed there
//! with every sandbox gone, though about 100 MiB of it was free:
//! `malloc_trim(0)` took it to 63 MiB. So a server trims its heap every
//! [`TRIM_EVERY`] while malloc holds more than [`TRIM_ABOVE`] free. A trim
//! `madvise`s the free pages away; the chunks stay in malloc's lists, and
//! a page that is used again is faulted back in.
//!
//! Other C libraries than glibc are left to their own ways: there the
//! functions say `None`.

use std::time::{Duration, Instant};

/// How often a server looks at its heap.
pub const TRIM_EVERY: Duration = Duration::from_secs(10);

/// Free bytes malloc may keep before a server trims (the free bytes
/// count pages already given back, so this also bounds how often an idle
/// server trims for nothing: a trim of such a heap is cheap).
pub const TRIM_ABOVE: usize = 16 << 20;

/// What a trim found and what it cost.
#[derive(Debug, Clone, Copy)]
pub struct Trimmed {
    /// Free bytes malloc held over all its arenas, before the trim.
    pub free_before: usize,
    pub took: Duration,
}

/// Bytes malloc holds free over all its arenas (pages already given back
/// included), or `None` when the C library is not glibc.
pub fn free_bytes() -> Option<usize> {
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    {
        // SAFETY: mallinfo2 only reads malloc's own counters, under its locks.
        Some(unsafe { libc::mallinfo2() }.fordblks)
    }
    #[cfg(not(all(target_os = "linux", target_env = "gnu")))]
    {
        None
    }
}

/// Trims the heap when malloc holds at least `above` bytes free; `None`
/// when it holds fewer or the C library is not glibc.
pub fn trim_above(above: usize) -> Option<Trimmed> {
    let free_before = free_bytes()?;
    if free_before < above {
        return None;
    }
    let started = Instant::now();
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    // SAFETY: malloc_trim takes malloc's own locks; 0 keeps no pad at the top.
    unsafe {
        libc::malloc_trim(0);
    }
    Some(Trimmed { free_before, took: started.elapsed() })
}

/// Trims the heap every [`TRIM_EVERY`], for as long as the runtime runs.
pub async fn keep_trimmed() {
    if free_bytes().is_none() {
        return;
    }
    let mut every = tokio::time::interval(TRIM_EVERY);
    every.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    every.tick().await; // the first tick is now: nothing was freed yet
    loop {
        every.tick().await;
        // A trim takes malloc's locks arena by arena: off the async workers.
        if let Ok(Some(t)) = tokio::task::spawn_blocking(|| trim_above(TRIM_ABOVE)).await {
            tracing::debug!(free_mib = t.free_before >> 20, took_us = t.took.as_micros() as u64, "trimmed the heap");
        }
    }
}
