//! The shapes and table features a model was trained on, kept beside its
//! run (`trained_shapes.json`), so that `plan` and `eval` can say when a
//! task lies outside them.

use std::path::Path;

/// The lowest and highest of each feature of `tables` (`[∞, −∞]` each for
/// none).
fn feature_ranges<'t>(tables: impl Iterator<Item = &'t common::Table>) -> Vec<[f64; 2]> {
    let mut ranges = vec![[f64::INFINITY, f64::NEG_INFINITY]; common::table::NUM_FEATURES];
    for t in tables {
        for (r, v) in ranges.iter_mut().zip(t.features()) {
            r[0] = r[0].min(v);
            r[1] = r[1].max(v);
        }
    }
    ranges
}

/// The shapes of the tasks a model was trained on, kept beside its run
/// (`trained_shapes.json`) so that `plan` and `eval` can say when a task
/// lies far outside them: what carries over is the number of tables per
/// device (README, "Training for the shapes you place").
#[derive(Debug, Clone, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct TrainedShapes {
    /// Fewest and most tables of a training task.
    pub tables: [usize; 2],
    /// Fewest and most devices of a training task.
    pub devices: [usize; 2],
    /// Lowest and highest tables per device of a training task.
    pub tables_per_device: [f64; 2],
    /// Lowest and highest of each table feature (in the order of
    /// `common::table::FEATURE_NAMES`: dim, rows, pooling, size, bins)
    /// over the training tables; absent in runs from before they were kept.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub features: Option<Vec<[f64; 2]>>,
}

/// Tables whose feature lies outside what a model was trained on.
#[derive(Debug, Clone, PartialEq)]
pub struct FeatureOutside {
    /// The feature's name (`common::table::FEATURE_NAMES`).
    pub feature: &'static str,
    /// The trained range.
    pub trained: [f64; 2],
    /// The range a table may lie in without counting as outside: the
    /// trained one and its slack.
    pub allowed: [f64; 2],
    /// The tables outside it, by name, and their value.
    pub tables: Vec<(String, f64)>,
}

impl std::fmt::Display for FeatureOutside {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        const SHOWN: usize = 3;
        let named: Vec<String> = self
            .tables
            .iter()
            .take(SHOWN)
            .map(|(name, v)| format!("`{name}` ({})", short(*v)))
            .collect();
        let more = match self.tables.len().saturating_sub(SHOWN) {
            0 => String::new(),
            n => format!(" and {n} more"),
        };
        write!(
            f,
            "{} of {}{more} outside the trained {} to {}",
            self.feature,
            named.join(", "),
            short(self.trained[0]),
            short(self.trained[1])
        )?;
        // Sizes, and shares trained down to near zero: only too large
        // counts.
        if self.allowed[0] <= 0.0 {
            write!(f, " (outside: over {})", short(self.allowed[1]))
        } else {
            write!(
                f,
                " (outside: below {} or over {})",
                short(self.allowed[0]),
                short(self.allowed[1])
            )
        }
    }
}

/// A feature value in few digits.
fn short(v: f64) -> String {
    if v != 0.0 && (v.abs() >= 1e5 || v.abs() < 1e-2) {
        format!("{v:.2e}")
    } else {
        format!("{}", (v * 1000.0).round() / 1000.0)
    }
}

impl TrainedShapes {
    /// What to do about a task far outside, for the warnings.
    pub const ADVICE: &'static str = "train on such tasks too (train.extra_suites; README, \
         \"Training for the shapes you place\")";

    /// Its file in a run directory.
    pub const FILE: &'static str = "trained_shapes.json";
    /// How far past the trained tables per device (as a factor, either
    /// way) a task is warned about: at twice the density the main job's
    /// policy gains less (and, trained with `measure_temperature = 1`,
    /// lost to a heuristic in some seeds).
    pub const SLACK: f64 = 1.5;
    /// How far above the trained range of a size feature (dim, rows,
    /// pooling, size), as a factor, a table counts as outside.
    /// The test tables of the main job's own pool reach 1.65 times the
    /// most pooling its training tables have: at 1.25 the guard set aside
    /// the learned plan for 16 of 20 `dlrm-100x8` test tasks.
    pub const FEATURE_SLACK: f64 = 2.0;
    /// How far past the trained range of a reuse share (bin_k), in share
    /// points, a table counts as outside.
    pub const BIN_SLACK: f64 = 0.1;

