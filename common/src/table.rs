//! A table and its 21 features (DESIGN §1), and how much device memory it takes.

use serde::{Deserialize, Serialize};

/// Reuse-histogram bins: bin `k` holds the share of a table's unique rows
/// whose access count per batch falls in `(2^(k-1), 2^k]` (`bin_0`: exactly 1),
/// and `bin_16` everything above 32768.
pub const NUM_BINS: usize = 17;
/// `dim`, `rows`, `pooling_factor`, `size` and the 17 bins.
pub const NUM_FEATURES: usize = 4 + NUM_BINS;
/// Names of the features, in the order of [`Table::features`].
pub const FEATURE_NAMES: [&str; NUM_FEATURES] = [
    "dim",
    "rows",
    "pooling_factor",
    "size",
    "bin_0",
    "bin_1",
    "bin_2",
    "bin_3",
    "bin_4",
    "bin_5",
    "bin_6",
    "bin_7",
    "bin_8",
    "bin_9",
    "bin_10",
    "bin_11",
    "bin_12",
    "bin_13",
    "bin_14",
    "bin_15",
    "bin_16",
];
/// Bytes in a GB as used for memory caps (GiB, as GPU memory is counted).
pub const BYTES_PER_GB: f64 = (1u64 << 30) as f64;

/// One embedding table, described by the features the placement is learnt on.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Table {
    pub name: String,
    /// Hash size: number of rows.
    pub rows: u64,
    /// Embedding dimension.
    pub dim: u32,
    /// Mean number of lookups per sample.
    pub pooling_factor: f64,
    /// Share of unique rows per reuse bin; sums to about 1.
    pub bins: [f64; NUM_BINS],
}

impl Table {
    /// Whether the reuse bins are the defaults that a CSV without bin
    /// columns gives a table of these rows and pooling
    /// ([`crate::generate::default_bins`]): guessed, not the user's.
    pub fn has_default_bins(&self) -> bool {
        self.bins == crate::generate::default_bins(self.rows, self.pooling_factor)
    }

    /// A table whose rows are each read at most once per batch (all of the
    /// reuse histogram in `bin_0`): the coldest access pattern.
    pub fn cold(name: impl Into<String>, rows: u64, dim: u32, pooling_factor: f64) -> Table {
        let mut bins = [0.0; NUM_BINS];
        bins[0] = 1.0;
        Table {
            name: name.into(),
            rows,
            dim,
            pooling_factor,
            bins,
        }
    }

    /// `rows × dim`, the number of weights.
    pub fn size(&self) -> f64 {
        self.rows as f64 * self.dim as f64
    }

    /// The 21 raw features in the order of [`FEATURE_NAMES`].
    pub fn features(&self) -> [f64; NUM_FEATURES] {
        let mut f = [0.0; NUM_FEATURES];
        f[0] = self.dim as f64;
        f[1] = self.rows as f64;
        f[2] = self.pooling_factor;
        f[3] = self.size();
        f[4..].copy_from_slice(&self.bins);
        f
    }

    /// Representative access count of the rows in bin `k`: 1 for `bin_0`, the
    /// geometric middle of `(2^(k-1), 2^k]` above, and 1.5 × 32768 for `bin_16`.
    pub fn bin_count(k: usize) -> f64 {
        match k {
            0 => 1.0,
            _ => 1.5 * (1u64 << (k - 1)) as f64,
        }
    }

    /// Mean accesses per unique row, from the reuse histogram (≥ 1).
    pub fn mean_reuse(&self) -> f64 {
        let total: f64 = self.bins.iter().sum();
        if total <= 0.0 {
            return 1.0;
        }
        let m: f64 = self
            .bins
            .iter()
            .enumerate()
            .map(|(k, b)| b * Self::bin_count(k))
            .sum::<f64>()
            / total;
        m.max(1.0)
    }

    /// Share of lookups that fall on rows accessed more than `threshold` times.
    pub fn lookup_share_above(&self, threshold: f64) -> f64 {
        let (mut above, mut total) = (0.0, 0.0);
        for (k, b) in self.bins.iter().enumerate() {
            let w = b * Self::bin_count(k);
            total += w;
            if Self::bin_count(k) > threshold {
                above += w;
            }
        }
        if total > 0.0 {
            above / total
        } else {
            0.0
        }
    }
}

/// Weight precision on the device.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Precision {
    #[default]
    Fp16,
    Fp32,
}

impl Precision {
    /// The name a config and `--precision` take.
    pub fn name(self) -> &'static str {
        match self {
            Precision::Fp16 => "fp16",
            Precision::Fp32 => "fp32",
        }
    }

    pub fn bytes(self) -> u64 {
        match self {
            Precision::Fp16 => 2,
            Precision::Fp32 => 4,
        }
    }
}

/// A name that is none of a setting's choices.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("unknown {what} `{given}` (expected {choices})")]
pub struct UnknownName {
    pub what: &'static str,
    pub given: String,
    pub choices: &'static str,
}

