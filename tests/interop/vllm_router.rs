//! thicket behind a router the field uses, and the Kubernetes example: the pinned
//! `vllm-router` (from PyPI, under `target/`) in front of two `thicket serve` replicas on
//! loopback, driven by `tests/e2e/router_client.py` with the official `openai` client (chat,
//! completions and streaming through it; both replicas serving under `power_of_two`; one
//! replica drained with SIGTERM while 12 streams run, every one finishing whole), and
//! `examples/kubernetes.yaml` checked against the Kubernetes schemas, with both of its
//! commands parsed by the programs' own parsers (`tests/e2e/check_kubernetes.py`).

use std::net::TcpListener;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use crate::support::fixtures::smollm2_path;
use crate::support::processes::{python_packages, run_ok, ServerProcess};

/// The router version the tests run with.
const VLLM_ROUTER_VERSION: &str = "0.1.17";
/// The Kubernetes schema validator.
const KUBERNETES_VALIDATE_VERSION: &str = "1.37.0";
/// The clients the router test drives it with (as in `openai_client`).
const OPENAI_VERSION: &str = "3.54.0";
const HTTPX_VERSION: &str = "0.28.1";

fn python_deps() -> PathBuf {
    python_packages(
        &format!(
            "vllm-router-{VLLM_ROUTER_VERSION}-kubernetes-validate-\
             {KUBERNETES_VALIDATE_VERSION}-openai-{OPENAI_VERSION}"
        ),
        &[
            &format!("vllm-router=={VLLM_ROUTER_VERSION}"),
            &format!("kubernetes-validate=={KUBERNETES_VALIDATE_VERSION}"),
            &format!("openai=={OPENAI_VERSION}"),
            &format!("httpx=={HTTPX_VERSION}"),
        ],
        "vllm_router",
    )
}

fn repo(path: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join(path)
}

/// A port nothing listens on now.
fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .expect("a free port")
        .port()
}

/// A running vllm-router; killed when dropped.
struct Router(Child);

impl Drop for Router {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

#[test]
fn two_replicas_behind_vllm_router_serve_and_one_drains() {
    let deps = python_deps();
    let model = smollm2_path();
    let model = model.to_str().expect("a UTF-8 model path");
    let replica = || {
        ServerProcess::start(
            &[
                "--served-model-name",
                "smollm2",
                "--kv-cache-mib",
                "128",
                "--max-model-len",
                "1024",
                "--shutdown-grace-secs",
                "60",
                "--model",
                model,
            ],
            &[],
        )
    };
    let a = replica();
    let mut b = replica();
    let port = free_port();
    let router = Command::new("python3")
        .args(["-m", "vllm_router.launch_router", "--host", "127.0.0.1"])
        .args(["--port", &port.to_string()])
        .args(["--prometheus-port", &free_port().to_string()])
        .args(["--worker-urls", &a.base, &b.base])
        .args(["--policy", "power_of_two"])
        .args(["--health-check-interval-secs", "1"])
        .args(["--health-failure-threshold", "1"])
        .args(["--log-level", "warning"])
        .env("PYTHONPATH", &deps)
        .stdout(Stdio::null())
        .spawn()
        .expect("starting vllm-router");
    let _router = Router(router);
    let victim = b.child.id().to_string();
    let stdout = run_ok(
        Command::new("python3")
            .arg(repo("tests/e2e/router_client.py"))
            .args([
                &format!("http://127.0.0.1:{port}"),
                &a.base,
                &b.base,
                &victim,
                "smollm2",
            ])
            .env("PYTHONPATH", &deps),
        "the router client script",
    );
    eprintln!("{stdout}");
    assert!(stdout.contains("router checks passed"), "{stdout}");
    // The drained replica exits on its own, successfully, once its streams are done.
    let status = b.exit_within(Duration::from_secs(30));
    assert!(status.success(), "the drained replica exited with {status}");
    // The other one still serves.
    assert_eq!(a.get("/health").0, 200);
}

#[test]
fn the_kubernetes_example_is_valid_and_its_commands_parse() {
    let deps = python_deps();
    let stdout = run_ok(
        Command::new("python3")
            .arg(repo("tests/e2e/check_kubernetes.py"))
            .arg(repo("examples/kubernetes.yaml"))
            .env("PYTHONPATH", &deps),
        "the Kubernetes check",
    );
    assert!(stdout.contains("checks passed"), "{stdout}");
    let args: Vec<String> = stdout
        .lines()
        .find_map(|l| l.strip_prefix("THICKET_ARGS "))
        .map(|json| serde_json::from_str(json).expect("the arguments as a JSON list"))
        .expect("the script prints the worker's arguments");
    let argv = std::iter::once("thicket".to_string()).chain(args.iter().cloned());
    if let Err(e) = api::commands::try_parse_from(argv) {
        panic!("thicket does not take the example's arguments {args:?}: {e}");
    }
}
