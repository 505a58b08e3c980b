//! Warnings about single messages, rate-limited: a peer that sends bad
//! frames as fast as it can must not fill the disk through the log. Each
//! kind is said at most once per interval; the ones held back are counted
//! and said with the next.

use std::collections::HashMap;
use std::time::{Duration, Instant};

/// How often one kind of warning may be logged.
pub const INTERVAL: Duration = Duration::from_secs(10);

/// Per-kind rate limits on warnings.
#[derive(Debug, Default)]
pub struct Warner {
    kinds: HashMap<&'static str, Held>,
}

#[derive(Debug, Default)]
struct Held {
    last: Option<Instant>,
    held: u64,
}

impl Warner {
    /// Logs `message()` as a warning of `kind` unless one of that kind was
    /// logged less than [`INTERVAL`] before `now`; then it is counted, and
    /// the count goes with the next. Returns the line logged, if any.
    pub fn warn(
        &mut self,
        kind: &'static str,
        now: Instant,
        message: impl FnOnce() -> String,
    ) -> Option<String> {
        let h = self.kinds.entry(kind).or_default();
        if h.last
            .is_some_and(|t| now.saturating_duration_since(t) < INTERVAL)
        {
            h.held += 1;
            return None;
        }
        let mut line = message();
        if h.held > 0 {
            line.push_str(&format!(
                " (and {} more like it since the last such warning, {} s before)",
                h.held,
                h.last
                    .map_or(0, |t| now.saturating_duration_since(t).as_secs())
            ));
        }
        (h.last, h.held) = (Some(now), 0);
        tracing::warn!("{line}");
        Some(line)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_flood_of_one_kind_is_said_once_per_interval_with_its_count() {
        let mut w = Warner::default();
        let t0 = Instant::now();
        let first = w.warn("frame", t0, || "dropped a frame".into());
        assert_eq!(first.as_deref(), Some("dropped a frame"));
        // 10,000 more within the interval: none logged.
        for k in 0..10_000u32 {
            let at = t0 + Duration::from_micros(u64::from(k));
            assert!(w.warn("frame", at, || unreachable!()).is_none());
        }
        // Another kind is not held back by the first.
        assert!(w.warn("unroll", t0, || "a bad unroll".into()).is_some());
        let next = w
            .warn("frame", t0 + INTERVAL, || "dropped a frame".into())
            .unwrap();
        assert!(next.contains("and 10000 more like it"), "{next}");
        // The count starts over.
        let later = w
            .warn("frame", t0 + 2 * INTERVAL, || "dropped".into())
            .unwrap();
        assert_eq!(later, "dropped");
    }
}
