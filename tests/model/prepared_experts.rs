//! The prepared-experts file (`engine::model::experts::prepared`): a GGUF mixture whose
//! experts are mapped from the file prepared for the SIMD kernels computes the bits it
//! computes with its experts read into memory, for each mixture kind (the shared expert of
//! Qwen2-MoE stays in memory); the file is written once and mapped on later loads, written
//! again when the GGUF changes or the file is damaged, never written for a dense model, and a
//! directory that cannot be written leaves the experts in memory and the load working.

use std::path::{Path, PathBuf};

use candle_core::quantized::GgmlDType;
use candle_core::Device;
use engine::model::config::Architecture;
use engine::model::experts::Mlp;
use engine::model::testing::write_tiny_gguf;
use engine::Model;

use super::forward::prompt_then_tree_bits;
use super::moe::tiny_moe;

fn load(path: &Path, prepared: Option<&Path>) -> Model {
    let (config, weights) =
        engine::model::gguf::load_gguf_weights_with(path, None, &Device::Cpu, prepared).unwrap();
    Model::new(config, weights, Device::Cpu).unwrap()
}

/// Expert matrices mapped from a file, and all expert matrices (shared experts apart).
fn mapped(model: &Model) -> (usize, usize) {
    let mut counts = (0, 0);
    for layer in &model.weights().layers {
        if let Mlp::Experts(moe) = &layer.mlp {
            for linear in moe.experts.iter().flat_map(|e| e.projections()) {
                counts.1 += 1;
                if linear.packed().is_some_and(|m| m.is_mapped()) {
                    counts.0 += 1;
                }
            }
        }
    }
    counts
}

fn files(dir: &Path) -> Vec<PathBuf> {
    let mut found: Vec<PathBuf> = match std::fs::read_dir(dir) {
        Ok(entries) => entries.map(|e| e.unwrap().path()).collect(),
        Err(_) => Vec::new(),
    };
    found.sort();
    found
}

/// Whether this process's kernels read the layout the file holds (AVX2 and AVX-512 do).
fn kernels_read_tiles() -> bool {
    engine::cpu::qgemm::process_isa().reads_tiles16()
}

#[test]
fn mapped_experts_compute_the_bits_of_experts_in_memory() {
    for arch in [
        Architecture::Qwen3Moe,
        Architecture::Mixtral,
        Architecture::Qwen2Moe,
    ] {
        let dir = tempfile::tempdir().unwrap();
        let gguf = dir.path().join("tiny.gguf");
        let mut spec = tiny_moe(arch);
        // Q4_0 rows are whole blocks of 32.
        if let Some(experts) = spec.experts.as_mut() {
            experts.shared_width = experts.shared_width.map(|_| 64);
        }
        write_tiny_gguf(&gguf, &spec, GgmlDType::Q4_0).unwrap();
        let prepared = dir.path().join("prepared");
        let in_memory = load(&gguf, None);
        let expected = prompt_then_tree_bits(&in_memory);
        let (none, all) = mapped(&in_memory);
        assert_eq!(none, 0);
        assert_eq!(all, 3 * 8 * 3, "{arch:?}: three layers of 8 experts");

        let first = load(&gguf, Some(&prepared));
        if !kernels_read_tiles() {
            eprintln!("skipped: this CPU's kernels read GGUF's own layout, nothing to prepare");
            assert!(files(&prepared).is_empty());
            return;
        }
        let written = files(&prepared);
        assert_eq!(written.len(), 1, "{arch:?}: {written:?}");
        assert_eq!(mapped(&first), (all, all), "{arch:?}");
        assert_eq!(
            prompt_then_tree_bits(&first),
            expected,
            "{arch:?}: first load"
        );
        let modified = std::fs::metadata(&written[0]).unwrap().modified().unwrap();

        // Loaded again: mapped from the same file, not written again.
        let second = load(&gguf, Some(&prepared));
        assert_eq!(files(&prepared), written);
        let again = std::fs::metadata(&written[0]).unwrap().modified().unwrap();
        assert_eq!(again, modified, "{arch:?}: the file was written again");
        assert_eq!(mapped(&second), (all, all));
        assert_eq!(
            prompt_then_tree_bits(&second),
            expected,
            "{arch:?}: second load"
        );
    }
}

