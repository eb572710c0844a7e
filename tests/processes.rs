//! Runs the real `thicket` binary from tests: a `thicket serve` child on a free port (its log
//! forwarded, its address read from it, killed when dropped) and a minimal blocking HTTP/1.1
//! client for talking to it without a client library.

use std::io::{BufRead, BufReader, Read, Write};
use std::net::TcpStream;
use std::process::{Child, Command, Stdio};
use std::sync::mpsc;
use std::time::Duration;

use serde_json::Value;

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
        std::thread::spawn(move || {
            for line in BufReader::new(stderr).lines().map_while(Result::ok) {
                eprintln!("[server] {line}");
                let _ = lines_tx.send(line);
            }
        });
        let mut server = ServerProcess {
            child,
            base: String::new(),
        };
        loop {
            let line = lines
                .recv_timeout(Duration::from_secs(300))
                .expect("the server did not become ready");
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

    /// `POST path` with a JSON body: the status and the parsed JSON answer.
    pub fn post(&self, path: &str, body: &Value) -> (u16, Value) {
        let address = self.base.trim_start_matches("http://");
        let body = body.to_string();
        let mut stream = TcpStream::connect(address).expect("connecting to the server");
        write!(
            stream,
            "POST {path} HTTP/1.1\r\nHost: {address}\r\nContent-Type: application/json\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
            body.len()
        )
        .expect("sending the request");
        let mut answer = String::new();
        stream
            .read_to_string(&mut answer)
            .expect("reading the answer");
        let (head, payload) = answer
            .split_once("\r\n\r\n")
            .expect("an HTTP answer with a body");
        let status = head
            .split_whitespace()
            .nth(1)
            .and_then(|s| s.parse().ok())
            .expect("a status line");
        let json = serde_json::from_str(payload)
            .unwrap_or_else(|e| panic!("answer is not JSON ({e}): {payload}"));
        (status, json)
    }
}

impl Drop for ServerProcess {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}
