//! SiLU (`x / (1 + e^-x)`, the gate of SwiGLU) as thicket computes it on the CPU: with
//! `softmax::exp`'s fused multiply-adds, so a whole row of gates vectorises (the build targets
//! the host CPU, whose FMA instructions they become), where the library `exp` is a call per
//! value. The fused CPU pass and the candle-ops forward with
//! thicket's attention both use it (their logits stay bit-identical); the reference
//! arithmetic (`--attention reference`) keeps candle's own `silu`. Gemma's tanh GELU
//! (`gelu_tanh`) is built the same way from `exp`, and used where SiLU is, and gpt-oss's
//! clamped SwiGLU (`swiglu_oai`) too; `gated` and `gated_into` apply the activation the
//! family declares. BERT's exact GELU (`gelu_erf`, `0.5 v (1 + erf(v / sqrt 2))`) takes `erf`
//! from a rational approximation over the same `exp`.

use crate::cpu::team::Disjoint;

use crate::cpu::softmax::exp;
use crate::model::config::Activation;

/// `sqrt(2 / pi)`, as candle rounds it.
const SQRT_TWO_OVER_PI: f32 = 0.797_884_6;

/// `0.5 v (1 + tanh(u))` with `u = sqrt(2/pi) v (1 + 0.044715 v^2)`: GELU's tanh
/// approximation, computed as the equal `v / (1 + e^(-2u))` (no cancellation where `tanh`
/// nears -1) through `softmax::exp`'s fused multiply-adds, so a row of gates vectorises (the
/// library `tanhf` is a call per value); within a few ulp of the exact value (tested).
#[inline(always)]
pub fn gelu_tanh(v: f32) -> f32 {
    let u = SQRT_TWO_OVER_PI * v * (1.0 + 0.044715 * v * v);
    let x = -2.0 * u;
    let e = if x > EXP_CEILING {
        f32::INFINITY
    } else {
        exp(x)
    };
    v / (1.0 + e)
}

/// `0.5 v (1 + erf(v / sqrt 2))`, GELU as BERT defines it, with `erf` from Abramowitz and
/// Stegun's 7.1.26 (absolute error under 1.5e-7) over `softmax::exp`, so a row vectorises.
#[inline(always)]
pub fn gelu_erf(v: f32) -> f32 {
    const P: f32 = 0.327_591_1;
    const A: [f32; 5] = [
        0.254_829_6,
        -0.284_496_74,
        1.421_413_8,
        -1.453_152_1,
        1.061_405_4,
    ];
    let x = (v * std::f32::consts::FRAC_1_SQRT_2).abs();
    let t = 1.0 / P.mul_add(x, 1.0);
    let poly = t * A[4]
        .mul_add(t, A[3])
        .mul_add(t, A[2])
        .mul_add(t, A[1])
        .mul_add(t, A[0]);
    // e^(-x^2) vanishes long before the floor of `exp`.
    let erf = 1.0 - poly * exp((-x * x).max(-87.0));
    let erf = if v < 0.0 { -erf } else { erf };
    0.5 * v * (1.0 + erf)
}

/// gpt-oss's slope in its gate's sigmoid.
const OAI_ALPHA: f32 = 1.702;
/// gpt-oss's clamp on the gate (above) and the up projection (both sides).
const OAI_LIMIT: f32 = 7.0;

/// gpt-oss's gated value: with `g = min(gate, 7)`, `g / (1 + e^(-1.702 g)) * (clamp(up, -7,
/// 7) + 1)` (llama.cpp's `swiglu_oai` and transformers' order of operations).
#[inline(always)]
pub fn swiglu_oai(gate: f32, up: f32) -> f32 {
    let g = gate.min(OAI_LIMIT);
    let u = up.clamp(-OAI_LIMIT, OAI_LIMIT);
    let x = -(OAI_ALPHA * g);
    let e = if x > EXP_CEILING {
        f32::INFINITY
    } else {
        exp(x)
    };
    g / (1.0 + e) * (u + 1.0)
}

/// `gate = act(gate) * up` for the family's activation (`swiglu_oai` for gpt-oss).
pub fn gated(activation: Activation, gate: &mut [f32], up: &[f32]) {
    match activation {
        Activation::Silu => swiglu(gate, up),
        Activation::GeluTanh => {
            for (g, u) in gate.iter_mut().zip(up) {
                *g = gelu_tanh(*g) * *u;
            }
        }
        Activation::SwigluOai => {
            for (g, u) in gate.iter_mut().zip(up) {
                *g = swiglu_oai(*g, *u);
            }
        }
    }
}

