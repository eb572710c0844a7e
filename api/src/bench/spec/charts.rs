//! Charts of `thicket bench spec`: acceptance by tree depth (the share of verification
//! steps that accepted at least d draft tokens, read from the engine's Prometheus counters
//! around each method's run) and mean accepted tokens per method.

use std::collections::BTreeMap;
use std::path::Path;

use anyhow::Context;
use engine::metrics::spec::{ACCEPTED_PER_POSITION, VERIFY_STEPS};
use metrics_exporter_prometheus::PrometheusHandle;
use serde::Serialize;

use crate::bench::plot::{BarChart, LineChart};

/// Verification steps and accepted tokens per depth, summed over every method label.
#[derive(Debug, Clone, Default, PartialEq, Serialize)]
pub struct DepthCounts {
    /// Steps with at least one draft node.
    pub verify_steps: f64,
    /// Depth (1-based) to the steps that accepted a token there.
    pub accepted_at: BTreeMap<usize, f64>,
}

impl DepthCounts {
    /// Reads the counters out of Prometheus text.
    pub fn parse(text: &str) -> Self {
        let mut counts = DepthCounts::default();
        for line in text.lines().filter(|l| !l.starts_with('#')) {
            let Some((series, value)) = line.rsplit_once(' ') else {
                continue;
            };
            let Ok(value) = value.parse::<f64>() else {
                continue;
            };
            let (name, labels) = series.split_once('{').unwrap_or((series, ""));
            if name == VERIFY_STEPS {
                counts.verify_steps += value;
            } else if name == ACCEPTED_PER_POSITION {
                let position = labels
                    .split(',')
                    .find_map(|l| l.strip_prefix("position=\""))
                    .and_then(|p| p.trim_end_matches(['"', '}']).parse::<usize>().ok());
                if let Some(depth) = position {
                    *counts.accepted_at.entry(depth).or_default() += value;
                }
            }
        }
        counts
    }

    /// Adds `other`'s counts to these.
    pub fn add(&mut self, other: &DepthCounts) {
        self.verify_steps += other.verify_steps;
        for (&d, &v) in &other.accepted_at {
            *self.accepted_at.entry(d).or_default() += v;
        }
    }

    /// What was counted since `before`.
    pub fn since(&self, before: &DepthCounts) -> DepthCounts {
        DepthCounts {
            verify_steps: self.verify_steps - before.verify_steps,
            accepted_at: self
                .accepted_at
                .iter()
                .map(|(&d, &v)| (d, v - before.accepted_at.get(&d).copied().unwrap_or(0.0)))
                .collect(),
        }
    }

    /// `(depth, % of verification steps that accepted a token at that depth)`.
    pub fn acceptance_curve(&self) -> Vec<(f64, f64)> {
        if self.verify_steps <= 0.0 {
            return Vec::new();
        }
        self.accepted_at
            .iter()
            .map(|(&d, &v)| (d as f64, 100.0 * v / self.verify_steps))
            .collect()
    }
}

/// The counters now.
pub fn snapshot(handle: &PrometheusHandle) -> DepthCounts {
    DepthCounts::parse(&handle.render())
}

/// Writes `acceptance_by_depth` and `mat_by_method` charts (SVG and PNG) into `dir`.
pub fn draw(
    dir: &Path,
    depth: &[(String, DepthCounts)],
    mat: &[(String, f64)],
) -> anyhow::Result<()> {
    std::fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
    let curves: Vec<(String, Vec<(f64, f64)>)> = depth
        .iter()
        .map(|(method, counts)| (method.clone(), counts.acceptance_curve()))
        .filter(|(_, curve)| !curve.is_empty())
        .collect();
    for ext in ["svg", "png"] {
        if !curves.is_empty() {
            LineChart {
                title: "Acceptance by tree depth".into(),
                x_label: "depth (draft tokens accepted in a row)".into(),
                y_label: "verification steps reaching it (%)".into(),
                log2_x: false,
                legend_right: true,
                series: curves.clone(),
            }
            .draw(&dir.join(format!("acceptance_by_depth.{ext}")))?;
        }
        BarChart {
            title: "Mean accepted tokens per step (MAT)".into(),
            y_label: "tokens per verification step".into(),
            bars: mat.to_vec(),
        }
        .draw(&dir.join(format!("mat_by_method.{ext}")))?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn depth_counts_come_from_prometheus_text() {
        let before = DepthCounts::parse(&format!(
            "# TYPE {VERIFY_STEPS} counter\n{VERIFY_STEPS}{{method=\"recycling\"}} 10\n{ACCEPTED_PER_POSITION}{{method=\"recycling\",position=\"1\"}} 6\n"
        ));
        let after = DepthCounts::parse(&format!(
            "{VERIFY_STEPS}{{method=\"recycling\"}} 30\n{VERIFY_STEPS}{{method=\"ngram_trie\"}} 10\n\
             {ACCEPTED_PER_POSITION}{{method=\"recycling\",position=\"1\"}} 20\n\
             {ACCEPTED_PER_POSITION}{{method=\"ngram_trie\",position=\"1\"}} 6\n\
             {ACCEPTED_PER_POSITION}{{method=\"recycling\",position=\"2\"}} 5\n\
             other_metric 99\n"
        ));
        let run = after.since(&before);
        assert_eq!(run.verify_steps, 30.0);
        assert_eq!(run.accepted_at[&1], 20.0);
        assert_eq!(
            run.acceptance_curve(),
            vec![(1.0, 100.0 * 20.0 / 30.0), (2.0, 100.0 * 5.0 / 30.0)]
        );
        assert!(DepthCounts::default().acceptance_curve().is_empty());
    }
}
