//! The heap trim (src/heap.rs) against glibc's real malloc. One test in a
//! binary of its own: the resident memory it reads is the whole process's.

use forkbox_server::heap;

/// The process's resident anonymous memory, from /proc/self/status.
fn rss_anon_kib() -> u64 {
    let status = std::fs::read_to_string("/proc/self/status").unwrap();
    let line = status.lines().find(|l| l.starts_with("RssAnon:")).unwrap();
    line.split_whitespace().nth(1).unwrap().parse().unwrap()
}

#[test]
fn a_fragmented_heap_is_given_back_only_above_the_threshold() {
    if heap::free_bytes().is_none() {
        panic!("these tests run on glibc: forkbox's builds use it");
    }
    // 64 MiB in 4 KB blocks, every 16th kept: no free run reaches the top
    // of the heap, so free() alone gives nothing back.
    let blocks: Vec<Vec<u8>> = (0..16 * 1024).map(|i| vec![i as u8 | 1; 4000]).collect();
    let kept: Vec<Vec<u8>> = blocks.into_iter().enumerate().filter(|(i, _)| i % 16 == 0).map(|(_, b)| b).collect();
    let held = rss_anon_kib();
    let free = heap::free_bytes().unwrap();
    assert!(free >= 48 << 20, "malloc should hold the freed blocks: {free} bytes free");

    // At the edge: one byte more than malloc holds free is no trim.
    assert!(heap::trim_above(free + 1).is_none(), "trimmed below the threshold");
    assert!(rss_anon_kib() + 8 * 1024 > held, "memory went back without a trim: {} of {held} KiB", rss_anon_kib());

    let trimmed = heap::trim_above(free).expect("a heap holding its threshold is trimmed");
    assert_eq!(trimmed.free_before, free);
    let after = rss_anon_kib();
    assert!(after + 40 * 1024 < held, "the trim gave back {} KiB of about 56 MiB freed", held.saturating_sub(after));
    // What was kept is intact.
    assert!(kept.iter().enumerate().all(|(j, b)| b.iter().all(|&x| x == ((j * 16) as u8 | 1))));
}
