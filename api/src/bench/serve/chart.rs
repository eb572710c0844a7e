//! The latency chart of one load run (`bench serve --plot`): the share of requests done
//! within each latency, for time to first token and end to end.

use std::path::Path;

use anyhow::bail;

use super::BenchReport;
use crate::bench::plot::LineChart;

/// The share of requests (y, %) done within x milliseconds, for TTFT and end-to-end latency.
pub fn latency_cdf(path: &Path, report: &BenchReport) -> anyhow::Result<()> {
    let ok: Vec<_> = report.requests.iter().filter(|r| r.success).collect();
    if ok.is_empty() {
        bail!("no request completed; nothing to chart");
    }
    let cdf = |mut ms: Vec<f64>| {
        ms.sort_by(f64::total_cmp);
        let n = ms.len() as f64;
        ms.into_iter()
            .enumerate()
            .map(|(i, v)| (v, 100.0 * (i + 1) as f64 / n))
            .collect::<Vec<_>>()
    };
    LineChart {
        title: format!(
            "{} requests to {} ({:.1} output tok/s)",
            report.completed, report.model, report.output_throughput
        ),
        x_label: "latency (ms)".into(),
        y_label: "requests done (%)".into(),
        log2_x: false,
        legend_right: false,
        series: vec![
            (
                "time to first token".into(),
                cdf(ok.iter().map(|r| r.ttft * 1000.0).collect()),
            ),
            (
                "end-to-end".into(),
                cdf(ok.iter().map(|r| r.e2el * 1000.0).collect()),
            ),
        ],
    }
    .draw(path)
}