/// `out = act(gate) * up`: one row of `gated`, written elsewhere.
pub fn gated_into(activation: Activation, gate: &[f32], up: &[f32], out: &mut [f32]) {
    match activation {
        Activation::Silu => swiglu_into(gate, up, out),
        Activation::GeluTanh => {
            for ((o, g), u) in out.iter_mut().zip(gate).zip(up) {
                *o = gelu_tanh(*g) * *u;
            }
        }
        Activation::SwigluOai => {
            for ((o, g), u) in out.iter_mut().zip(gate).zip(up) {
                *o = swiglu_oai(*g, *u);
            }
        }
    }
}

/// Above this, `e^x` is taken as infinite (the true value nears f32's largest; the gate's
/// output is then a vanishing fraction of a tiny number either way).
const EXP_CEILING: f32 = 88.0;

/// `v / (1 + e^-v)`, within a few ulp of the exact value.
#[inline(always)]
pub fn silu(v: f32) -> f32 {
    let x = -v;
    let e = if x > EXP_CEILING {
        f32::INFINITY
    } else {
        exp(x)
    };
    v / (1.0 + e)
}

/// Values past which `swiglu` splits over the forward's team, in runs of this many (each run one
/// vectorised loop; split value by value, the pool's bookkeeping would cost more than the
/// arithmetic).
const PARALLEL_VALUES: usize = 1 << 15;

/// `gate = silu(gate) * up`, element by element.
pub fn swiglu(gate: &mut [f32], up: &[f32]) {
    let run = |gate: &mut [f32], up: &[f32]| {
        for (g, u) in gate.iter_mut().zip(up) {
            *g = silu(*g) * *u;
        }
    };
    let len = gate.len().min(up.len());
    if len > PARALLEL_VALUES {
        let runs = len.div_ceil(PARALLEL_VALUES);
        let shared = Disjoint::new(gate);
        crate::cpu::team::for_each(runs, |i| {
            let at = i * PARALLEL_VALUES;
            let n = PARALLEL_VALUES.min(len - at);
            // SAFETY: run `i` alone reaches `gate[at..at + n]`, inside the buffer, which
            // stays borrowed for the whole loop.
            run(unsafe { shared.run(at, n) }, &up[at..at + n]);
        });
    } else {
        run(gate, up);
    }
}

