//! `learner report RUN`: one self-contained HTML page of a run, its charts
//! inline SVG, nothing fetched from a network. It shows the learning curves
//! (`metrics.jsonl`), every measured plan (`cost_buffer.jsonl`), the
//! per-device cost of a plan split into compute and communication (as
//! DreamShard's Figure 1 draws it), and the run's evaluations (`eval/`).

use std::fmt::Write as _;
use std::path::Path;

use anyhow::Context;

use crate::costlog::CostLog;
use crate::run::RunDir;

/// Chart size, in SVG units (the page scales them).
const WIDTH: f64 = 640.0;
const HEIGHT: f64 = 260.0;
/// Room for the axes' labels.
const LEFT: f64 = 64.0;
const BOTTOM: f64 = 40.0;
const TOP: f64 = 28.0;
const RIGHT: f64 = 16.0;
const COLOURS: [&str; 4] = ["#1f77b4", "#d62728", "#2ca02c", "#9467bd"];

/// A named series of `(x, y)` points.
pub struct Series {
    pub name: String,
    pub points: Vec<(f64, f64)>,
}

fn escape(s: &str) -> String {
    s.replace('&', "&amp;")
        .replace('<', "&lt;")
        .replace('>', "&gt;")
        .replace('"', "&quot;")
}

/// The range of `values`, widened where it is a single value.
fn range(values: impl Iterator<Item = f64>) -> Option<(f64, f64)> {
    let (lo, hi) = values
        .filter(|v| v.is_finite())
        .fold((f64::INFINITY, f64::NEG_INFINITY), |(lo, hi), v| {
            (lo.min(v), hi.max(v))
        });
    if lo > hi {
        return None;
    }
    let pad = if hi > lo {
        0.0
    } else {
        lo.abs().max(1.0) * 0.5
    };
    Some((lo - pad, hi + pad))
}

/// A tick label with as many decimals as ticks `step` apart need.
fn tick(v: f64, step: f64) -> String {
    let a = v.abs();
    if a != 0.0 && !(1e-3..1e5).contains(&a) {
        return format!("{v:.2e}");
    }
    let decimals = if step > 0.0 {
        (1.0 - step.log10().floor()).clamp(0.0, 6.0) as usize
    } else {
        2
    };
    format!("{v:.decimals$}")
}

/// The frame of a chart: title, axes with five ticks each, labels; and the
/// map from data to SVG coordinates.
fn frame(
    svg: &mut String,
    title: &str,
    (x0, x1): (f64, f64),
    (y0, y1): (f64, f64),
    labels: (&str, &str),
    x_ticks: bool,
) -> impl Fn(f64, f64) -> (f64, f64) {
    let (w, h) = (WIDTH - LEFT - RIGHT, HEIGHT - TOP - BOTTOM);
    let _ = write!(
        svg,
        r##"<svg xmlns="http://www.w3.org/2000/svg" viewBox="0 0 {WIDTH} {HEIGHT}" role="img" aria-label="{t}"><text x="{cx}" y="18" text-anchor="middle" font-weight="bold">{t}</text><rect x="{LEFT}" y="{TOP}" width="{w}" height="{h}" fill="none" stroke="#888"/>"##,
        t = escape(title),
        cx = WIDTH / 2.0,
    );
    for k in 0..=4 {
        let f = k as f64 / 4.0;
        let (x, y) = (LEFT + f * w, TOP + h - f * h);
        if x_ticks {
            let _ = write!(
                svg,
                r##"<text x="{x}" y="{ty}" text-anchor="middle" font-size="11">{}</text>"##,
                tick(x0 + f * (x1 - x0), (x1 - x0) / 4.0),
                ty = TOP + h + 16.0,
            );
        }
        let _ = write!(
            svg,
            r##"<text x="{tx}" y="{y}" text-anchor="end" font-size="11" dominant-baseline="middle">{}</text><line x1="{LEFT}" x2="{r}" y1="{y}" y2="{y}" stroke="#eee"/>"##,
            tick(y0 + f * (y1 - y0), (y1 - y0) / 4.0),
            tx = LEFT - 6.0,
            r = LEFT + w,
        );
    }
    let _ = write!(
        svg,
        r#"<text x="{cx}" y="{by}" text-anchor="middle" font-size="12">{}</text><text x="14" y="{cy}" text-anchor="middle" font-size="12" transform="rotate(-90 14 {cy})">{}</text>"#,
        escape(labels.0),
        escape(labels.1),
        cx = LEFT + w / 2.0,
        by = HEIGHT - 6.0,
        cy = TOP + h / 2.0,
    );
    move |x: f64, y: f64| {
        let fx = if x1 > x0 { (x - x0) / (x1 - x0) } else { 0.5 };
        let fy = if y1 > y0 { (y - y0) / (y1 - y0) } else { 0.5 };
        (LEFT + fx * w, TOP + h - fy * h)
    }
}