    /// The shapes of `tasks` (`None` when there are none).
    pub fn of(tasks: &[common::Task]) -> Option<TrainedShapes> {
        let range = |v: Vec<usize>| [*v.iter().min().unwrap(), *v.iter().max().unwrap()];
        let density: Vec<f64> = tasks
            .iter()
            .map(|t| t.tables.len() as f64 / t.devices as f64)
            .collect();
        (!tasks.is_empty()).then(|| TrainedShapes {
            tables: range(tasks.iter().map(|t| t.tables.len()).collect()),
            devices: range(tasks.iter().map(|t| t.devices).collect()),
            tables_per_device: [
                density.iter().copied().fold(f64::INFINITY, f64::min),
                density.iter().copied().fold(0.0, f64::max),
            ],
            features: Some(feature_ranges(tasks.iter().flat_map(|t| &t.tables))),
        })
    }

    /// The features of `tables` that lie outside the trained ranges, one
    /// entry per feature (empty when all lie within, or the ranges are
    /// not known). Sizes (dim, rows, pooling, size) count only above the
    /// trained range, past [`Self::FEATURE_SLACK`] times its top; reuse
    /// shares either way, past [`Self::BIN_SLACK`]: a model carries over a
    /// little past what it saw.
    pub fn features_outside(&self, tables: &[common::Table]) -> Vec<FeatureOutside> {
        let Some(ranges) = &self.features else {
            return Vec::new();
        };
        let mut out = Vec::new();
        for (k, &[lo, hi]) in ranges.iter().enumerate() {
            let allowed = if k < 4 {
                // Only above: a table smaller, narrower or looked up less
                // than any trained one adds little to a device's cost,
                // whatever the network makes of it.
                [f64::NEG_INFINITY, hi * Self::FEATURE_SLACK]
            } else {
                [lo - Self::BIN_SLACK, hi + Self::BIN_SLACK]
            };
            let outside: Vec<(String, f64)> = tables
                .iter()
                .map(|t| (t, t.features()[k]))
                .filter(|&(_, v)| !(allowed[0]..=allowed[1]).contains(&v))
                .map(|(t, v)| (t.name.clone(), v))
                .collect();
            if !outside.is_empty() {
                out.push(FeatureOutside {
                    feature: common::table::FEATURE_NAMES[k],
                    trained: [lo, hi],
                    allowed,
                    tables: outside,
                });
            }
        }
        out
    }

    /// The reuse bins the networks should see for `t` where `t` is hotter
    /// than any table they were trained on, or `None` otherwise. Hotter:
    /// the top bin (rows read the most, an open-ended bucket) lies above
    /// its trained range and slack, and no other bin does (they may lie
    /// below theirs: a hot table reads few rows rarely). The bins
    /// returned lie within the trained ranges: each is
    /// clipped to its range, then the mass the top bin gave up goes to
    /// the highest bins with room (or, where clipping added mass, it is
    /// taken from the lowest), so the table stays as hot as a trained one
    /// may be.
    ///
    /// Why: a table of a few rows (a day of the week, an hour) is read
    /// thousands of times per row in every batch, so nearly all its reuse
    /// lies in the top bin, past any trained table. Its rows sit in cache
    /// either way: more reuse hardly changes its cost. Seen at the trained
    /// top, it is priced as the hottest table the networks know, instead
    /// of setting the learned plan aside for the whole task.
    pub fn nearest_trained_reuse(
        &self,
        t: &common::Table,
    ) -> Option<[f64; common::table::NUM_BINS]> {
        let ranges = &self.features.as_ref()?[4..];
        let bins = &t.bins;
        let top = bins.len().checked_sub(1)?;
        if ranges.len() != bins.len() {
            return None;
        }
        let above = |k: usize| bins[k] > ranges[k][1] + Self::BIN_SLACK;
        if !above(top) || (0..top).any(above) {
            return None;
        }
        let mut seen = *bins;
        for (b, &[lo, hi]) in seen.iter_mut().zip(ranges) {
            *b = b.clamp(lo, hi);
        }
        let mut missing = 1.0 - seen.iter().sum::<f64>();
        if missing > 0.0 {
            for (b, &[_, hi]) in seen.iter_mut().zip(ranges).rev() {
                let give = (hi - *b).min(missing).max(0.0);
                *b += give;
                missing -= give;
            }
        } else {
            for (b, &[lo, _]) in seen.iter_mut().zip(ranges) {
                let take = (*b - lo).min(-missing).max(0.0);
                *b -= take;
                missing += take;
            }
        }
        let seen_table = common::Table {
            bins: seen,
            ..t.clone()
        };
        (missing.abs() <= 1e-9 && seen_table.mean_reuse() <= t.mean_reuse()).then_some(seen)
    }

    /// Writes them into run directory `run`.
    pub fn write(&self, run: &Path) -> common::Result<()> {
        let text = serde_json::to_string_pretty(self).expect("plain numbers serialize");
        common::fs::write_atomic(&run.join(Self::FILE), text.as_bytes())
    }

    /// Those of run directory `run`; `None` for a run from before they were
    /// kept, or an unreadable file (with a warning).
    pub fn read(run: &Path) -> Option<TrainedShapes> {
        let path = run.join(Self::FILE);
        let text = std::fs::read(&path).ok()?;
        serde_json::from_slice(&text)
            .inspect_err(|e| tracing::warn!("ignoring {}: {e}", path.display()))
            .ok()
    }

