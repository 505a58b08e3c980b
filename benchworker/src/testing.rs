//! Tests written once and run on every device this build can drive:
//! [`test_device!`] makes a test of each device from one function taking a
//! [`tch::Device`], as candle's `test_device!` does.
//!
//! The CPU always runs. With the `cuda` feature, the GPU runs where one is
//! visible; with [`REQUIRE_GPU`] set, a missing GPU fails the test instead
//! (`scripts/gpu-check.sh` sets it, so a GPU host cannot pass by skipping).

/// Set to make the GPU tests fail where no GPU is visible.
#[cfg_attr(not(feature = "cuda"), allow(dead_code))]
pub const REQUIRE_GPU: &str = "EMBSHARD_REQUIRE_GPU";

/// Whether a GPU test may run here: a GPU is visible. Without one it says
/// so on stderr and returns false, or fails under [`REQUIRE_GPU`].
#[cfg_attr(not(feature = "cuda"), allow(dead_code))]
pub fn gpu_or_skip(test: &str) -> bool {
    if tch::Cuda::is_available() {
        return true;
    }
    assert!(
        std::env::var_os(REQUIRE_GPU).is_none(),
        "{test}: no GPU visible, and {REQUIRE_GPU} is set"
    );
    eprintln!("{test}: skipped, no GPU visible");
    false
}

/// `test_device!(name, body)` makes the module `name` with a test `cpu`
/// that runs `body(Device::Cpu)` and, with the `cuda` feature, a test
/// `cuda` that runs `body(Device::Cuda(0))`.
macro_rules! test_device {
    ($name:ident, $body:ident) => {
        mod $name {
            #[test]
            fn cpu() {
                super::$body(tch::Device::Cpu)
            }

            #[cfg(feature = "cuda")]
            #[test]
            fn cuda() {
                if $crate::testing::gpu_or_skip(concat!(stringify!($name), "::cuda")) {
                    super::$body(tch::Device::Cuda(0))
                }
            }
        }
    };
}
pub(crate) use test_device;
