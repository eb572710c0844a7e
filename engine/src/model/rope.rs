//! RoPE's cos/sin tables, `[max_positions, rotary_dim / 2]` each (the rotated dimensions of a
//! head: all of them unless the file says fewer): the global one (the file's base,
//! with its long-context scaling: linear, Llama 3.1's piecewise, per-frequency factors, YaRN,
//! or Phi-3's LongRoPE, the last two with their attention factor on cos and sin) and,
//! for families whose windowed layers rotate with a base of their own (Gemma 3), the local one.
//! Computed as candle's reference models do: f32 inverse frequencies, position times frequency,
//! then cos and sin.

use candle_core::{DType, Device, Tensor};

use crate::model::config::{ModelConfig, RopeScaling, Rotary};
use crate::{Error, Result};

/// The table of the global layers.
pub fn global_table(cfg: &ModelConfig, device: &Device) -> Result<(Tensor, Tensor)> {
    let scaling = &cfg.variant.rope_scaling;
    let rotary = cfg.table_rotary(false);
    let rot = rotary.freq_dim;
    let inv_freq = scaled(frequencies(cfg.rope_theta, rotary), scaling)?;
    let inv_freq = match scaling {
        RopeScaling::Yarn {
            factor,
            original,
            beta_fast,
            beta_slow,
            truncate,
            ..
        } => yarn(
            &inv_freq,
            (*factor, *original),
            (*beta_fast, *beta_slow, *truncate),
            (cfg.rope_theta, rot),
        ),
        _ => inv_freq,
    };
    let (cos, sin) = table(inv_freq, cfg.max_position_embeddings, device)?;
    match scaling {
        RopeScaling::LongRope {
            attention_factor, ..
        }
        | RopeScaling::Yarn {
            attention_factor, ..
        } if *attention_factor != 1.0 => {
            let by = f64::from(*attention_factor);
            Ok(((cos * by)?, (sin * by)?))
        }
        _ => Ok((cos, sin)),
    }
}

/// YaRN's frequencies: pair `i` keeps `inv_freq[i]` (extrapolation) below the ramp, takes
/// `inv_freq[i] / factor` (interpolation) above it, and blends linearly across it; the ramp
/// runs between the pairs that turn `beta_fast` and `beta_slow` times over the original
/// context (floored and ceiled, as llama.cpp bounds it and transformers unless told not to).
fn yarn(
    inv_freq: &[f32],
    (factor, original): (f32, usize),
    (beta_fast, beta_slow, truncate): (f32, f32, bool),
    (theta, hd): (f32, usize),
) -> Vec<f32> {
    let dim = hd as f64;
    let pair_of = |rotations: f32| {
        dim * (original as f64 / (f64::from(rotations) * 2.0 * std::f64::consts::PI)).ln()
            / (2.0 * f64::from(theta).ln())
    };
    let (low, high) = match truncate {
        true => (pair_of(beta_fast).floor(), pair_of(beta_slow).ceil()),
        false => (pair_of(beta_fast), pair_of(beta_slow)),
    };
    let (low, high) = (low.max(0.0), high.min(dim - 1.0));
    let span = if high == low { 0.001 } else { high - low };
    inv_freq
        .iter()
        .enumerate()
        .map(|(i, &f)| {
            let ramp = ((i as f64 - low) / span).clamp(0.0, 1.0) as f32;
            let extrapolation = 1.0 - ramp;
            f / factor * (1.0 - extrapolation) + f * extrapolation
        })
        .collect()
}

/// The table of the windowed layers, where they have a base of their own.
pub fn local_table(cfg: &ModelConfig, device: &Device) -> Result<Option<(Tensor, Tensor)>> {
    let v = &cfg.variant;
    match v.local_rope_theta {
        Some(theta) if v.layers.iter().any(|l| l.local_rope) => Ok(Some(table(
            frequencies(theta, cfg.table_rotary(true)),
            cfg.max_position_embeddings,
            device,
        )?)),
        _ => Ok(None),
    }
}

/// The frequencies of the pairs `rotary` turns: the leading ones of a head of its
/// `freq_dim`.
fn frequencies(theta: f32, rotary: Rotary) -> Vec<f32> {
    let mut all = inverse_frequencies(theta, rotary.freq_dim);
    all.truncate(rotary.pairs);
    all
}

