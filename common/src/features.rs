//! The networks' view of a table: its 21 features (DESIGN §1) scaled to
//! about [0, 1].
//!
//! DreamShard z-scores `rows`, `size` and `pooling_factor` within each task.
//! embshard scales them by fixed logarithms instead, because its cost network
//! predicts absolute milliseconds: a z-score erases how large a task's tables
//! are (a task of only huge tables would look like one of only small ones),
//! while a fixed scale keeps the same table's features identical in every
//! task, so what the cost network learns on one task carries over to others.
//!
//! | feature | scaled as |
//! |---|---|
//! | dim | `dim / 128` |
//! | rows | `log10(rows) / 8` |
//! | pooling_factor | `log10(1 + pooling) / 3` |
//! | size | `log10(rows × dim) / 10` |
//! | bin_0..bin_16 | as they are (shares in [0, 1]) |

use crate::table::{Table, NUM_FEATURES};

/// A table's scaled features, in the order of [`crate::table::FEATURE_NAMES`].
pub fn scaled(t: &Table) -> [f32; NUM_FEATURES] {
    let mut f = [0.0f32; NUM_FEATURES];
    f[0] = (t.dim as f64 / 128.0) as f32;
    f[1] = ((t.rows.max(1) as f64).log10() / 8.0) as f32;
    f[2] = ((1.0 + t.pooling_factor.max(0.0)).log10() / 3.0) as f32;
    f[3] = (t.size().max(1.0).log10() / 10.0) as f32;
    for (k, b) in t.bins.iter().enumerate() {
        f[4 + k] = *b as f32;
    }
    f
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn realistic_tables_scale_to_about_unit_range() {
        for (rows, dim, pooling) in [(100, 4, 1.0), (20_000_000, 256, 1000.0), (1, 1, 0.01)] {
            let f = scaled(&Table::cold("t", rows, dim, pooling));
            for (i, v) in f.iter().enumerate() {
                assert!(
                    v.is_finite() && (0.0..=2.1).contains(v),
                    "feature {i} = {v}"
                );
            }
        }
    }

    #[test]
    fn scaling_is_monotone_in_each_raw_feature() {
        let base = scaled(&Table::cold("t", 1000, 32, 4.0));
        let more_rows = scaled(&Table::cold("t", 10_000, 32, 4.0));
        let wider = scaled(&Table::cold("t", 1000, 64, 4.0));
        let busier = scaled(&Table::cold("t", 1000, 32, 8.0));
        assert!(more_rows[1] > base[1] && more_rows[3] > base[3]);
        assert!(wider[0] > base[0] && wider[3] > base[3]);
        assert!(busier[2] > base[2]);
        assert_eq!(base[4], 1.0, "bin_0 of a cold table");
    }

    #[test]
    fn values_follow_the_documented_formulas() {
        let f = scaled(&Table::cold("t", 10_000, 100, 999.0));
        let expect = [100.0 / 128.0, 0.5, 1.0, 0.6];
        for (i, e) in expect.iter().enumerate() {
            assert!(
                (f[i] as f64 - e).abs() < 1e-6,
                "feature {i}: {} vs {e}",
                f[i]
            );
        }
    }
}
