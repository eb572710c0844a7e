//! SiLU (`x / (1 + e^-x)`, the gate of SwiGLU) as thicket computes it on the CPU: with
//! `softmax::exp`'s fused multiply-adds, so a whole row of gates vectorises (the build targets
//! the host CPU, whose FMA instructions they become), where the library `exp` is a call per
//! value. The fused CPU pass and the candle-ops forward with
//! thicket's attention both use it (their logits stay bit-identical); the reference
//! arithmetic (`--attention reference`) keeps candle's own `silu`. Gemma's tanh GELU
//! (`gelu_tanh`) is built the same way from `exp`, and used where SiLU is; `gated` and
//! `gated_into` apply either activation as the family declares.

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

/// `gate = act(gate) * up` for the family's activation.
pub fn gated(activation: Activation, gate: &mut [f32], up: &[f32]) {
    match activation {
        Activation::Silu => swiglu(gate, up),
        Activation::GeluTanh => {
            for (g, u) in gate.iter_mut().zip(up) {
                *g = gelu_tanh(*g) * *u;
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
