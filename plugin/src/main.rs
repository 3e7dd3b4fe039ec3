//! `kubectl-tt-driver`: installed on PATH, it is `kubectl tt driver`. krew
//! installs it as `kubectl-tt` (plugin `tt`), which kubectl runs for
//! `kubectl tt driver ...` with `driver` as the first argument: skipped here.

use clap::Parser;
use kubectl_tt_driver::cli::{Cli, exit};

#[tokio::main(flavor = "current_thread")]
async fn main() {
    let mut args: Vec<std::ffi::OsString> = std::env::args_os().collect();
    // `kubectl tt fw ...` (krew's kubectl-tt with `fw` first), or the binary
    // installed as kubectl-tt-fw: the firmware policies.
    let as_fw = args
        .first()
        .and_then(|a| std::path::Path::new(a).file_name())
        .is_some_and(|n| n == "kubectl-tt-fw");
    if as_fw || args.get(1).is_some_and(|a| a == "fw") {
        if !as_fw {
            args.remove(1);
        }
        std::process::exit(run_fw(args).await);
    }
    if args.get(1).is_some_and(|a| a == "driver") {
        args.remove(1);
    }
    if args.get(1).is_some_and(|a| a == "__complete") {
        let words: Vec<String> = args[2..]
            .iter()
            .map(|w| w.to_string_lossy().into_owned())
            .collect();
        let code = kubectl_tt_driver::commands::complete(&words)
            .await
            .unwrap_or(exit::ERROR);
        std::process::exit(code);
    }
    let cli = match Cli::try_parse_from(args) {
        Ok(cli) => cli,
        Err(e) => {
            // --help and --version are not errors; anything else is a usage
            // error, with its own code (clap's 2 is watch's Failed node).
            let code = if e.use_stderr() {
                exit::USAGE
            } else {
                exit::OK
            };
            let _ = e.print();
            std::process::exit(code);
        }
    };
    let code = match kubectl_tt_driver::commands::run(cli).await {
        Ok(code) => code,
        Err(e) => {
            eprintln!("error: {e:#}");
            exit::ERROR
        }
    };
    std::process::exit(code);
}

async fn run_fw(args: Vec<std::ffi::OsString>) -> i32 {
    use kubectl_tt_driver::fw::{FwCli, run};
    let cli = match FwCli::try_parse_from(args) {
        Ok(cli) => cli,
        Err(e) => {
            let code = if e.use_stderr() {
                exit::USAGE
            } else {
                exit::OK
            };
            let _ = e.print();
            return code;
        }
    };
    match run(cli).await {
        Ok(code) => code,
        Err(e) => {
            eprintln!("error: {e:#}");
            exit::ERROR
        }
    }
}
