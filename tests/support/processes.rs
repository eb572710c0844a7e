//! Runs the real `thicket` binary from tests: a `thicket serve` child on a free port (its log
//! forwarded, its address read from it, killed when dropped), a minimal blocking HTTP/1.1
//! client for talking to it without a client library, and pinned Python packages installed
//! under `target/` for the tests that drive it from Python.

use std::io::{BufRead, BufReader, Read, Write};
use std::net::TcpStream;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::{mpsc, Arc, Mutex};
use std::time::Duration;

use serde_json::Value;

/// Python packages (pinned `name==version` specs) installed once under
/// `target/e2e-python/<folder>` with pip; returns the folder for `PYTHONPATH`.
/// `marker` is a directory the installation creates (to tell it is done).
pub fn python_packages(folder: &str, specs: &[&str], marker: &str) -> PathBuf {
    // Tests run on several threads and some share a folder: one pip at a time, so that two
    // never install into the same folder at once.
    static INSTALLING: Mutex<()> = Mutex::new(());
    let _one = INSTALLING.lock().unwrap_or_else(|e| e.into_inner());
    let dir = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("target/e2e-python")
        .join(folder);
    if !dir.join(marker).is_dir() {
        let status = Command::new("python3")
            .args([
                "-m",
                "pip",
                "install",
                "--quiet",
                "--disable-pip-version-check",
                "--no-warn-conflicts",
                "--target",
            ])
            .arg(&dir)
            .args(specs)
            .status()
            .expect("python3 must be installed for the end-to-end tests");
        assert!(status.success(), "pip could not install {specs:?}");
    }
    dir
}

/// Runs `command` to its end and returns its stdout; fails the test, showing both outputs,
/// when it does not succeed. `what` names it in messages.
pub fn run_ok(command: &mut Command, what: &str) -> String {
    let output = command
        .output()
        .unwrap_or_else(|e| panic!("running {what}: {e}"));
    let stdout = String::from_utf8_lossy(&output.stdout).to_string();
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(
        output.status.success(),
        "{what} failed:\n{stdout}\n{stderr}"
    );
    stdout
}

/// The `thicket` binary under test.
pub fn thicket() -> Command {
    Command::new(env!("CARGO_BIN_EXE_thicket"))
}

/// A running `thicket serve`; killed when dropped.
pub struct ServerProcess {
    /// The child process.
    pub child: Child,
    /// `http://127.0.0.1:PORT`.
    pub base: String,
    /// Every line the server wrote to stderr so far.
    pub log: Arc<Mutex<Vec<String>>>,
}

impl ServerProcess {
    /// Starts `thicket serve --port 0 ARGS` (plus `envs`) and waits until it is ready.
    pub fn start(args: &[&str], envs: &[(&str, &str)]) -> Self {
        let mut child = thicket()
            .args(["serve", "--port", "0"])
            .args(args)
            .envs(envs.iter().copied())
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .expect("starting thicket serve");
        let stderr = child.stderr.take().expect("stderr is piped");
        // Forward the server's log and pick up the bound address and readiness from it.
        let (lines_tx, lines) = mpsc::channel();
        let log = Arc::new(Mutex::new(Vec::new()));
        let kept = Arc::clone(&log);
        std::thread::spawn(move || {
            for line in BufReader::new(stderr).lines().map_while(Result::ok) {
                eprintln!("[server] {line}");
                if let Ok(mut kept) = kept.lock() {
                    kept.push(line.clone());
                }
                let _ = lines_tx.send(line);
            }
        });
        let mut server = ServerProcess {
            child,
            base: String::new(),
            log,
        };
        loop {
            let line = lines
                .recv_timeout(Duration::from_secs(300))
                .expect("the server did not become ready");
            // Under `--log-format json` each line is an object whose message is the text.
            let line = serde_json::from_str::<Value>(&line)
                .ok()
                .and_then(|v| v["fields"]["message"].as_str().map(str::to_string))
                .unwrap_or(line);
            if let Some(rest) = line.strip_prefix("listening on ") {
                server.base = rest.split_whitespace().next().unwrap_or("").to_string();
            }
            if line.starts_with("ready:") {
                break;
            }
        }
        assert!(server.base.starts_with("http://"), "no address printed");
        server
    }