/// `1 / theta^(2i / d)` for each pair of a head of width `d`.
fn inverse_frequencies(theta: f32, hd: usize) -> Vec<f32> {
    (0..hd)
        .step_by(2)
        .map(|i| 1f32 / theta.powf(i as f32 / hd as f32))
        .collect()
}

/// The frequencies after `scaling`.
fn scaled(mut inv_freq: Vec<f32>, scaling: &RopeScaling) -> Result<Vec<f32>> {
    match scaling {
        RopeScaling::None => {}
        RopeScaling::Linear { factor } => {
            for f in &mut inv_freq {
                *f /= *factor;
            }
        }
        RopeScaling::Llama3 {
            factor,
            low_freq_factor,
            high_freq_factor,
            original_max_position_embeddings,
        } => {
            let old = *original_max_position_embeddings as f32;
            let low_wavelen = old / low_freq_factor;
            let high_wavelen = old / high_freq_factor;
            for f in &mut inv_freq {
                let wavelen = 2.0 * std::f32::consts::PI / *f;
                if wavelen > low_wavelen {
                    *f /= factor;
                } else if wavelen >= high_wavelen {
                    let smooth =
                        (old / wavelen - low_freq_factor) / (high_freq_factor - low_freq_factor);
                    *f = (1.0 - smooth) * *f / factor + smooth * *f;
                }
            }
        }
        RopeScaling::Factors(factors) => divide(&mut inv_freq, factors, "rope_freqs")?,
        // Blended in `global_table`, which knows the base and the head.
        RopeScaling::Yarn { .. } => {}
        RopeScaling::LongRope {
            short,
            long,
            long_context,
            ..
        } => {
            // Both sets must fit the head, whichever is in use.
            for (set, name) in [(short, "rope_factors_short"), (long, "rope_factors_long")] {
                divide(&mut inv_freq.clone(), set, name)?;
            }
            let set = if *long_context { long } else { short };
            divide(&mut inv_freq, set, "rope factors")?;
        }
    }
    Ok(inv_freq)
}

/// Each frequency divided by its factor (`name` the factors' tensor, for the error).
fn divide(inv_freq: &mut [f32], factors: &[f32], name: &str) -> Result<()> {
    if factors.len() != inv_freq.len() {
        return Err(Error::Metadata(format!(
            "{name} holds {} factors for {} frequencies",
            factors.len(),
            inv_freq.len()
        )));
    }
    for (f, by) in inv_freq.iter_mut().zip(factors) {
        *f /= *by;
    }
    Ok(())
}

