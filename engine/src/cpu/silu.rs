//! SiLU (`x / (1 + e^-x)`, the gate of SwiGLU) as thicket computes it on the CPU: with
//! `softmax::exp`'s fused multiply-adds, so a whole row of gates vectorises (the build targets
//! the host CPU, whose FMA instructions they become), where the library `exp` is a call per
//! value. The fused CPU pass and the candle-ops forward with
//! thicket's attention both use it (their logits stay bit-identical); the reference
//! arithmetic (`--attention reference`) keeps candle's own `silu`.

use crate::cpu::team::Disjoint;

use crate::cpu::softmax::exp;

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