#[test]
fn a_changed_gguf_or_a_damaged_file_is_prepared_again() {
    if !kernels_read_tiles() {
        eprintln!("skipped: this CPU's kernels read GGUF's own layout, nothing to prepare");
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let gguf = dir.path().join("tiny.gguf");
    let prepared = dir.path().join("prepared");
    let mut spec = tiny_moe(Architecture::Qwen3Moe);
    write_tiny_gguf(&gguf, &spec, GgmlDType::Q4_0).unwrap();
    let expected = prompt_then_tree_bits(&load(&gguf, None));
    load(&gguf, Some(&prepared));
    let file = files(&prepared).pop().unwrap();
    let full = std::fs::metadata(&file).unwrap().len();

    // Cut in half: refused on opening, written anew.
    let f = std::fs::OpenOptions::new().write(true).open(&file).unwrap();
    f.set_len(full / 2).unwrap();
    drop(f);
    let repaired = load(&gguf, Some(&prepared));
    assert_eq!(std::fs::metadata(&file).unwrap().len(), full);
    assert_eq!(mapped(&repaired).0, mapped(&repaired).1);
    assert_eq!(prompt_then_tree_bits(&repaired), expected);

    // Header bytes overwritten: the same.
    let mut bytes = std::fs::read(&file).unwrap();
    bytes[20..40].fill(b'#');
    std::fs::write(&file, &bytes).unwrap();
    let repaired = load(&gguf, Some(&prepared));
    assert_eq!(prompt_then_tree_bits(&repaired), expected);

    // The GGUF rewritten with other weights of the same size: another file (told apart by
    // its modification time, set ahead here so a coarse file clock cannot hide the change),
    // and the new weights' bits, not the old file's.
    let old = std::fs::metadata(&gguf).unwrap();
    spec.seed += 1;
    write_tiny_gguf(&gguf, &spec, GgmlDType::Q4_0).unwrap();
    assert_eq!(std::fs::metadata(&gguf).unwrap().len(), old.len());
    let before = old.modified().unwrap();
    let rewritten = std::fs::OpenOptions::new().write(true).open(&gguf).unwrap();
    rewritten
        .set_modified(before + std::time::Duration::from_secs(10))
        .unwrap();
    drop(rewritten);
    let changed = prompt_then_tree_bits(&load(&gguf, None));
    assert_ne!(changed, expected);
    let reloaded = load(&gguf, Some(&prepared));
    assert_eq!(files(&prepared).len(), 2);
    assert_eq!(prompt_then_tree_bits(&reloaded), changed);
}

#[test]
fn a_dense_model_or_a_directory_that_cannot_be_written_prepares_nothing() {
    let dir = tempfile::tempdir().unwrap();
    // A dense model: nothing to prepare.
    let dense = dir.path().join("dense.gguf");
    let spec = engine::model::testing::TinyModelSpec {
        architecture: Architecture::Qwen3,
        hidden_size: 64,
        intermediate_size: 96,
        ..engine::model::testing::TinyModelSpec::default()
    };
    write_tiny_gguf(&dense, &spec, GgmlDType::Q4_0).unwrap();
    let prepared = dir.path().join("prepared");
    load(&dense, Some(&prepared));
    assert!(files(&prepared).is_empty());

    // The directory's place is a file: the mixture loads, its experts in memory.
    let gguf = dir.path().join("tiny.gguf");
    write_tiny_gguf(&gguf, &tiny_moe(Architecture::Qwen3Moe), GgmlDType::Q4_0).unwrap();
    let blocked = dir.path().join("not-a-directory");
    std::fs::write(&blocked, b"x").unwrap();
    let model = load(&gguf, Some(&blocked.join("prepared")));
    assert_eq!(mapped(&model).0, 0);
    assert_eq!(
        prompt_then_tree_bits(&model),
        prompt_then_tree_bits(&load(&gguf, None))
    );
}
