//! `thicket bench serve`, `bench sweep` and `bench tot` end to end against a real
//! `thicket serve` on SmolLM2, with a handful of short requests: the JSON reports hold every
//! metric with sane values, and the charts are valid SVG and PNG files. `bench spec` runs its
//! methods on engines of their own, interleaved question by question; `bench edits` its
//! configurations on the same code edits. `bench forward` names its kernel path and holds
//! one row against the memory-bandwidth bound.

use std::path::Path;
use std::process::Output;

use serde_json::Value;

use crate::support::fixtures::smollm2_path;
use crate::support::processes::{thicket, ServerProcess};

fn run(args: &[&str]) -> Output {
    let output = thicket()
        .args(args)
        .output()
        .expect("running thicket bench");
    assert!(
        output.status.success(),
        "thicket {args:?} failed:\n{}\n{}",
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr)
    );
    output
}

fn read_json(path: &Path) -> Value {
    let text = std::fs::read_to_string(path).expect("a report was written");
    serde_json::from_str(&text).expect("the report is JSON")
}

/// `thicket bench spec` on SmolLM2 with one question per category and `args`: its table
/// (stdout) and its JSON report.
fn bench_spec(args: &[&str]) -> (String, Value) {
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("spec.json");
    let model = smollm2_path();
    let mut all = vec!["bench", "spec", "--model", model.to_str().unwrap()];
    all.extend(["--per-category", "1", "--out", out.to_str().unwrap()]);
    all.extend(args);
    let output = run(&all);
    let table = String::from_utf8_lossy(&output.stdout).into_owned();
    (table, read_json(&out))
}

fn assert_svg(path: &Path) {
    let text = std::fs::read_to_string(path).expect("a chart was written");
    assert!(
        text.starts_with("<svg") && text.trim_end().ends_with("</svg>"),
        "{}",
        path.display()
    );
    assert!(
        text.contains("<polyline") || text.contains("<path"),
        "{} draws nothing",
        path.display()
    );
}

fn assert_png(path: &Path) {
    let bytes = std::fs::read(path).expect("a chart was written");
    assert_eq!(&bytes[..8], b"\x89PNG\r\n\x1a\n", "{}", path.display());
    // IHDR: width and height are big-endian at bytes 16..24.
    let width = u32::from_be_bytes([bytes[16], bytes[17], bytes[18], bytes[19]]);
    let height = u32::from_be_bytes([bytes[20], bytes[21], bytes[22], bytes[23]]);
    assert!(width >= 300 && height >= 200, "{width}x{height}");
}

fn assert_latency(report: &Value, name: &str) {
    let s = &report[name];
    for key in ["mean", "median", "p90", "p99"] {
        let v = s[key]
            .as_f64()
            .unwrap_or_else(|| panic!("{name}.{key} missing: {s}"));
        assert!(v.is_finite() && v >= 0.0, "{name}.{key} = {v}");
    }
    assert!(s["p99"].as_f64() >= s["median"].as_f64(), "{name}: {s}");
}

