//! GGUF headers: thicket's reader gives candle's reader's metadata and tensor table on real
//! and tiny files, and a file with a tensor of a type thicket does not read (an unnamed type
//! number; MXFP4 outside a mixture's experts) is refused in one line that names the tensor
//! and its type, by the loader and by the command line, with no backtrace even where
//! backtraces are asked for.

use candle_core::quantized::gguf_file::Content;
use candle_core::quantized::GgmlDType;
use engine::model::gguf_header;
use engine::model::testing::{write_tiny_gguf, TinyModelSpec};
use engine::{load_model, Error, LoadOptions};

use crate::support::processes::thicket;

/// Rewrites the GGML type number of `tensor` in the header of the GGUF at `path`.
fn retype(path: &std::path::Path, tensor: &str, code: u32) {
    let mut bytes = std::fs::read(path).unwrap();
    // A tensor entry: u64 name length, the name, u32 dimensions, u64 per dimension, u32 type.
    let mut key = (tensor.len() as u64).to_le_bytes().to_vec();
    key.extend_from_slice(tensor.as_bytes());
    let at = bytes
        .windows(key.len())
        .position(|w| w == key.as_slice())
        .expect("the tensor's entry");
    let dims_at = at + key.len();
    let dims = u32::from_le_bytes(bytes[dims_at..dims_at + 4].try_into().unwrap()) as usize;
    let type_at = dims_at + 4 + 8 * dims;
    bytes[type_at..type_at + 4].copy_from_slice(&code.to_le_bytes());
    std::fs::write(path, bytes).unwrap();
}

fn tiny_file(dir: &std::path::Path) -> std::path::PathBuf {
    let path = dir.join("tiny.gguf");
    write_tiny_gguf(&path, &TinyModelSpec::default(), GgmlDType::Q8_0).unwrap();
    path
}

/// Metadata and tensor table as comparable text.
fn described(content: &Content) -> (Vec<String>, Vec<String>, u64) {
    let mut metadata: Vec<String> = content
        .metadata
        .iter()
        .map(|(k, v)| format!("{k} = {v:?}"))
        .collect();
    metadata.sort();
    let mut tensors: Vec<String> = content
        .tensor_infos
        .iter()
        .map(|(k, t)| format!("{k}: {:?} {:?} @{}", t.ggml_dtype, t.shape, t.offset))
        .collect();
    tensors.sort();
    (metadata, tensors, content.tensor_data_offset)
}

#[test]
fn the_header_reads_as_candle_reads_it() {
    let dir = tempfile::tempdir().unwrap();
    let tiny = tiny_file(dir.path());
    let files = [
        tiny,
        crate::support::fixtures::smollm2_path(),
        crate::support::fixtures::gemma3_path(),
    ];
    for path in files {
        let mut file = std::fs::File::open(&path).unwrap();
        let theirs = Content::read(&mut file).unwrap();
        let ours = gguf_header::read(&mut file).unwrap();
        assert!(ours.others.is_empty());
        let (ours, theirs) = (described(&ours.content), described(&theirs));
        assert!(!theirs.1.is_empty());
        assert_eq!(ours, theirs, "{}", path.display());
    }
}

#[test]
fn a_tensor_of_a_type_thicket_cannot_read_is_named_in_one_line() {
    let dir = tempfile::tempdir().unwrap();
    let path = tiny_file(dir.path());
    retype(&path, "blk.0.ffn_down.weight", 39);
    retype(&path, "blk.1.ffn_down.weight", 39);
    let err = load_model(path.to_str().unwrap(), &LoadOptions::default())
        .expect_err("an MXFP4 tensor is not read");
    assert!(matches!(err, Error::UnreadableTensor { .. }), "{err:?}");
    let message = err.to_string();
    assert!(
        message.contains("tensor 'blk.0.ffn_down.weight' is stored as MXFP4 (GGML type 39)")
            && message.contains("(and 1 more tensor)")
            && message.contains("only in a mixture's stacked experts")
            && message.contains(path.to_str().unwrap()),
        "{message}"
    );

    // A number GGML does not name is still said as a number.
    let path = tiny_file(dir.path());
    retype(&path, "blk.0.attn_q.weight", 77);
    let message = load_model(path.to_str().unwrap(), &LoadOptions::default())
        .expect_err("type 77 is not read")
        .to_string();
    assert!(
        message.contains("'blk.0.attn_q.weight' is stored as GGML type 77")
            && message.contains("a type thicket cannot read; it reads F32, F16, Q4_0")
            && message.contains("and MXFP4 experts"),
        "{message}"
    );

    // The command line says it in one line, with no backtrace though one is asked for.
    retype(&path, "blk.0.attn_q.weight", 39);
    let out = thicket()
        .args([
            "generate",
            "--model",
            path.to_str().unwrap(),
            "--prompt",
            "hi",
        ])
        .env("RUST_BACKTRACE", "1")
        .env("RUST_LIB_BACKTRACE", "1")
        .output()
        .unwrap();
    assert!(!out.status.success(), "{out:?}");
    let stderr = String::from_utf8_lossy(&out.stderr);
    let lines: Vec<&str> = stderr.lines().filter(|l| !l.trim().is_empty()).collect();
    assert_eq!(lines.len(), 1, "{stderr}");
    assert!(
        lines[0].starts_with("error: ") && lines[0].contains("MXFP4 (GGML type 39)"),
        "{stderr}"
    );
}
