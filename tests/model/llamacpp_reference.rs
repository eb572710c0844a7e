//! Recorded llama.cpp runs as references: a JSON written by `scripts/rope-scaling-reference.py`
//! holds the tiny GGUF's sha256, the prompt, and for each context llama.cpp's greedy tokens and
//! every step's logits. `check_recorded` runs thicket on the same file and path and asserts the
//! same tokens and close logits.

use candle_core::{Device, Tensor};
use engine::Model;
use serde_json::Value;
use sha2::{Digest, Sha256};

use super::families::{compare, PROMPT, STEPS};

/// The largest `|a[i] - b[i]|`: how far apart two logit rows are.
pub(crate) fn largest_difference(a: &[f32], b: &[f32]) -> f32 {
    a.iter()
        .zip(b)
        .map(|(x, y)| (x - y).abs())
        .fold(0.0, f32::max)
}

/// Checks `model_for(n_ctx)` against each recorded context of `reference` (for a GGUF whose
/// bytes are `gguf`): the same greedy tokens for 32 steps, fed exactly what llama.cpp was fed,
/// and logits within `tolerance` of their scale. Returns each context's recorded logits.
pub(crate) fn check_recorded(
    reference: &str,
    gguf: &[u8],
    model_for: impl Fn(usize) -> Model,
    tolerance: f32,
) -> Vec<Vec<Vec<f32>>> {
    let reference: Value = serde_json::from_str(reference).unwrap();
    // The file the reference ran on: a GGUF, or an HF checkpoint's safetensors.
    let recorded = reference
        .get("gguf_sha256")
        .or_else(|| reference.get("safetensors_sha256"))
        .and_then(Value::as_str)
        .unwrap();
    assert_eq!(
        recorded,
        format!("{:x}", Sha256::digest(gguf)),
        "the tiny model changed: rerun the script named in the reference's made_by"
    );
    let prompt: Vec<u32> = serde_json::from_value(reference["prompt"].clone()).unwrap();
    assert_eq!(prompt, PROMPT);
    let mut runs = Vec::new();
    for run in reference["runs"].as_array().unwrap() {
        let n_ctx = run["n_ctx"].as_u64().unwrap() as usize;
        let tokens: Vec<u32> = serde_json::from_value(run["tokens"].clone()).unwrap();
        let logits: Vec<Vec<f32>> = serde_json::from_value(run["logits"].clone()).unwrap();
        assert_eq!(logits.len(), STEPS + 1);
        let ours = model_for(n_ctx);
        let mut step = 0;
        let found = compare(&ours, &PROMPT, |x, _pos| {
            // Fed what llama.cpp was fed: the prompt, then its own greedy tokens.
            let fed = x.flatten_all()?.to_vec1::<u32>()?;
            let expected = if step == 0 {
                prompt.clone()
            } else {
                vec![tokens[step - 1]]
            };
            assert_eq!(fed, expected, "context {n_ctx}, step {step}");
            let row = Tensor::new(logits[step].as_slice(), &Device::Cpu)?.unsqueeze(0);
            step += 1;
            row
        });
        assert_eq!(found.tokens[..tokens.len()], tokens[..], "context {n_ctx}");
        assert!(
            found.worst <= tolerance * found.scale && found.scale > 1.0,
            "context {n_ctx}: max |ours - llama.cpp| = {} against logits up to {}",
            found.worst,
            found.scale
        );
        runs.push(logits);
    }
    runs
}