impl std::str::FromStr for Precision {
    type Err = UnknownName;
    fn from_str(s: &str) -> Result<Self, UnknownName> {
        match s {
            "fp16" => Ok(Precision::Fp16),
            "fp32" => Ok(Precision::Fp32),
            other => Err(UnknownName {
                what: "precision",
                given: other.to_string(),
                choices: "fp16 or fp32",
            }),
        }
    }
}

/// Optimizer whose state lives beside the weights (FBGEMM's fused optimizers).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Optimizer {
    /// No state.
    Sgd,
    /// One fp32 accumulator per row (FBGEMM's default for recommendation models).
    #[default]
    RowwiseAdagrad,
    /// One fp32 accumulator per weight.
    Adagrad,
    /// Two fp32 moments per weight.
    Adam,
}

impl Optimizer {
    /// The name a config and `--optimizer` take.
    pub fn name(self) -> &'static str {
        match self {
            Optimizer::Sgd => "sgd",
            Optimizer::RowwiseAdagrad => "rowwise_adagrad",
            Optimizer::Adagrad => "adagrad",
            Optimizer::Adam => "adam",
        }
    }

    /// State bytes for a table of `rows × dim`.
    pub fn state_bytes(self, rows: u64, dim: u32) -> u64 {
        match self {
            Optimizer::Sgd => 0,
            Optimizer::RowwiseAdagrad => rows * 4,
            Optimizer::Adagrad => rows * dim as u64 * 4,
            Optimizer::Adam => rows * dim as u64 * 8,
        }
    }
}

impl std::str::FromStr for Optimizer {
    type Err = UnknownName;
    fn from_str(s: &str) -> Result<Self, UnknownName> {
        match s {
            "sgd" => Ok(Optimizer::Sgd),
            "rowwise_adagrad" => Ok(Optimizer::RowwiseAdagrad),
            "adagrad" => Ok(Optimizer::Adagrad),
            "adam" => Ok(Optimizer::Adam),
            other => Err(UnknownName {
                what: "optimizer",
                given: other.to_string(),
                choices: "sgd, rowwise_adagrad, adagrad or adam",
            }),
        }
    }
}

/// How many bytes of device memory a table occupies.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct MemoryModel {
    pub precision: Precision,
    pub optimizer: Optimizer,
}

impl MemoryModel {
    /// Weights plus optimizer state, in bytes.
    pub fn table_bytes(&self, t: &Table) -> u64 {
        t.rows * t.dim as u64 * self.precision.bytes() + self.optimizer.state_bytes(t.rows, t.dim)
    }

    /// Weights plus optimizer state, in GB (GiB).
    pub fn table_gb(&self, t: &Table) -> f64 {
        self.table_bytes(t) as f64 / BYTES_PER_GB
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;

    pub fn table(name: &str, rows: u64, dim: u32, pooling: f64) -> Table {
        let mut bins = [0.0; NUM_BINS];
        bins[0] = 0.5;
        bins[1] = 0.3;
        bins[4] = 0.2;
        Table {
            name: name.to_string(),
            rows,
            dim,
            pooling_factor: pooling,
            bins,
        }
    }

    #[test]
    fn memory_counts_weights_and_optimizer_state() {
        let t = table("t", 1000, 64, 2.0);
        let fp16_sgd = MemoryModel {
            precision: Precision::Fp16,
            optimizer: Optimizer::Sgd,
        };
        assert_eq!(fp16_sgd.table_bytes(&t), 1000 * 64 * 2);
        let fp32_rw = MemoryModel {
            precision: Precision::Fp32,
            optimizer: Optimizer::RowwiseAdagrad,
        };
        assert_eq!(fp32_rw.table_bytes(&t), 1000 * 64 * 4 + 1000 * 4);
        let fp32_adam = MemoryModel {
            precision: Precision::Fp32,
            optimizer: Optimizer::Adam,
        };
        assert_eq!(fp32_adam.table_bytes(&t), 1000 * 64 * 12);
    }

    #[test]
    fn features_are_in_documented_order() {
        let t = table("t", 1000, 64, 2.5);
        let f = t.features();
        assert_eq!(f.len(), NUM_FEATURES);
        assert_eq!(f[0], 64.0);
        assert_eq!(f[1], 1000.0);
        assert_eq!(f[2], 2.5);
        assert_eq!(f[3], 64000.0);
        assert_eq!(f[4], 0.5);
        assert_eq!(f[8], 0.2);
    }

    #[test]
    fn mean_reuse_grows_with_hot_rows() {
        let cold = table("c", 10, 8, 1.0);
        let mut hot = cold.clone();
        hot.bins = [0.0; NUM_BINS];
        hot.bins[10] = 1.0;
        assert!(cold.mean_reuse() < 5.0);
        assert_eq!(hot.mean_reuse(), 1.5 * 512.0);
        assert!(hot.lookup_share_above(100.0) > 0.99);
        assert_eq!(cold.lookup_share_above(100.0), 0.0);
    }
}