/// A line chart (`dots`: points only) of `series`, with a legend; a note
/// instead of a chart where no series has a point.
pub fn line_chart(title: &str, series: &[Series], labels: (&str, &str), dots: bool) -> String {
    let all = || series.iter().flat_map(|s| s.points.iter());
    let (Some(xr), Some(yr)) = (range(all().map(|p| p.0)), range(all().map(|p| p.1))) else {
        return format!(
            "<p class=\"none\">{}: nothing recorded yet.</p>",
            escape(title)
        );
    };
    let mut svg = String::new();
    let at = frame(&mut svg, title, xr, yr, labels, true);
    for (i, s) in series.iter().enumerate() {
        let colour = COLOURS[i % COLOURS.len()];
        let points: Vec<(f64, f64)> = s
            .points
            .iter()
            .filter(|p| p.0.is_finite() && p.1.is_finite())
            .map(|&(x, y)| at(x, y))
            .collect();
        if dots {
            for (x, y) in &points {
                let _ = write!(
                    svg,
                    r#"<circle cx="{x:.1}" cy="{y:.1}" r="2" fill="{colour}"/>"#
                );
            }
        } else {
            let path: Vec<String> = points
                .iter()
                .map(|(x, y)| format!("{x:.1},{y:.1}"))
                .collect();
            let _ = write!(
                svg,
                r#"<polyline fill="none" stroke="{colour}" stroke-width="1.5" points="{}"/>"#,
                path.join(" ")
            );
        }
        let ly = TOP + 14.0 + 14.0 * i as f64;
        let _ = write!(
            svg,
            r#"<rect x="{lx}" y="{ry}" width="10" height="10" fill="{colour}"/><text x="{tx}" y="{ly}" font-size="11">{}</text>"#,
            escape(&s.name),
            lx = LEFT + 8.0,
            ry = ly - 9.0,
            tx = LEFT + 22.0,
        );
    }
    svg.push_str("</svg>");
    svg
}

/// Stacked bars, one per device: compute (forward and backward) below,
/// communication (both all-to-alls) above.
pub fn device_bars(title: &str, devices: &[common::DeviceCost]) -> String {
    let top = devices.iter().map(|d| d.total_ms).fold(0.0, f64::max);
    if devices.is_empty() || top <= 0.0 {
        return format!(
            "<p class=\"none\">{}: no measured plan yet.</p>",
            escape(title)
        );
    }
    let mut svg = String::new();
    let n = devices.len() as f64;
    // Head room above the tallest bar for the legend.
    let at = frame(
        &mut svg,
        title,
        (0.0, n),
        (0.0, top * 1.3),
        ("device", "ms"),
        false,
    );
    let slot = (WIDTH - LEFT - RIGHT) / n;
    // Each device's number under its bar (every k-th where they crowd).
    let every = devices.len().div_ceil(16);
    for d in (0..devices.len()).step_by(every) {
        let (x, y) = at(d as f64 + 0.5, 0.0);
        let _ = write!(
            svg,
            r##"<text x="{x:.1}" y="{:.1}" text-anchor="middle" font-size="11">{d}</text>"##,
            y + 16.0
        );
    }
    for (d, c) in devices.iter().enumerate() {
        let compute = c.fwd_ms + c.bwd_ms;
        let comm = c.fwd_comm_ms + c.bwd_comm_ms;
        let (x, base) = at(d as f64, 0.0);
        let (_, mid) = at(0.0, compute);
        let (_, end) = at(0.0, compute + comm);
        let bar = slot * 0.7;
        let x = x + slot * 0.15;
        let _ = write!(
            svg,
            r##"<rect x="{x:.1}" y="{mid:.1}" width="{bar:.1}" height="{:.1}" fill="#1f77b4"><title>device {d}: compute {compute:.3} ms</title></rect><rect x="{x:.1}" y="{end:.1}" width="{bar:.1}" height="{:.1}" fill="#ff7f0e"><title>device {d}: communication {comm:.3} ms</title></rect>"##,
            base - mid,
            mid - end,
        );
    }
    let _ = write!(
        svg,
        r##"<rect x="{lx}" y="34" width="10" height="10" fill="#1f77b4"/><text x="{tx}" y="43" font-size="11">compute (fwd + bwd)</text><rect x="{lx}" y="48" width="10" height="10" fill="#ff7f0e"/><text x="{tx}" y="57" font-size="11">communication (both all-to-alls)</text></svg>"##,
        lx = LEFT + 8.0,
        tx = LEFT + 22.0,
    );
    svg
}

