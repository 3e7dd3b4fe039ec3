//! `ttdrv-flash`: the program of the firmware policy's flash Job (the
//! flasher image, `flasher/Dockerfile`), the Go operator's bash flasher
//! in Rust, same behaviour.
//!
//! # `ttdrv-flash flash`
//!
//! Input is the Job's environment ([`ttdrv_api::firmware::flasher`]):
//! `TT_FW_BUNDLE_PATH`, `TT_FW_READBACK` (else `TT_FW_VERSION` + `.0`),
//! `TT_FLASH_ARGS`, `TT_FORCE_WRITE`, `TT_CONTINUE_ON_READBACK_FAILURE`,
//! `TT_HOMOGENIZE_FIRMWARE_VERSIONS` (switches are on when `true` or `1`).
//!
//! 1. Readback: `tt-smi -s`, each card's `firmwares.fw_bundle_version`.
//!    When it fails (both streams are logged: tt-smi prints its errors on
//!    stdout), one heal: `tt-smi -glx_reset` when a Tenstorrent PCI device
//!    (vendor `0x1e52`) has `subsystem_device` `0x0035` or `0x0047`
//!    (Galaxy), else `tt-smi -r`; 5 s; readback again. Still failing: the
//!    run fails, unless `TT_CONTINUE_ON_READBACK_FAILURE`.
//! 2. Not `TT_FORCE_WRITE` and every card reads the target: skip (exit 0,
//!    `skipped: true`).
//! 3. `TT_FORCE_WRITE`, or `TT_HOMOGENIZE_FIRMWARE_VERSIONS` with cards
//!    that read different versions from each other: `--force`.
//! 4. `tt-flash --no-color flash <bundle> [TT_FLASH_ARGS] [--force]`, its
//!    output streamed to the log. A non-zero exit fails, and so does
//!    "Config space reset not completed for device" in its output, exit 0
//!    or not. (tt-flash 4.1.0 takes the bundle as a positional argument;
//!    `--fw-tar`, which the Go flasher passed, still works there but
//!    prints a deprecation warning.)
//! 5. Readback: every card must read the target, else the run fails with
//!    reason `ReadbackMismatch` and a message naming the cards' versions.
//!
//! On success and on failure the [`Report`](ttdrv_api::firmware::flasher::Report)
//! goes as JSON to the termination log (`/dev/termination-log`, `--report`);
//! a failure sets `reason` (`FlashJobFailed`, `ReadbackMismatch`) and
//! `message` and exits 1.
//!
//! # `ttdrv-flash fetch`
//!
//! The init container: `curl -fsSL --retry 3` of `TT_FW_BUNDLE_URL` to
//! `TT_FW_BUNDLE_PATH` (through `<path>.part`). A failure exits 1 with a
//! report as above (reason `FlashJobFailed`).
//!
//! # Simulation: `TTDRV_FLASH_SIMULATE=<dir>`
//!
//! Both subcommands run the same logic against a host simulated in
//! `<dir>` ([`sim::SimHost`]): no tt-smi, tt-flash, curl or sysfs of the
//! machine is touched, and the heal does not wait. The report goes to
//! `<dir>/termination-log` unless `--report` names a path.
//!
//! | file in `<dir>` | meaning |
//! | --- | --- |
//! | `cards.json` | each card's `fw_bundle_version`, a JSON list: `["19.7.0.0", "19.7.0.0"]`; `tt-smi -s` renders it as tt-smi's snapshot; missing = tt-smi fails |
//! | `sys/bus/pci/devices/<bdf>/{vendor,subsystem_device}` | the PCI devices the heal looks at (optional; none = `tt-smi -r`) |
//! | `calls.log` | written: one line per command the flasher ran (`tt-smi -s`, `tt-smi -r`, `tt-flash --no-color flash <bundle> --force`, `fetch <url> <path>`) |
//! | `termination-log` | written: the report |
//! | `fail-readback` | every `tt-smi -s` fails (exit 1, error on stdout) |
//! | `fail-readback-until-reset` | `tt-smi -s` fails until a reset, which removes the file |
//! | `fail-reset` | the resets fail |
//! | `fail-flash` | tt-flash exits 1 and writes nothing |
//! | `config-space-reset` | tt-flash exits 0 but prints "Config space reset not completed for device 0" (writes nothing) |
//! | `stuck-version` | tt-flash succeeds, the cards keep their version (a readback mismatch) |
//! | `fail-fetch` | `fetch` fails |
//!
//! The files are read when used, so a test can create them at any time.
//! The simulated tt-flash writes the bundle's version to every card: the
//! `version` of the bundle's `manifest.json` (a tar, as tt-flash reads it)
//! with `.0` appended when it has three parts, else `TT_FW_VERSION` + `.0`
//! when the bundle has no readable manifest. Without `--force` it leaves a
//! card newer than the bundle alone (so `TT_HOMOGENIZE_FIRMWARE_VERSIONS`
//! is observable). The simulated `fetch` writes a bundle whose manifest
//! names `TT_FW_VERSION`, without the network.
//!
//! Modules: [`decide`] (the decisions, pure), [`run`] (one flash run, and
//! the fetch), [`host`] (tt-smi, tt-flash and the PCI bus, behind a trait),
//! [`bundle`] (the bundle's manifest), [`sim`] (the simulated host).

pub mod bundle;
pub mod decide;
pub mod host;
pub mod run;
pub mod sim;