    /// Why a task of `tables` tables on `devices` devices lies far outside
    /// these shapes, or `None` when it does not.
    pub fn outside(&self, tables: usize, devices: usize) -> Option<String> {
        let density = tables as f64 / devices.max(1) as f64;
        let [lo, hi] = self.tables_per_device;
        if density >= lo / Self::SLACK && density <= hi * Self::SLACK {
            return None;
        }
        let range = |[a, b]: [f64; 2]| {
            if a == b {
                format!("{a}")
            } else {
                format!("{a} to {b}")
            }
        };
        // One decimal, or two under 0.1 (3 tables on
        // 100 devices is 0.03 per device, not 0.0).
        let per = |x: f64| {
            if x >= 0.1 {
                format!("{x:.1}")
            } else {
                format!("{x:.2}")
            }
        };
        let density_range = if lo == hi {
            per(lo)
        } else {
            format!("{} to {}", per(lo), per(hi))
        };
        Some(format!(
            "{} on {} is {} per device, and the model was trained on {density_range} ({} \
             tables on {} devices)",
            common::count(tables, "table"),
            common::count(devices, "device"),
            per(density),
            range(self.tables.map(|t| t as f64)),
            range(self.devices.map(|d| d as f64))
        ))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use common::config::Config;
    use common::generate::generate_pool;

    /// A pool, and the shapes of one task of its first 200 tables.
    fn trained_on_200() -> (Vec<common::Table>, TrainedShapes) {
        let pool = generate_pool(&Config::default().generate, 1).unwrap();
        let trained = common::Task {
            name: "t".into(),
            devices: 4,
            memory_gb: 1.0,
            tables: pool[..200].to_vec(),
        };
        let shapes = TrainedShapes::of(std::slice::from_ref(&trained)).unwrap();
        (pool, shapes)
    }

    #[test]
    fn tables_outside_the_trained_features_are_named_by_feature() {
        let (pool, shapes) = trained_on_200();
        assert!(shapes.features_outside(&pool[..200]).is_empty());
        // A table like those derived from a lookup trace: no row used once.
        let mut trace = pool[0].clone();
        trace.name = "from_trace".into();
        trace.bins = [0.0; common::NUM_BINS];
        trace.bins[6] = 0.5;
        trace.bins[7] = 0.5;
        let mut wide = pool[1].clone();
        wide.name = "wide".into();
        wide.dim = 2048;
        let out = shapes.features_outside(&[pool[2].clone(), trace, wide]);
        let names: Vec<&str> = out.iter().map(|f| f.feature).collect();
        assert!(
            names.contains(&"bin_0") && names.contains(&"dim"),
            "{names:?}"
        );
        let bin0 = out.iter().find(|f| f.feature == "bin_0").unwrap();
        assert_eq!(bin0.tables, vec![("from_trace".to_string(), 0.0)]);
        let text = bin0.to_string();
        assert!(
            text.contains("`from_trace` (0)") && text.contains("outside the trained"),
            "{text}"
        );
        // Each says where a table starts to count as outside.
        let lo = bin0.trained[0] - TrainedShapes::BIN_SLACK;
        assert!(
            text.contains(&format!("(outside: below {}", short(lo))),
            "{text}"
        );
        let dim = out.iter().find(|f| f.feature == "dim").unwrap().to_string();
        let top = shapes.features.as_ref().unwrap()[0][1] * TrainedShapes::FEATURE_SLACK;
        assert!(
            dim.contains(&format!("(outside: over {})", short(top))),
            "{dim}"
        );
        // A run from before the ranges were kept checks nothing.
        let old = TrainedShapes {
            features: None,
            ..shapes.clone()
        };
        assert!(old.features_outside(&pool[..1]).is_empty());
    }

    /// A table of a few rows is hotter than any trained one: the
    /// networks see it at the trained top, within every bin's range. A
    /// table within the ranges keeps its bins, as does one outside them
    /// in a bin below the top.
    #[test]
    fn a_table_hotter_than_any_trained_is_seen_at_the_trained_top() {
        let (pool, shapes) = trained_on_200();
        let mut day = common::Table::cold("day_of_week", 7, 8, 15.8);
        day.bins = common::generate::default_bins(7, 15.8);
        let out = shapes.features_outside(std::slice::from_ref(&day));
        assert!(out.iter().any(|f| f.feature == "bin_16"), "{out:?}");
        let bins = shapes
            .nearest_trained_reuse(&day)
            .expect("hotter than trained");
        let ranges = &shapes.features.as_ref().unwrap()[4..];
        for (k, (b, [lo, hi])) in bins.iter().zip(ranges).enumerate() {
            assert!(
                *b >= lo - 1e-12 && *b <= hi + 1e-12,
                "bin_{k} {b} not in {lo}..{hi}"
            );
        }
        assert!((bins.iter().sum::<f64>() - 1.0).abs() < 1e-9);
        let seen = common::Table {
            bins,
            ..day.clone()
        };
        assert!(seen.mean_reuse() <= day.mean_reuse());
        assert!(
            seen.mean_reuse() > pool[..200].iter().map(|t| t.mean_reuse()).sum::<f64>() / 200.0
        );
        assert!(shapes
            .features_outside(std::slice::from_ref(&seen))
            .is_empty());
        // Within the ranges, or colder than trained: as they are.
        assert_eq!(shapes.nearest_trained_reuse(&pool[3]), None);
        let mut trace = pool[0].clone();
        trace.bins = [0.0; common::NUM_BINS];
        trace.bins[6] = 0.5;
        trace.bins[7] = 0.5;
        assert!(!shapes
            .features_outside(std::slice::from_ref(&trace))
            .is_empty());
        assert_eq!(shapes.nearest_trained_reuse(&trace), None);
        // Past the top in the two top bins, not only the last: outside.
        let mut spread = day.clone();
        spread.bins = [0.0; common::NUM_BINS];
        spread.bins[15] = 0.5;
        spread.bins[16] = 0.5;
        assert_eq!(shapes.nearest_trained_reuse(&spread), None);
    }

    /// Where clipping into the ranges adds mass (bins raised to their
    /// lowest), it is taken back from the lowest bins with room.
    #[test]
    fn mass_that_clipping_adds_comes_off_the_lowest_bins() {
        let mut features = vec![[0.0, 1e9]; 4];
        features.push([0.0, 0.7]);
        features.extend(std::iter::repeat_n([0.01, 0.7], 15));
        features.push([0.0, 0.34]);
        let shapes = TrainedShapes {
            tables: [1, 1],
            devices: [1, 1],
            tables_per_device: [1.0, 1.0],
            features: Some(features),
        };
        let mut t = common::Table::cold("t", 1000, 8, 1.0);
        t.bins = [0.0; common::NUM_BINS];
        t.bins[0] = 0.55;
        t.bins[16] = 0.45;
        let bins = shapes
            .nearest_trained_reuse(&t)
            .expect("hotter than trained");
        // 0.55 + 15 × 0.01 + 0.34 = 1.04: 0.04 off bin_0.
        assert!((bins[0] - 0.51).abs() < 1e-9, "{bins:?}");
        assert!(bins[1..16].iter().all(|&b| (b - 0.01).abs() < 1e-12));
        assert!((bins[16] - 0.34).abs() < 1e-12);
        assert!((bins.iter().sum::<f64>() - 1.0).abs() < 1e-9);
    }

    #[test]
    fn tasks_far_outside_the_trained_tables_per_device_are_named() {
        let dir = tempfile::tempdir().unwrap();
        let pool = generate_pool(&Config::default().generate, 1).unwrap();
        let task = |tables: usize, devices: usize| common::Task {
            name: format!("{tables}x{devices}"),
            devices,
            memory_gb: 1.0,
            tables: pool[..tables].to_vec(),
        };
        let shapes = TrainedShapes::of(&[task(50, 4), task(100, 8), task(20, 4)]).unwrap();
        assert_eq!(shapes.tables, [20, 100]);
        assert_eq!(shapes.devices, [4, 8]);
        assert_eq!(shapes.tables_per_device, [5.0, 12.5]);
        shapes.write(dir.path()).unwrap();
        assert_eq!(TrainedShapes::read(dir.path()), Some(shapes.clone()));
        // Inside, and within the slack either way: nothing to say.
        for (t, d) in [(50, 4), (400, 32), (150, 8), (14, 4)] {
            assert_eq!(shapes.outside(t, d), None, "{t}x{d}");
        }
        // Twice the densest and under half the sparsest are named.
        let far = shapes.outside(200, 8).unwrap();
        assert!(
            far.contains("25.0 per device") && far.contains("5.0 to 12.5"),
            "{far}"
        );
        assert!(shapes.outside(4, 2).is_some());
        let sparse = shapes.outside(3, 100).unwrap();
        assert!(sparse.contains("is 0.03 per device"), "{sparse}");
        let one = shapes.outside(1, 2).unwrap();
        assert!(one.starts_with("1 table on 2 devices is 0.5"), "{one}");
        // A run from before the file, or a damaged one: no shapes, no error.
        std::fs::write(dir.path().join(TrainedShapes::FILE), b"{oops").unwrap();
        assert_eq!(TrainedShapes::read(dir.path()), None);
        assert_eq!(TrainedShapes::read(&dir.path().join("none")), None);
        assert_eq!(TrainedShapes::of(&[]), None);
    }
}