/// The run's metrics lines, as JSON values (a line that does not parse is
/// skipped: a torn last write).
fn metrics(run: &RunDir) -> anyhow::Result<Vec<serde_json::Value>> {
    let path = run.metrics();
    let text = match std::fs::read_to_string(&path) {
        Ok(t) => t,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => String::new(),
        Err(e) => return Err(e).with_context(|| format!("reading {}", path.display())),
    };
    Ok(text
        .lines()
        .filter_map(|l| serde_json::from_str(l).ok())
        .collect())
}

/// `(step, field)` of every metrics line that has the field (a dotted path:
/// `policy.loss`).
fn curve(lines: &[serde_json::Value], field: &str) -> Vec<(f64, f64)> {
    lines
        .iter()
        .filter_map(|m| {
            let v = field.split('.').try_fold(m, |v, k| v.get(k))?;
            Some((m.get("step")?.as_f64()?, v.as_f64()?))
        })
        .collect()
}

/// The whole page for the run in `dir`.
pub fn render(dir: &Path) -> anyhow::Result<String> {
    let run = RunDir::new(dir);
    RunDir::ensure_holds_run(dir)?;
    let lines = metrics(&run)?;
    let logged = CostLog::read(&run.cost_log())?;
    let series = |name: &str, field: &str| Series {
        name: name.into(),
        points: curve(&lines, field),
    };
    let mut body = String::new();
    let _ = write!(
        body,
        "<h1>embshard run <code>{}</code></h1><p>{} policy updates, {} measured plans{}.</p>",
        escape(&dir.display().to_string()),
        lines.len(),
        logged.samples.len(),
        if logged.skipped > 0 {
            format!(" ({} damaged log lines skipped)", logged.skipped)
        } else {
            String::new()
        }
    );
    body.push_str("<h2>Learning curves</h2>");
    body.push_str(&line_chart(
        "policy loss",
        &[
            series("loss", "policy.loss"),
            series("mean reward", "policy.mean_reward"),
        ],
        ("policy update", "value"),
        false,
    ));
    body.push_str(&line_chart(
        "cost-network loss",
        &[series("loss", "cost_loss")],
        ("policy update", "loss"),
        false,
    ));
    body.push_str(&line_chart(
        "measured against predicted cost of the plans measured",
        &[
            series("measured", "mean_measured_ms"),
            series("predicted", "mean_predicted_ms"),
        ],
        ("policy update", "ms"),
        false,
    ));
    body.push_str("<h2>Measured plans</h2>");
    let measured = Series {
        name: "iteration cost".into(),
        points: logged
            .samples
            .iter()
            .enumerate()
            .map(|(i, s)| (i as f64, s.measurement.cost_ms))
            .collect(),
    };
    body.push_str(&line_chart(
        "every measured plan, in the order measured",
        &[measured],
        ("measurement", "ms"),
        true,
    ));
    if let Some(last) = logged.samples.last() {
        let title = format!(
            "the last measured plan: {} tables on {} devices, {:.3} ms",
            last.placed.assignment.len(),
            last.placed.devices,
            last.measurement.cost_ms
        );
        body.push_str(&device_bars(&title, &last.measurement.devices));
    }
    body.push_str("<h2>Evaluations</h2>");
    let mut evals: Vec<_> = std::fs::read_dir(dir.join("eval"))
        .map(|d| d.flatten().map(|e| e.path()).collect())
        .unwrap_or_default();
    evals.retain(|p: &std::path::PathBuf| p.extension().is_some_and(|e| e == "txt"));
    evals.sort();
    if evals.is_empty() {
        body.push_str(
            "<p class=\"none\">none yet: <code>learner eval --run RUN --suite …</code> keeps \
             its tables here.</p>",
        );
    }
    for p in evals {
        let text =
            std::fs::read_to_string(&p).with_context(|| format!("reading {}", p.display()))?;
        let name = p.file_stem().map(|s| s.to_string_lossy().into_owned());
        let _ = write!(
            body,
            "<h3>{}</h3><pre>{}</pre>",
            escape(&name.unwrap_or_default()),
            escape(&text)
        );
    }
    Ok(format!(
        "<!DOCTYPE html><html lang=\"en\"><head><meta charset=\"utf-8\"><title>embshard run \
         report</title><style>body{{font-family:sans-serif;max-width:60rem;margin:2rem auto;\
         padding:0 1rem}}svg{{width:100%;height:auto;margin:1rem 0}}pre{{overflow-x:auto;\
         background:#f6f6f6;padding:.5rem}}.none{{color:#777}}</style></head><body>{body}\
         </body></html>\n"
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_chart_draws_each_series_inside_its_frame_and_says_when_empty() {
        let s = Series {
            name: "a<b".into(),
            points: vec![(0.0, 1.0), (1.0, 3.0), (2.0, f64::NAN), (4.0, 2.0)],
        };
        let svg = line_chart("t", &[s], ("x", "y"), false);
        assert!(svg.starts_with("<svg") && svg.ends_with("</svg>"), "{svg}");
        // The name escaped; three finite points on the polyline.
        assert!(svg.contains("a&lt;b"), "{svg}");
        let points = svg
            .split("points=\"")
            .nth(1)
            .unwrap()
            .split('"')
            .next()
            .unwrap();
        let xy: Vec<(f64, f64)> = points
            .split(' ')
            .map(|p| {
                let (x, y) = p.split_once(',').unwrap();
                (x.parse().unwrap(), y.parse().unwrap())
            })
            .collect();
        assert_eq!(xy.len(), 3);
        for (x, y) in &xy {
            assert!((LEFT..=WIDTH - RIGHT).contains(x) && (TOP..=HEIGHT - BOTTOM).contains(y));
        }
        // The highest value is at the top, the first x at the left.
        assert_eq!(xy[1].1, TOP);
        assert_eq!(xy[0].0, LEFT);
        let none = line_chart("t", &[], ("x", "y"), false);
        assert!(none.contains("nothing recorded yet"), "{none}");
    }

    #[test]
    fn ticks_tell_close_values_apart() {
        assert_eq!(tick(0.1002, 0.0001), "0.10020");
        assert_eq!(tick(150.0, 75.0), "150");
        assert_eq!(tick(0.5, 0.25), "0.50");
        assert_eq!(tick(180000.0, 45000.0), "1.80e5");
        assert_eq!(tick(0.0, 10.0), "0");
    }

    #[test]
    fn device_bars_stack_compute_under_communication() {
        let d = [
            common::DeviceCost::new(1.0, 2.0, 0.5, 0.5),
            common::DeviceCost::new(0.5, 1.0, 1.0, 0.5),
        ];
        let svg = device_bars("plan", &d);
        assert_eq!(
            svg.matches("<rect").count(),
            1 + 4 + 2,
            "frame, bars, legend: {svg}"
        );
        assert!(svg.contains("device 0: compute 3.000 ms"), "{svg}");
        assert!(svg.contains("device 1: communication 1.500 ms"), "{svg}");
        // Each device numbered under its bar, no fractional ticks.
        assert!(
            svg.contains(">0</text>") && svg.contains(">1</text>"),
            "{svg}"
        );
        assert!(!svg.contains(">0.50</text>"), "{svg}");
        assert!(device_bars("plan", &[]).contains("no measured plan"));
    }
}
