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
    let cli: Cli = parse_or_exit(args);
    std::process::exit(code_of(kubectl_tt_driver::commands::run(cli).await));
}

/// The command line parsed, or the process ends: --help and --version are not
/// errors; anything else is a usage error, with its own code (clap's 2 is
/// watch's Failed node).
fn parse_or_exit<T: Parser>(args: Vec<std::ffi::OsString>) -> T {
    T::try_parse_from(args).unwrap_or_else(|e| {
        let code = if e.use_stderr() {
            exit::USAGE
        } else {
            exit::OK
        };
        let _ = e.print();
        std::process::exit(code);
    })
}

/// The exit code of a run; an error is printed.
fn code_of(res: anyhow::Result<i32>) -> i32 {
    res.unwrap_or_else(|e| {
        eprintln!("error: {e:#}");
        exit::ERROR
    })
}

async fn run_fw(args: Vec<std::ffi::OsString>) -> i32 {
    let cli: kubectl_tt_driver::fw::FwCli = parse_or_exit(args);
    code_of(kubectl_tt_driver::fw::run(cli).await)
}
