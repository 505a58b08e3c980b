//! The allocator's thresholds (`common::malloc`), in a process of its own:
//! the count of mapped blocks is the whole process's, which other tests'
//! threads would move.

#[cfg(all(target_os = "linux", target_env = "gnu"))]
#[test]
fn blocks_below_the_threshold_come_from_the_heap() {
    use common::malloc::{keep_freed_memory, MMAP_THRESHOLD};
    // Blocks the allocator holds mapped on their own (`mmap`).
    // SAFETY: reads the allocator's statistics.
    let mapped = || unsafe { libc::mallinfo() }.hblks;
    assert!(keep_freed_memory());
    let touched = |bytes: usize| {
        let v = vec![1u8; bytes];
        std::hint::black_box(&v);
        (mapped(), v)
    };
    let before = mapped();
    // 4 MiB: mapped on its own under glibc's first threshold (128 KiB).
    let (during, small) = touched(4 << 20);
    assert_eq!(during, before, "a 4 MiB block came from mmap");
    drop(small);
    // Above the threshold it still is: the count above can move.
    let (during, large) = touched(MMAP_THRESHOLD + (1 << 20));
    assert!(
        during > before,
        "a block above the threshold was not mapped"
    );
    drop(large);
}
