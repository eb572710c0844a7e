//! The statistics of a load benchmark: request arrival times (Poisson, or gamma with a
//! burstiness factor, from a seed), percentiles with linear interpolation (numpy's default),
//! latency summaries in milliseconds, and goodput under latency objectives.

use rand::rngs::StdRng;
use rand::SeedableRng;
use rand_distr::{Distribution, Gamma};
use serde::Serialize;

/// Seconds after the start at which each of `n` requests is sent. `rate` is requests per
/// second (`None`: all at once); inter-arrival gaps are gamma distributed with shape
/// `burstiness` and mean `1 / rate`, so `burstiness = 1` is a Poisson process, smaller is
/// burstier, larger more regular.
pub fn arrival_times(n: usize, rate: Option<f64>, burstiness: f64, seed: u64) -> Vec<f64> {
    let Some(rate) = rate.filter(|r| r.is_finite() && *r > 0.0) else {
        return vec![0.0; n];
    };
    let shape = if burstiness.is_finite() && burstiness > 0.0 {
        burstiness
    } else {
        1.0
    };
    let mut rng = StdRng::seed_from_u64(seed);
    let mut at = 0.0;
    match Gamma::new(shape, 1.0 / (rate * shape)) {
        Ok(gaps) => (0..n)
            .map(|_| {
                at += gaps.sample(&mut rng);
                at
            })
            .collect(),
        Err(_) => (0..n).map(|i| i as f64 / rate).collect(),
    }
}

/// The `p`-th percentile (0-100) of `values`, interpolating linearly between ranks; 0 for
/// no values.
pub fn percentile(values: &[f64], p: f64) -> f64 {
    if values.is_empty() {
        return 0.0;
    }
    let mut sorted = values.to_vec();
    sorted.sort_by(f64::total_cmp);
    let rank = (p.clamp(0.0, 100.0) / 100.0) * (sorted.len() - 1) as f64;
    let low = rank.floor() as usize;
    let high = rank.ceil() as usize;
    sorted[low] + (sorted[high] - sorted[low]) * (rank - low as f64)
}

/// Mean, median and tail of one latency, in milliseconds.
#[derive(Debug, Clone, Copy, Default, Serialize, PartialEq)]
pub struct LatencySummary {
    /// Arithmetic mean.
    pub mean: f64,
    /// 50th percentile.
    pub median: f64,
    /// 90th percentile.
    pub p90: f64,
    /// 99th percentile.
    pub p99: f64,
}

impl LatencySummary {
    /// Summarizes `seconds`, reported in milliseconds.
    pub fn of_seconds(seconds: &[f64]) -> Self {
        let ms: Vec<f64> = seconds.iter().map(|s| s * 1000.0).collect();
        let mean = if ms.is_empty() {
            0.0
        } else {
            ms.iter().sum::<f64>() / ms.len() as f64
        };
        Self {
            mean,
            median: percentile(&ms, 50.0),
            p90: percentile(&ms, 90.0),
            p99: percentile(&ms, 99.0),
        }
    }
}

/// Latency objectives a request must all meet to count towards goodput, in milliseconds.
#[derive(Debug, Clone, Copy, Default, Serialize, PartialEq)]
pub struct Slo {
    /// Time to first token at most.
    pub ttft_ms: Option<f64>,
    /// Time per output token (after the first) at most.
    pub tpot_ms: Option<f64>,
    /// End-to-end latency at most.
    pub e2el_ms: Option<f64>,
}

impl Slo {
    /// Parses `ttft:MS,tpot:MS,e2el:MS` (any subset).
    pub fn parse(text: &str) -> Result<Self, String> {
        let mut slo = Slo::default();
        for part in text.split(',').filter(|p| !p.trim().is_empty()) {
            let (name, value) = part
                .split_once(':')
                .ok_or_else(|| format!("'{part}' is not NAME:MILLISECONDS"))?;
            let ms: f64 = value
                .trim()
                .parse()
                .ok()
                .filter(|v: &f64| v.is_finite() && *v > 0.0)
                .ok_or_else(|| format!("'{value}' is not a positive number of milliseconds"))?;
            match name.trim() {
                "ttft" => slo.ttft_ms = Some(ms),
                "tpot" => slo.tpot_ms = Some(ms),
                "e2el" => slo.e2el_ms = Some(ms),
                other => return Err(format!("unknown objective '{other}' (ttft, tpot, e2el)")),
            }
        }
        if slo == Slo::default() {
            return Err("give at least one objective, e.g. ttft:500,tpot:50".into());
        }
        Ok(slo)
    }

