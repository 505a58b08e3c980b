//! The choice of measuring backend. The trait every backend implements,
//! [`Oracle`], lives in `common` (re-exported here).

pub use common::config::Backend;
use common::config::Config;

pub use common::oracle::{check_plan, Oracle, OracleError, Spread};

/// Whether this build has the `cuda` backend.
pub const CUDA_BUILT: bool = cfg!(feature = "cuda");

/// Builds the oracle for `backend` from the configuration.
pub fn build(backend: Backend, cfg: &Config) -> Result<Box<dyn Oracle>, OracleError> {
    Ok(match backend {
        Backend::Sim => Box::new(crate::sim::SimOracle::new(cfg.sim.clone(), cfg.memory)),
        Backend::Cpu => Box::new(crate::cpu::CpuOracle::new(cfg.cpu.clone(), cfg.memory)?),
        #[cfg(feature = "cuda")]
        Backend::Cuda => Box::new(crate::cuda::CudaOracle::new(cfg.cuda.clone(), cfg.memory)?),
        #[cfg(not(feature = "cuda"))]
        Backend::Cuda => return Err(not_built()),
    })
}

/// The error of asking a build without the `cuda` feature for that backend.
pub fn not_built() -> OracleError {
    OracleError::Backend {
        backend: "cuda",
        message: "this binary was built without the `cuda` feature; on a GPU host, \
                  `EMBSHARD_CUDA=1 scripts/setup.sh` builds the learner and the benchworker \
                  with it (`--features cuda`; docs/gpu.md)"
            .into(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_cuda_backend_opens_only_where_it_can_and_says_why_not() {
        // Without the feature: a message on how to build it. With it, on a
        // host without a GPU or NCCL: a message naming what is missing. On
        // a GPU host with the feature, it opens.
        match build(Backend::Cuda, &Config::default()) {
            Ok(oracle) => {
                assert!(
                    CUDA_BUILT && tch::Cuda::is_available(),
                    "the cuda backend opened without the feature or a GPU"
                );
                assert_eq!(oracle.name(), "cuda");
            }
            Err(e) => {
                let message = e.to_string();
                assert!(message.starts_with("cuda backend: "), "{message}");
                if !CUDA_BUILT {
                    assert!(message.contains("--features cuda"), "{message}");
                }
            }
        }
    }
}
