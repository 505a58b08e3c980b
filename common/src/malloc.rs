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
//! both are set: blocks of up to 32 MiB (a policy update's largest take a
//! few MiB) come from the heap, and up to 256 MiB of it stays with the
//! process once free. On this project's 2-core machine the learner's
//! policy updates ran 27 % faster so (`scripts/bench-cluster.sh`, 2 actor
//! threads: 134,144 env steps/s from the first update to the last against
//! 105,759), for about 2 % more resident memory. Tested in
//! `tests/malloc.rs`, a process of its own.

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
