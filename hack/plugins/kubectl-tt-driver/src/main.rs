//! `kubectl-tt-driver`: installed on PATH, it is `kubectl tt driver`.

use clap::Parser;
use kubectl_tt_driver::cli::Cli;

#[tokio::main(flavor = "current_thread")]
async fn main() {
    let cli = Cli::parse();
    let code = match kubectl_tt_driver::commands::run(cli).await {
        Ok(code) => code,
        Err(e) => {
            eprintln!("error: {e:#}");
            1
        }
    };
    std::process::exit(code);
}
