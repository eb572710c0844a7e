//! The `thicket` binary: a thin entry point over `api::cli`.

fn main() {
    let filter = tracing_subscriber::EnvFilter::try_from_env("THICKET_LOG")
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info"));
    tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .init();
    if let Err(err) = api::cli::run() {
        eprintln!("error: {err:#}");
        std::process::exit(1);
    }
}
