//! Files llama.cpp keeps beside its own tests (such as a vocabulary GGUF with the token ids
//! its tokenizer test expects), taken from the llama-cpp-python 0.3.36 source distribution on
//! PyPI, pinned by its sha256: downloaded once under `target/` through the package index and
//! the wanted members extracted there.

use std::path::{Path, PathBuf};
use std::sync::Mutex;

/// The sdist's sha256, as the package index lists it.
const SDIST_SHA256: &str = "832db0699007f1be95a7e41ef12e88926b02ba836461e36a36372db2760c1a2e";

/// Downloads the sdist (once; the hash checked) and fetches it `members` (paths under
/// `vendor/llama.cpp/`), returning the folder that holds them at those paths.
pub fn llamacpp_files(members: &[&str]) -> PathBuf {
    static FETCHING: Mutex<()> = Mutex::new(());
    let _one = FETCHING.lock().unwrap_or_else(|e| e.into_inner());
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("target/e2e-python/llama-cpp-0.3.36");
    if members.iter().all(|m| dir.join(m).is_file()) {
        return dir;
    }
    let script = r##"
import hashlib, os, re, sys, tarfile, urllib.request
out, sha, members = sys.argv[1], sys.argv[2], sys.argv[3:]
index = urllib.request.urlopen("https://pypi.org/simple/llama-cpp-python/").read().decode()
url = next(u for u in re.findall(r'href="([^"]+)"', index)
           if "/llama_cpp_python-0.3.36.tar.gz" in u).split("#")[0]
os.makedirs(out, exist_ok=True)
sdist = os.path.join(out, "llama_cpp_python-0.3.36.tar.gz")
if not (os.path.exists(sdist)
        and hashlib.sha256(open(sdist, "rb").read()).hexdigest() == sha):
    data = urllib.request.urlopen(url).read()
    got = hashlib.sha256(data).hexdigest()
    assert got == sha, f"the sdist's sha256 is {got}, not {sha}"
    open(sdist + ".partial", "wb").write(data)
    os.replace(sdist + ".partial", sdist)
with tarfile.open(sdist) as tar:
    for member in members:
        name = "llama_cpp_python-0.3.36/vendor/llama.cpp/" + member
        data = tar.extractfile(name).read()
        path = os.path.join(out, member)
        os.makedirs(os.path.dirname(path), exist_ok=True)
        open(path + ".partial", "wb").write(data)
        os.replace(path + ".partial", path)
"##;
    let mut command = std::process::Command::new("python3");
    command
        .arg("-c")
        .arg(script)
        .arg(&dir)
        .arg(SDIST_SHA256)
        .args(members);
    crate::support::processes::run_ok(&mut command, "fetching llama-cpp-python's sdist");
    dir
}
