//! The `thicket` binary: a thin entry point over `api::commands`.

/// How long candle's matmul workers spin after each job before sleeping, unless the user
/// says otherwise. candle's default (25,000 pauses, a few hundred microseconds) keeps them busy
/// between matmuls on cores that thicket's own pool (its matmul, attention) needs; with the
/// short spin, forwards of quantized Qwen models run 5-30% faster on 2 cores
/// (`benches/README.md`).
const CANDLE_SPIN_LIMIT: &str = "200";

fn main() {
    // Set before any thread exists (candle reads it when its pool starts).
    if std::env::var_os("CANDLE_BARRIER_POOL_SPIN_LIMIT").is_none() {
        std::env::set_var("CANDLE_BARRIER_POOL_SPIN_LIMIT", CANDLE_SPIN_LIMIT);
    }
    let cli = api::commands::parse();
    let filter = tracing_subscriber::EnvFilter::try_from_env("THICKET_LOG")
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info"));
    let logs = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr);
    match cli.log_format {
        api::commands::LogFormat::Json => {
            logs.json().with_ansi(false).init();
            api::commands::use_json_logs();
        }
        api::commands::LogFormat::Text => logs
            .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()))
            .init(),
    }
    if let Err(err) = api::commands::run_parsed(cli) {
        eprintln!("error: {err:#}");
        std::process::exit(1);
    }
}