#[test]
fn load_benchmarks_report_every_metric_against_thicket_serve() {
    let model = smollm2_path();
    let server = ServerProcess::start(
        &[
            "--kv-cache-mib",
            "256",
            "--max-model-len",
            "1024",
            "--model",
            model.to_str().expect("a UTF-8 path"),
        ],
        &[],
    );
    let dir = tempfile::tempdir().expect("tempdir");
    let prompts = dir.path().join("prompts.jsonl");
    std::fs::write(
        &prompts,
        "{\"prompt\": \"Name a color.\"}\n{\"prompt\": \"Count to five.\"}\n{\"messages\": [{\"role\": \"user\", \"content\": \"Say hi.\"}]}\n",
    )
    .expect("writing prompts");
    let prompts = prompts.to_str().expect("a UTF-8 path");
    let out = dir.path().join("report.json");
    let svg = dir.path().join("latency.svg");
    let bench = run(&[
        "bench",
        "serve",
        "--url",
        &server.base,
        "--dataset",
        prompts,
        "--num-prompts",
        "4",
        "--max-tokens",
        "8",
        "--request-rate",
        "20",
        "--goodput",
        "ttft:600000,tpot:600000",
        "--out",
        out.to_str().unwrap(),
        "--plot",
        svg.to_str().unwrap(),
    ]);
    let text = String::from_utf8_lossy(&bench.stdout);
    assert!(text.contains("Serving Benchmark Result"), "{text}");
    let report = read_json(&out);
    assert_eq!(report["completed"], 4, "{report}");
    assert_eq!(report["failed"], 0);
    assert_eq!(
        report["model"],
        model.to_str().unwrap(),
        "the model came from /v1/models"
    );
    let output_tokens = report["total_output_tokens"].as_u64().unwrap();
    assert!((4..=32).contains(&output_tokens), "{output_tokens}");
    assert!(report["total_input_tokens"].as_u64().unwrap() >= 4 * 3);
    for key in [
        "duration",
        "request_throughput",
        "output_throughput",
        "total_token_throughput",
    ] {
        assert!(report[key].as_f64().unwrap() > 0.0, "{key}: {report}");
    }
    assert!(
        (report["request_goodput"].as_f64().unwrap()
            - report["request_throughput"].as_f64().unwrap())
        .abs()
            < 1e-9,
        "generous objectives: every request is good"
    );
    for name in ["ttft_ms", "tpot_ms", "itl_ms", "e2el_ms"] {
        assert_latency(&report, name);
    }
    assert!(report["e2el_ms"]["median"].as_f64() >= report["ttft_ms"]["median"].as_f64());
    let requests = report["requests"].as_array().unwrap();
    assert_eq!(requests.len(), 4);
    assert!(requests
        .iter()
        .all(|r| r["success"] == true && r["output_tokens"].as_u64() > Some(0)));
    assert_svg(&svg);

    let sweep_dir = dir.path().join("sweep");
    run(&[
        "bench",
        "sweep",
        "--url",
        &server.base,
        "--dataset",
        prompts,
        "--num-prompts",
        "2",
        "--max-tokens",
        "4",
        "--concurrency",
        "1,2",
        "--speculation",
        "auto,none",
        "--out-dir",
        sweep_dir.to_str().unwrap(),
    ]);
    let points = read_json(&sweep_dir.join("sweep.json"));
    let points = points.as_array().expect("a list of points");
    assert_eq!(points.len(), 4);
    for p in points {
        assert_eq!(p["report"]["failed"], 0, "{p}");
        assert!(p["report"]["output_throughput"].as_f64().unwrap() > 0.0);
    }
    let table = std::fs::read_to_string(sweep_dir.join("sweep.md")).expect("sweep.md");
    assert_eq!(table.lines().count(), 2 + 4, "{table}");
    for chart in ["throughput", "latency"] {
        assert_svg(&sweep_dir.join(format!("{chart}.svg")));
        assert_png(&sweep_dir.join(format!("{chart}.png")));
    }

    let tot = dir.path().join("tot.json");
    let gsm8k = Path::new(env!("CARGO_MANIFEST_DIR")).join("benches/data/gsm8k_30.jsonl");
    run(&[
        "bench",
        "tot",
        "--url",
        &server.base,
        "--dataset",
        gsm8k.to_str().unwrap(),
        "--questions",
        "1",
        "--depth",
        "2",
        "--breadth",
        "2",
        "--thought-tokens",
        "6",
        "--out",
        tot.to_str().unwrap(),
    ]);
    let tot = read_json(&tot);
    let question = &tot["questions"][0];
    for schedule in ["serial", "parallel"] {
        let run = &question[schedule];
        // Per step: one generator request (n = 2) and two evaluations.
        assert_eq!(run["requests"], 2 * 3, "{run}");
        assert_eq!(run["thoughts"].as_array().unwrap().len(), 2);
        assert!(run["seconds"].as_f64().unwrap() > 0.0);
    }
    assert_eq!(
        question["identical"], true,
        "same seeds, lossless speculation: {question}"
    );
    assert!(tot["speedup"].as_f64().unwrap() > 0.0);
}