/// cos and sin of `position * frequency` for every position below `n`.
fn table(inv_freq: Vec<f32>, n: usize, device: &Device) -> Result<(Tensor, Tensor)> {
    let half = inv_freq.len();
    let inv_freq = Tensor::from_vec(inv_freq, (1, half), device)?;
    let positions = Tensor::arange(0u32, n as u32, device)?
        .to_dtype(DType::F32)?
        .reshape((n, 1))?;
    let angles = positions.matmul(&inv_freq)?;
    Ok((angles.cos()?, angles.sin()?))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn llama3_scaling_keeps_high_frequencies_and_divides_low_ones() {
        let base = inverse_frequencies(500_000.0, 128);
        let scaling = RopeScaling::Llama3 {
            factor: 8.0,
            low_freq_factor: 1.0,
            high_freq_factor: 4.0,
            original_max_position_embeddings: 8192,
        };
        let out = scaled(base.clone(), &scaling).unwrap();
        // Wavelength 2 pi: far below 8192 / 4, kept.
        assert_eq!(out[0], base[0]);
        // The lowest frequency's wavelength is far above 8192: divided by the factor.
        let last = base.len() - 1;
        assert_eq!(out[last], base[last] / 8.0);
        // In between, smoothly between the two.
        for (o, b) in out.iter().zip(&base) {
            assert!(*o <= *b && *o >= *b / 8.0, "{o} vs {b}");
        }
        assert!(out.iter().zip(&base).any(|(o, b)| *o < *b && *o > *b / 8.0));
    }

    #[test]
    fn yarn_rounds_the_ramp_unless_told_not_to_as_transformers_does() {
        // gpt-oss's own YaRN (base 150000, heads of 64, factor 32 over 4096), pairs 8 to 18
        // (the ramp), as transformers 5.23's `_compute_yarn_parameters` gives them.
        let unrounded = [
            0.050_813_27,
            0.031_705_696,
            0.019_335,
            0.011_592_049,
            0.006_794_959,
            0.003_860_359,
            0.002_093_792_7,
            0.001_052_602_2,
            0.000_456_483_9,
            0.000_129_318_7,
            3.830_881e-5,
        ];
        let rounded = [
            0.050_813_27,
            0.031_620_752,
            0.019_450_966,
            0.011_792_191,
            0.007_015_714,
            0.004_069_555,
            0.002_277_272,
            0.001_206_131,
            0.000_580_947_5,
            0.000_227_947_84,
            3.830_881e-5,
        ];
        let base = inverse_frequencies(150_000.0, 64);
        for (truncate, want) in [(false, unrounded), (true, rounded)] {
            let got = yarn(&base, (32.0, 4096), (32.0, 1.0, truncate), (150_000.0, 64));
            for (i, w) in want.iter().enumerate() {
                let g = got[8 + i];
                assert!(
                    (g - w).abs() <= 2e-6 * w,
                    "truncate {truncate}, pair {}: {g} vs {w}",
                    8 + i
                );
            }
        }
    }

    #[test]
    fn per_frequency_factors_must_match_the_head() {
        let base = inverse_frequencies(10_000.0, 8);
        let err = scaled(base.clone(), &RopeScaling::Factors(vec![1.0; 3])).unwrap_err();
        assert!(err.to_string().contains("rope_freqs"), "{err}");
        let out = scaled(base.clone(), &RopeScaling::Factors(vec![2.0; 4])).unwrap();
        assert_eq!(out, base.iter().map(|f| f / 2.0).collect::<Vec<_>>());
    }

    #[test]
    fn yarn_extrapolates_fast_pairs_and_interpolates_slow_ones() {
        // Heads of 64 at base 10k over an original 4096: pairs below the fast bound keep their
        // frequency, pairs above the slow bound are divided by the factor.
        let base = inverse_frequencies(10_000.0, 64);
        let out = yarn(&base, (4.0, 4096), (32.0, 1.0, true), (10_000.0, 64));
        assert_eq!(out[0], base[0]);
        assert_eq!(out[31], base[31] / 4.0);
        let blended = (0..32).filter(|&i| out[i] < base[i] && out[i] > base[i] / 4.0);
        assert!(blended.count() > 3);
        for (o, b) in out.iter().zip(&base) {
            assert!(*o <= *b && *o >= *b / 4.0 - 1e-12, "{o} vs {b}");
        }
    }

    #[test]
    fn longrope_takes_the_set_of_its_context_and_scales_cos_and_sin() {
        let longrope = |long_context| RopeScaling::LongRope {
            short: vec![1.0, 2.0, 4.0, 8.0],
            long: vec![3.0; 4],
            original: 4,
            attention_factor: 1.5,
            long_context,
        };
        let base = inverse_frequencies(10_000.0, 8);
        let short = scaled(base.clone(), &longrope(false)).unwrap();
        assert_eq!(short[2], base[2] / 4.0);
        let long = scaled(base.clone(), &longrope(true)).unwrap();
        assert_eq!(long, base.iter().map(|f| f / 3.0).collect::<Vec<_>>());
        let cfg = ModelConfig {
            architecture: crate::model::config::Architecture::Phi3,
            vocab_size: 8,
            hidden_size: 16,
            intermediate_size: 32,
            num_layers: 1,
            num_heads: 2,
            num_kv_heads: 2,
            head_dim: 8,
            rope_theta: 10_000.0,
            rope_style: crate::model::config::RopeStyle::Halves,
            rms_norm_eps: 1e-6,
            max_position_embeddings: 16,
            attention_bias: false,
            variant: crate::model::config::Variant {
                rope_scaling: longrope(true),
                ..Default::default()
            },
        };
        let (cos, sin) = global_table(&cfg, &Device::Cpu).unwrap();
        let (cos, sin) = (cos.to_vec2::<f32>().unwrap(), sin.to_vec2::<f32>().unwrap());
        // Position 0: cos 1 and sin 0, times the factor.
        assert_eq!((cos[0][0], sin[0][0]), (1.5, 0.0));
        let angle = 5.0 * long[1];
        assert!((cos[5][1] - 1.5 * angle.cos()).abs() < 1e-5);
        // A set that does not fit the head is an error naming it, even when not in use.
        let mut bad = longrope(false);
        if let RopeScaling::LongRope { long, .. } = &mut bad {
            long.pop();
        }
        let err = scaled(base, &bad).unwrap_err();
        assert!(err.to_string().contains("rope_factors_long"), "{err}");
    }
}