    /// Whether a request with these latencies (seconds) meets every objective.
    pub fn met(&self, ttft: f64, tpot: f64, e2el: f64) -> bool {
        let within =
            |limit: Option<f64>, seconds: f64| limit.is_none_or(|ms| seconds * 1000.0 <= ms);
        within(self.ttft_ms, ttft) && within(self.tpot_ms, tpot) && within(self.e2el_ms, e2el)
    }
}

/// Time per output token after the first: `(e2e - ttft) / (tokens - 1)`, or `None` for a
/// single-token output.
pub fn time_per_output_token(ttft: f64, e2e: f64, output_tokens: u64) -> Option<f64> {
    (output_tokens > 1).then(|| (e2e - ttft) / (output_tokens - 1) as f64)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn percentiles_interpolate_like_numpy() {
        let v = [1.0, 2.0, 3.0, 4.0];
        assert_eq!(percentile(&v, 0.0), 1.0);
        assert_eq!(percentile(&v, 100.0), 4.0);
        assert_eq!(percentile(&v, 50.0), 2.5);
        // numpy.percentile([1,2,3,4], 90) == 3.7
        assert!((percentile(&v, 90.0) - 3.7).abs() < 1e-12);
        assert_eq!(
            percentile(&[4.0, 1.0, 3.0, 2.0], 50.0),
            2.5,
            "order does not matter"
        );
        assert_eq!(percentile(&[], 50.0), 0.0);
        assert_eq!(percentile(&[7.0], 99.0), 7.0);
        let s = LatencySummary::of_seconds(&[0.1, 0.2, 0.3]);
        assert!((s.mean - 200.0).abs() < 1e-9 && (s.median - 200.0).abs() < 1e-9);
        assert!((s.p99 - 298.0).abs() < 1e-9);
    }

    #[test]
    fn arrivals_are_seeded_poisson_or_gamma() {
        assert_eq!(arrival_times(3, None, 1.0, 0), vec![0.0; 3]);
        let a = arrival_times(20_000, Some(4.0), 1.0, 42);
        assert_eq!(
            a,
            arrival_times(20_000, Some(4.0), 1.0, 42),
            "same seed, same times"
        );
        assert_ne!(a, arrival_times(20_000, Some(4.0), 1.0, 43));
        assert!(a.windows(2).all(|w| w[1] >= w[0]));
        let gaps: Vec<f64> = std::iter::once(a[0])
            .chain(a.windows(2).map(|w| w[1] - w[0]))
            .collect();
        let mean = gaps.iter().sum::<f64>() / gaps.len() as f64;
        let var = gaps.iter().map(|g| (g - mean).powi(2)).sum::<f64>() / gaps.len() as f64;
        assert!((mean - 0.25).abs() < 0.01, "mean gap {mean}");
        // Exponential gaps: standard deviation equals the mean.
        assert!(
            (var.sqrt() / mean - 1.0).abs() < 0.05,
            "cv {}",
            var.sqrt() / mean
        );
        // Burstiness 4: gamma with shape 4, coefficient of variation 1/2, same mean.
        let b = arrival_times(20_000, Some(4.0), 4.0, 42);
        let gaps: Vec<f64> = std::iter::once(b[0])
            .chain(b.windows(2).map(|w| w[1] - w[0]))
            .collect();
        let mean = gaps.iter().sum::<f64>() / gaps.len() as f64;
        let sd = (gaps.iter().map(|g| (g - mean).powi(2)).sum::<f64>() / gaps.len() as f64).sqrt();
        assert!((mean - 0.25).abs() < 0.01, "mean gap {mean}");
        assert!((sd / mean - 0.5).abs() < 0.05, "cv {}", sd / mean);
    }

    #[test]
    fn goodput_objectives_parse_and_apply() {
        let slo = Slo::parse("ttft:500,tpot:50").unwrap();
        assert_eq!(slo.ttft_ms, Some(500.0));
        assert_eq!(slo.tpot_ms, Some(50.0));
        assert!(slo.met(0.4, 0.04, 100.0), "no e2e objective");
        assert!(!slo.met(0.6, 0.04, 1.0));
        assert!(!slo.met(0.4, 0.06, 1.0));
        assert!(Slo::parse("ttft:0").is_err());
        assert!(Slo::parse("speed:5").is_err());
        assert!(Slo::parse("ttft").is_err());
        assert!(Slo::parse("").is_err());
        assert_eq!(time_per_output_token(1.0, 3.0, 5), Some(0.5));
        assert_eq!(time_per_output_token(1.0, 3.0, 1), None);
    }
}
