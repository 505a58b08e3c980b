//! Published constants of TorchRec's planner
//! (`torchrec/distributed/planner/constants.py`), shared by the `sim` oracle
//! and the TorchRec baseline. Bandwidths are in bytes per millisecond, as
//! TorchRec keeps them (GB there means 1024³ bytes).

/// Converts GiB/s to bytes per ms.
pub const fn gibps_to_bytes_per_ms(gibps: f64) -> f64 {
    gibps * (1u64 << 30) as f64 / 1000.0
}

/// `HBM_MEM_BW`: 897 GB/s.
pub const HBM_MEM_BW: f64 = gibps_to_bytes_per_ms(897.0);
/// `INTRA_NODE_BANDWIDTH`: 600 GB/s.
pub const INTRA_NODE_BANDWIDTH: f64 = gibps_to_bytes_per_ms(600.0);
/// `BIGINT_DTYPE`: bytes of one index.
pub const BIGINT_DTYPE: f64 = 8.0;
/// `FULL_BLOCK_EMB_DIM`: lanes of a full block.
pub const FULL_BLOCK_EMB_DIM: u32 = 128;
/// `HALF_BLOCK_PENALTY`.
pub const HALF_BLOCK_PENALTY: f64 = 1.15;
/// `QUARTER_BLOCK_PENALTY`.
pub const QUARTER_BLOCK_PENALTY: f64 = 1.75;
/// `BWD_COMPUTE_MULTIPLIER`.
pub const BWD_COMPUTE_MULTIPLIER: f64 = 2.0;
