//! The `thicket` binary: a thin entry point over `api::cli`.

fn main() {
    if let Err(err) = api::cli::run() {
        eprintln!("error: {err:#}");
        std::process::exit(1);
    }
}
