//! Emulated Tenstorrent cards for QEMU's `x-pci-proxy-dev`: see [`ttdrv_testkit::ttcard`].
use clap::Parser;

fn main() -> std::process::ExitCode {
    ttdrv_testkit::ttcard::main(ttdrv_testkit::ttcard::Cli::parse())
}
