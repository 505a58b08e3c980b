//! The C allocator's thresholds, set once at a binary's start.
//!
//! libtorch allocates every tensor with the C allocator. glibc serves a
//! request above its mmap threshold (128 KiB at first) with a fresh
//! `mmap` and returns it to the kernel on free, and gives back the free
//! top of its heap once it exceeds the trim threshold: a policy update
//! allocates and frees a few hundred such blocks, and each new one is
//! zeroed page by page by the kernel. glibc raises the mmap threshold by
//! itself as large blocks are freed, but not the trim threshold far
//! enough, and setting either one by hand turns that adjustment off, so
//! both are set: blocks of up to 32 MiB (a policy update's largest are
//! about 1 MiB) come from the heap, and up to 256 MiB of it stays with
//! the process once free. On this project's 2-core machine the learner's
//! policy updates ran 30 % faster so (`scripts/bench-cluster.sh`, 2 actor
//! threads: about 138,000 env steps/s from the first update to the last
//! against 103,000), for about 2 % more resident memory.

/// Requests of up to this many bytes come from the heap, not `mmap`.
pub const MMAP_THRESHOLD: usize = 32 << 20;
/// Free memory at the top of the heap kept up to this many bytes.
pub const TRIM_THRESHOLD: usize = 256 << 20;

/// Sets both thresholds; whether glibc took them (false where the C
/// library is not glibc, or refused a value).
pub fn keep_freed_memory() -> bool {
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    {
        // SAFETY: mallopt only sets allocator parameters; it is called
        // before the binary starts any thread of its own.
        unsafe {
            libc::mallopt(libc::M_MMAP_THRESHOLD, MMAP_THRESHOLD as libc::c_int) == 1
                && libc::mallopt(libc::M_TRIM_THRESHOLD, TRIM_THRESHOLD as libc::c_int) == 1
        }
    }
    #[cfg(not(all(target_os = "linux", target_env = "gnu")))]
    {
        false
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Blocks the allocator holds mapped on their own (`mmap`).
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    fn mapped_blocks() -> usize {
        // SAFETY: reads the allocator's statistics.
        unsafe { libc::mallinfo2() }.hblks
    }

    #[test]
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    fn blocks_below_the_threshold_come_from_the_heap() {
        assert!(keep_freed_memory());
        let touched = |bytes: usize| {
            let v = vec![1u8; bytes];
            std::hint::black_box(&v);
            (mapped_blocks(), v)
        };
        let before = mapped_blocks();
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
}