#[test]
fn bench_spec_interleaves_methods_question_by_question_on_their_own_engines() {
    let (table, report) = bench_spec(&["--max-tokens", "6", "--methods", "prompt_lookup"]);
    assert!(table.contains("| prompt_lookup |"), "{table}");
    assert!(
        table.contains("| speedup | TTFT | end to end |"),
        "the speedups a user sees: {table}"
    );
    let ms = report["measurements"].as_array().expect("measurements");
    assert_eq!(ms.len(), 2 * 13, "13 questions, two methods");
    for m in ms {
        let (ttft, seconds) = (m["ttft_seconds"].as_f64(), m["seconds"].as_f64());
        let (ttft, seconds) = (ttft.expect("a TTFT"), seconds.expect("a time"));
        assert!(ttft > 0.0 && ttft <= seconds, "{m}");
    }
    for label in ["none", "prompt_lookup"] {
        let wall = report["wall_seconds"][label].as_f64().expect("a wall time");
        // Each engine's wall time spans at least every one of its questions' own times
        // (one question per round here).
        let own: f64 = ms
            .iter()
            .filter(|m| m["method"] == label)
            .map(|m| m["seconds"].as_f64().unwrap())
            .sum();
        assert!(wall >= own, "{label}: {wall} < {own}");
    }
    // Acceptance by depth comes from the engines' counters: each engine's verification
    // steps are those its answers report.
    let mut verified = 0;
    for (label, counts) in report["acceptance_by_depth"]
        .as_array()
        .expect("acceptance by depth")
        .iter()
        .map(|pair| (&pair[0], &pair[1]))
    {
        let steps: u64 = ms
            .iter()
            .filter(|m| &m["method"] == label)
            .map(|m| m["verify_steps"].as_u64().expect("verify steps"))
            .sum();
        assert_eq!(
            counts["verify_steps"].as_f64(),
            Some(steps as f64),
            "{label}"
        );
        verified += steps;
    }
    assert!(
        verified > 0,
        "prompt lookup verified no draft in 13 questions"
    );
    for (round, pair) in ms.chunks(2).enumerate() {
        // One question per round, on both engines; rounds go in pairs, the second running
        // the first's order backwards, and the order rotates from pair to pair.
        assert_eq!(pair[0]["question_id"], pair[1]["question_id"], "{pair:?}");
        let first = if (round / 2 + round) % 2 == 0 {
            "none"
        } else {
            "prompt_lookup"
        };
        assert_eq!(pair[0]["method"], first, "round {round}: {pair:?}");
        assert_ne!(pair[0]["method"], pair[1]["method"]);
        // Greedy and lossless: the same tokens either way.
        assert_eq!(pair[0]["output_tokens"], pair[1]["output_tokens"]);
    }
}

#[test]
fn bench_spec_control_is_a_second_plain_engine_in_the_table() {
    let (table, report) = bench_spec(&["--max-tokens", "4", "--methods", "none", "--control"]);
    assert!(table.contains("| none (control) |"), "{table}");
    let ms = report["measurements"].as_array().expect("measurements");
    assert_eq!(ms.len(), 2 * 13, "13 questions, two engines");
    for pair in ms.chunks(2) {
        // Each question on both engines: the control decodes exactly as `none` does.
        assert_eq!(pair[0]["question_id"], pair[1]["question_id"], "{pair:?}");
        let labels = [&pair[0]["method"], &pair[1]["method"]];
        assert!(labels.contains(&&serde_json::json!("none")), "{pair:?}");
        assert!(
            labels.contains(&&serde_json::json!("none (control)")),
            "{pair:?}"
        );
        assert_eq!(pair[0]["output_tokens"], pair[1]["output_tokens"]);
        assert_eq!(pair[0]["verify_steps"], 0);
        assert_eq!(pair[1]["verify_steps"], 0);
    }
}

/// `--warm-up half`: the questions alternate between a measured half and a warm-up half;
/// every method runs cold and warm on fresh engines, the warm engines having served the
/// warm-up half first, and each phase's speedups are over its own `none`.
/// `--warm-up-per-category` caps the warm-up half apart from the measured one.
#[test]
fn bench_spec_measures_cold_and_warm_engines_on_disjoint_questions() {
    let (table, report) = bench_spec(&[
        "--max-tokens",
        "8",
        "--methods",
        "recycling",
        "--warm-up",
        "half",
        "--warm-up-per-category",
        "2",
    ]);
    for label in [
        "none (cold)",
        "recycling (cold)",
        "none (warm)",
        "recycling (warm)",
    ] {
        assert!(table.contains(&format!("| {label} |")), "{label}: {table}");
    }
    assert!(
        table.contains("each first served 26 warm-up questions"),
        "{table}"
    );
    assert_eq!(report["warm_up_questions"], 26, "{report}");
    let ms = report["measurements"].as_array().expect("measurements");
    assert_eq!(ms.len(), 4 * 13, "13 measured questions, four engines");
    // The measured half: the first question of each category, never the second.
    let spec_bench = std::fs::read_to_string("benches/data/spec_bench_dev.jsonl").unwrap();
    let mut firsts = std::collections::HashMap::new();
    for line in spec_bench.lines().filter(|l| !l.trim().is_empty()) {
        let q: Value = serde_json::from_str(line).unwrap();
        let category = q["category"].as_str().unwrap().to_string();
        firsts.entry(category).or_insert(q["question_id"].clone());
    }
    for m in ms {
        let category = m["category"].as_str().expect("a category");
        assert_eq!(m["question_id"], firsts[category], "{m}");
    }
    // Plain decoding is the same whether the engine is warm or not.
    let tokens = |label: &str| -> Vec<Value> {
        ms.iter()
            .filter(|m| m["method"] == label)
            .map(|m| m["output_tokens"].clone())
            .collect()
    };
    assert_eq!(tokens("none (cold)"), tokens("none (warm)"));
    assert_eq!(tokens("recycling (warm)"), tokens("none (cold)"));
}

