//! openai-harmony, the reference implementation of gpt-oss's tokenizer and chat format, for
//! the tests that check thicket against it from Python: the pinned packages installed under
//! `target/` (openai-harmony, and quicktok-v1 for the o200k data files), and the
//! `o200k_base.tiktoken` vocabulary written from quicktok's data, so openai-harmony loads it
//! from disk (`TIKTOKEN_ENCODINGS_BASE`) rather than downloading it.

use std::path::{Path, PathBuf};
use std::sync::Mutex;

use sha2::{Digest, Sha256};

/// The sha256 openai-harmony checks `o200k_base.tiktoken` against.
const O200K_BASE_SHA256: &str = "446a9538cb6c348e3516120d7c08b09f57c36495e2acfffe59a5bf8b0cfb1a2d";

/// Where the Python side of a harmony check finds what it needs.
#[derive(Debug, Clone)]
pub struct Harmony {
    /// The installed packages, for `PYTHONPATH`.
    pub pythonpath: PathBuf,
    /// The folder holding `o200k_base.tiktoken`, for `TIKTOKEN_ENCODINGS_BASE`.
    pub encodings: PathBuf,
    /// quicktok's data files (`o200k.vocab`, `o200k_harmony.special`).
    pub quicktok_data: PathBuf,
}

impl Harmony {
    /// `python3` with `PYTHONPATH` and `TIKTOKEN_ENCODINGS_BASE` set for openai-harmony.
    pub fn python(&self) -> std::process::Command {
        let mut command = std::process::Command::new("python3");
        command
            .env("PYTHONPATH", &self.pythonpath)
            .env("TIKTOKEN_ENCODINGS_BASE", &self.encodings);
        command
    }

    /// The standard output of `python3 ARGS` run as [`Self::python`] sets it up, which must
    /// succeed (its standard error otherwise the panic's message).
    pub fn run(&self, args: &[&std::ffi::OsStr]) -> Vec<u8> {
        let out = self.python().args(args).output().expect("running python3");
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        out.stdout
    }
}

/// Installs openai-harmony and quicktok-v1 (once) and writes `o200k_base.tiktoken` from
/// quicktok's `o200k.vocab` (once; checked against openai-harmony's hash).
pub fn harmony() -> Harmony {
    let pythonpath = crate::support::processes::python_packages(
        "harmony",
        &["openai-harmony==0.0.8", "quicktok-v1==0.4.0"],
        "openai_harmony",
    );
    let quicktok_data = pythonpath.join("quicktok/data");
    let encodings =
        Path::new(env!("CARGO_MANIFEST_DIR")).join("target/e2e-python/harmony-encodings");
    write_o200k_base(&quicktok_data.join("o200k.vocab"), &encodings);
    Harmony {
        pythonpath,
        encodings,
        quicktok_data,
    }
}

/// Writes `dir/o200k_base.tiktoken` (one `base64(bytes) rank` line per token, by rank) from
/// quicktok's `vocab`, unless a file with the right hash is already there.
fn write_o200k_base(vocab: &Path, dir: &Path) {
    static WRITING: Mutex<()> = Mutex::new(());
    let _one = WRITING.lock().unwrap_or_else(|e| e.into_inner());
    let path = dir.join("o200k_base.tiktoken");
    let sha = |bytes: &[u8]| format!("{:x}", Sha256::digest(bytes));
    if std::fs::read(&path).is_ok_and(|b| sha(&b) == O200K_BASE_SHA256) {
        return;
    }
    let data = std::fs::read(vocab).unwrap_or_else(|e| panic!("{}: {e}", vocab.display()));
    let word = |at: usize, n: usize| -> u32 {
        data[at..at + n]
            .iter()
            .rev()
            .fold(0, |acc, &b| (acc << 8) | u32::from(b))
    };
    let count = word(0, 4) as usize;
    let mut at = 4;
    let mut text = Vec::with_capacity(3 << 20);
    for _ in 0..count {
        let len = word(at, 2) as usize;
        let bytes = &data[at + 2..at + 2 + len];
        let rank = word(at + 2 + len, 4);
        at += 2 + len + 4;
        text.extend_from_slice(base64(bytes).as_bytes());
        text.extend_from_slice(format!(" {rank}\n").as_bytes());
    }
    assert_eq!(
        at,
        data.len(),
        "{} has bytes past its tokens",
        vocab.display()
    );
    assert_eq!(
        sha(&text),
        O200K_BASE_SHA256,
        "o200k_base.tiktoken written from {} is not the one openai-harmony expects",
        vocab.display()
    );
    std::fs::create_dir_all(dir).unwrap();
    let partial = dir.join(format!(
        "o200k_base.tiktoken.partial-{}",
        std::process::id()
    ));
    std::fs::write(&partial, &text).unwrap();
    std::fs::rename(&partial, &path).unwrap();
}

/// Standard base64 with padding.
fn base64(bytes: &[u8]) -> String {
    const ALPHABET: &[u8; 64] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
    let mut out = String::with_capacity(bytes.len().div_ceil(3) * 4);
    for chunk in bytes.chunks(3) {
        let b = [
            chunk[0],
            *chunk.get(1).unwrap_or(&0),
            *chunk.get(2).unwrap_or(&0),
        ];
        let n = (u32::from(b[0]) << 16) | (u32::from(b[1]) << 8) | u32::from(b[2]);
        for i in 0..4 {
            if i <= chunk.len() {
                out.push(char::from(ALPHABET[(n >> (18 - 6 * i)) as usize & 63]));
            } else {
                out.push('=');
            }
        }
    }
    out
}