/// `out = silu(gate) * up`, element by element: one row of `swiglu`, written elsewhere.
pub fn swiglu_into(gate: &[f32], up: &[f32], out: &mut [f32]) {
    for ((o, g), u) in out.iter_mut().zip(gate).zip(up) {
        *o = silu(*g) * *u;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn swiglu_oai_matches_its_definition_and_clamps() {
        // The definition in f64, over gates and ups inside and past the clamps.
        let mut worst = 0f64;
        for i in -400..=400 {
            for j in [-30.0f64, -7.5, -3.0, -0.4, 0.0, 0.9, 6.9, 7.0, 12.0] {
                let gate = f64::from(i) / 25.0;
                let g = gate.min(7.0);
                let want = g / (1.0 + (-1.702 * g).exp()) * (j.clamp(-7.0, 7.0) + 1.0);
                let got = f64::from(swiglu_oai(gate as f32, j as f32));
                let scale = want.abs().max(1e-3);
                worst = worst.max((got - want).abs() / scale);
            }
        }
        assert!(worst < 1e-5, "relative error {worst}");
        // Past the clamps nothing grows: a gate of 100 is a gate of 7, an up of -50 one of -7.
        assert_eq!(swiglu_oai(100.0, 2.0), swiglu_oai(7.0, 2.0));
        assert_eq!(swiglu_oai(3.0, -50.0), swiglu_oai(3.0, -7.0));
        assert_ne!(swiglu_oai(-100.0, 2.0), swiglu_oai(-7.0, 2.0));
        // `gated` and `gated_into` apply it value by value.
        let (gate, up) = ([-9.0f32, -1.0, 0.5, 8.0], [3.0f32, -8.0, 0.25, 1.0]);
        let mut inplace = gate;
        gated(Activation::SwigluOai, &mut inplace, &up);
        let mut out = [0f32; 4];
        gated_into(Activation::SwigluOai, &gate, &up, &mut out);
        for i in 0..4 {
            assert_eq!(inplace[i], swiglu_oai(gate[i], up[i]));
            assert_eq!(out[i], inplace[i]);
        }
    }

    #[test]
    fn gelu_erf_matches_the_definition_over_its_range() {
        // erf from its Taylor series (|x| < 3) or its asymptotic tail, in f64.
        fn erf(x: f64) -> f64 {
            if x.abs() >= 3.0 {
                let t = 1.0 / (x * x);
                let tail = (-x * x).exp() / (x.abs() * std::f64::consts::PI.sqrt())
                    * (1.0 - 0.5 * t + 0.75 * t * t - 1.875 * t * t * t + 6.5625 * t.powi(4));
                return x.signum() * (1.0 - tail);
            }
            let (mut term, mut sum) = (x, x);
            for n in 1..120 {
                term *= -x * x / n as f64;
                sum += term / (2 * n + 1) as f64;
            }
            sum * 2.0 / std::f64::consts::PI.sqrt()
        }
        let mut v = -12.0f32;
        while v <= 12.0 {
            let want = 0.5 * f64::from(v) * (1.0 + erf(f64::from(v) / std::f64::consts::SQRT_2));
            let got = f64::from(gelu_erf(v));
            assert!(
                (got - want).abs() <= 2e-7 * (1.0 + f64::from(v).abs()),
                "{v}: {got} vs {want}"
            );
            v += 0.013;
        }
        assert_eq!(gelu_erf(0.0), 0.0);
        assert_eq!(gelu_erf(-30.0), 0.0);
        assert_eq!(gelu_erf(30.0), 30.0);
    }

    #[test]
    fn gelu_tanh_matches_the_definition_over_its_range() {
        for i in 0..=400_000 {
            let v = -60.0 + 120.0 * i as f32 / 400_000.0;
            let x = v as f64;
            let u = (2.0 / std::f64::consts::PI).sqrt() * x * (1.0 + 0.044715 * x * x);
            // 0.5 x (1 + tanh u), written without its cancellation where tanh u nears -1.
            let exact = x / (1.0 + (-2.0 * u).exp());
            let got = gelu_tanh(v) as f64;
            // Relative where the value is normal, absolute in the vanishing tail. Rounding `u`
            // to f32 alone moves `e^(2u)` by up to ~2e-6 of itself where `|u|` is large (as in
            // candle's f32 expression).
            let err = (got - exact).abs() / exact.abs().max(1e-30);
            assert!(
                err < 1e-5 || (got - exact).abs() < 1e-30,
                "gelu({v}) = {got} vs {exact}"
            );
        }
    }

    #[test]
    fn silu_matches_the_definition_over_its_range() {
        let mut worst = 0f64;
        for i in 0..=400_000 {
            let v = -120.0 + 240.0 * i as f32 / 400_000.0;
            let exact = v as f64 / (1.0 + (-(v as f64)).exp());
            let got = silu(v) as f64;
            // Relative where the value is normal, absolute near the tiny tail.
            let err = (got - exact).abs() / exact.abs().max(1e-30);
            assert!(
                err < 4e-7 || (got - exact).abs() < 1e-35,
                "silu({v}) = {got} vs {exact}"
            );
            worst = worst.max(if exact.abs() > 1e-30 { err } else { 0.0 });
        }
        assert_eq!(silu(0.0), 0.0);
        assert_eq!(silu(f32::INFINITY), f32::INFINITY);
        assert_eq!(silu(-1000.0), 0.0);
        assert!(silu(f32::NAN).is_nan());
        eprintln!("worst relative error {worst:e}");
    }

    #[test]
    fn swiglu_gives_the_same_bits_split_or_not() {
        let n = 3 * PARALLEL_VALUES + 77;
        let gate: Vec<f32> = (0..n)
            .map(|i| ((i * 7919) % 2003) as f32 / 50.0 - 20.0)
            .collect();
        let up: Vec<f32> = (0..n)
            .map(|i| ((i * 104_729) % 997) as f32 / 100.0 - 5.0)
            .collect();
        let mut split = gate.clone();
        swiglu(&mut split, &up);
        for (i, (s, (g, u))) in split.iter().zip(gate.iter().zip(&up)).enumerate() {
            assert_eq!(s.to_bits(), (silu(*g) * *u).to_bits(), "value {i}");
        }
    }
}