/// The percentage at the end of a bound line ("..., 74% of that bound").
fn percent_of_bound(line: &str) -> f64 {
    let (before, _) = line.rsplit_once("% of that bound").expect("a bound");
    let number = before.rsplit(' ').next().expect("a percentage");
    number.parse().expect("a number")
}

#[test]
fn bench_forward_names_its_path_and_counts_the_context_in_the_bound() {
    let model = smollm2_path();
    let output = run(&[
        "bench",
        "forward",
        "--model",
        model.to_str().unwrap(),
        "--context",
        "256",
        "--sizes",
        "1,2",
        "--repeats",
        "1",
    ]);
    let table = String::from_utf8_lossy(&output.stdout).into_owned();
    assert!(table.contains("quantized matmul:"), "{table}");
    assert!(
        table.contains("| 1 |") && table.contains("| 2 |"),
        "{table}"
    );
    let weights = table
        .lines()
        .find(|l| l.starts_with("memory read bandwidth"))
        .expect("the weights' bound");
    // SmolLM2: 30 layers, K and V of 3 heads of 64 values, f16: 23,040 bytes a position.
    let kv = table
        .lines()
        .find(|l| {
            l.starts_with(
                "with the 5.9 MB of K/V (and windowed state) a row reads at a 256-token context",
            )
        })
        .unwrap_or_else(|| panic!("the bound with the context's K/V: {table}"));
    let (weights, kv) = (percent_of_bound(weights), percent_of_bound(kv));
    // Reading 6% more bytes lowers the bound, so one row is nearer it (the printed
    // percentages are rounded, and a busy host can make both small).
    assert!(weights > 0.0 && kv >= weights, "{weights}% vs {kv}%");
}

#[test]
fn bench_edits_runs_each_configuration_on_the_same_edits() {
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("edits.json");
    let model = smollm2_path();
    let output = run(&[
        "bench",
        "edits",
        "--model",
        model.to_str().unwrap(),
        "--limit",
        "2",
        "--configs",
        "prompt_lookup+prediction",
        "--control",
        "--out",
        out.to_str().unwrap(),
    ]);
    let table = String::from_utf8_lossy(&output.stdout).into_owned();
    for label in [
        "| none |",
        "| prompt_lookup+prediction |",
        "| none (control) |",
    ] {
        assert!(table.contains(label), "{label} missing: {table}");
    }
    let report = read_json(&out);
    let measurements = report["measurements"].as_array().unwrap();
    assert_eq!(measurements.len(), 6, "{report}");
    let mut edits: Vec<&str> = measurements
        .iter()
        .filter(|m| m["config"] == "none")
        .map(|m| m["edit"].as_str().unwrap())
        .collect();
    edits.sort();
    assert_eq!(edits.len(), 2);
    for m in measurements {
        // Greedy: every configuration writes the same number of tokens for an edit.
        let plain = measurements
            .iter()
            .find(|p| p["config"] == "none" && p["edit"] == m["edit"])
            .unwrap();
        assert_eq!(m["output_tokens"], plain["output_tokens"], "{m}");
        if m["config"] != "prompt_lookup+prediction" {
            assert_eq!(m["draft_tokens"], 0, "{m}");
        }
    }
    let drafted: u64 = measurements
        .iter()
        .map(|m| {
            m["accepted_prediction_tokens"].as_u64().unwrap()
                + m["rejected_prediction_tokens"].as_u64().unwrap()
        })
        .sum();
    assert!(drafted > 0, "the prediction never drafted: {report}");
}