    /// Sends the server SIGTERM.
    pub fn terminate(&self) {
        let pid = self.child.id().to_string();
        let sent = Command::new("kill").args(["-TERM", &pid]).status();
        assert!(
            sent.as_ref().is_ok_and(|s| s.success()),
            "kill -TERM {pid}: {sent:?}"
        );
    }

    /// Waits up to `limit` for the server to exit on its own; its exit status.
    pub fn exit_within(&mut self, limit: Duration) -> std::process::ExitStatus {
        let deadline = std::time::Instant::now() + limit;
        loop {
            if let Some(status) = self.child.try_wait().expect("waiting for the server") {
                return status;
            }
            assert!(
                std::time::Instant::now() < deadline,
                "the server did not exit within {limit:?}"
            );
            std::thread::sleep(Duration::from_millis(100));
        }
    }

    /// A handle that talks to the server at `base` (for client threads); it owns no process.
    pub fn client(base: &str) -> Client {
        Client {
            base: base.to_string(),
        }
    }

    /// `POST path` with a JSON body: the status and the parsed JSON answer.
    pub fn post(&self, path: &str, body: &Value) -> (u16, Value) {
        let (status, _, payload) = self.request("POST", path, body.to_string().as_bytes());
        let json = serde_json::from_str(&payload)
            .unwrap_or_else(|e| panic!("answer is not JSON ({e}): {payload}"));
        (status, json)
    }

    /// `GET path`: the status and the body text.
    pub fn get(&self, path: &str) -> (u16, String) {
        let (status, _, payload) = self.request("GET", path, b"");
        (status, payload)
    }

    /// Any request with raw body bytes: the status, the head and the body text.
    pub fn request(&self, method: &str, path: &str, body: &[u8]) -> (u16, String, String) {
        self.request_with(method, path, body, "")
    }

    /// Like [`Self::request`], with extra header lines (each ending in `\r\n`).
    pub fn request_with(
        &self,
        method: &str,
        path: &str,
        body: &[u8],
        headers: &str,
    ) -> (u16, String, String) {
        raw_request(&self.base, method, path, body, headers)
    }
}

/// A client of a server started elsewhere (for threads: it owns no process).
pub struct Client {
    base: String,
}

impl Client {
    /// Any request with raw body bytes: the status, the head and the body text.
    pub fn request(&self, method: &str, path: &str, body: &[u8]) -> (u16, String, String) {
        raw_request(&self.base, method, path, body, "")
    }
}

/// One HTTP/1.1 request to `base` (`http://HOST:PORT`), read to the end of the connection:
/// the status, the head and the body text.
fn raw_request(
    base: &str,
    method: &str,
    path: &str,
    body: &[u8],
    headers: &str,
) -> (u16, String, String) {
    let address = base.trim_start_matches("http://");
    let mut stream = TcpStream::connect(address).expect("connecting to the server");
    let head = format!(
        "{method} {path} HTTP/1.1\r\nHost: {address}\r\nContent-Type: application/json\r\nContent-Length: {}\r\n{headers}Connection: close\r\n\r\n",
        body.len()
    );
    // The server may answer (413) before reading a large body; a failed write is fine.
    let _ = stream
        .write_all(head.as_bytes())
        .and_then(|()| stream.write_all(body));
    let mut answer = Vec::new();
    let _ = stream.read_to_end(&mut answer);
    let answer = String::from_utf8_lossy(&answer).to_string();
    let (head, payload) = answer
        .split_once("\r\n\r\n")
        .unwrap_or_else(|| panic!("an HTTP answer with a body: {answer:?}"));
    let status = head
        .split_whitespace()
        .nth(1)
        .and_then(|s| s.parse().ok())
        .expect("a status line");
    (status, head.to_string(), payload.to_string())
}

impl Drop for ServerProcess {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}
