//! The flasher's decisions, as pure functions of what it read: no I/O here.

use serde_json::Value;

/// The PCI vendor of Tenstorrent devices (sysfs `vendor`).
pub const TENSTORRENT_VENDOR: &str = "0x1e52";
/// `subsystem_device` of the Galaxy boards: the heal resets them with
/// `tt-smi -glx_reset`, every other board with `tt-smi -r`.
pub const GALAXY_SUBSYSTEMS: [&str; 2] = ["0x0035", "0x0047"];
/// tt-flash (through tt-umd / tt-tools-common) prints this and may still
/// exit 0 when a card did not come back from its post-flash reset.
pub const CONFIG_SPACE_RESET_FAILED: &str = "Config space reset not completed for device";
/// The tt-flash flag that writes regardless of the cards' versions.
pub const FORCE: &str = "--force";

/// The card reset of the heal cycle after a failed readback.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Heal {
    /// `tt-smi -glx_reset`: a Galaxy host (all trays).
    GalaxyReset,
    /// `tt-smi -r`: every device.
    Reset,
}

impl Heal {
    /// tt-smi's arguments for this reset.
    pub fn tt_smi_args(self) -> &'static [&'static str] {
        match self {
            Heal::GalaxyReset => &["-glx_reset"],
            Heal::Reset => &["-r"],
        }
    }
}

/// The heal for a host whose Tenstorrent PCI devices have these
/// `(vendor, subsystem_device)` pairs (sysfs spelling, `0x1e52`).
pub fn heal_for<'a>(devices: impl IntoIterator<Item = (&'a str, &'a str)>) -> Heal {
    let galaxy = devices.into_iter().any(|(vendor, sub)| {
        vendor.trim().eq_ignore_ascii_case(TENSTORRENT_VENDOR)
            && GALAXY_SUBSYSTEMS
                .iter()
                .any(|g| sub.trim().eq_ignore_ascii_case(g))
    });
    if galaxy {
        Heal::GalaxyReset
    } else {
        Heal::Reset
    }
}

/// A boolean switch of the Job's environment: `true` (any case) or `1`.
/// Anything else is false, as the Go flasher's `[ "$X" = "true" ]`.
pub fn env_flag(value: Option<&str>) -> bool {
    value.is_some_and(|v| v.trim().eq_ignore_ascii_case("true") || v.trim() == "1")
}

/// Why a `tt-smi -s` output is not a readback.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum SnapshotError {
    #[error("tt-smi -s printed no JSON snapshot")]
    NoJson,
    #[error("tt-smi -s printed a snapshot that is not JSON: {0}")]
    Json(String),
    #[error("tt-smi -s snapshot has no device_info list")]
    NoDevices,
    #[error("tt-smi -s found no Tenstorrent devices")]
    Empty,
    #[error("tt-smi -s snapshot: device {0} has no firmwares.fw_bundle_version")]
    NoVersion(usize),
}

/// Each card's `fw_bundle_version`, from `tt-smi -s`'s stdout: the JSON
/// snapshot (anything tt-smi prints before its opening `{` is skipped).
/// No card is an error: there is nothing to flash or check.
pub fn parse_snapshot(stdout: &str) -> Result<Vec<String>, SnapshotError> {
    let start = stdout.find('{').ok_or(SnapshotError::NoJson)?;
    let mut stream = serde_json::Deserializer::from_str(&stdout[start..]).into_iter::<Value>();
    let snapshot = match stream.next() {
        Some(Ok(v)) => v,
        Some(Err(e)) => return Err(SnapshotError::Json(e.to_string())),
        None => return Err(SnapshotError::NoJson),
    };
    let devices = snapshot
        .get("device_info")
        .and_then(Value::as_array)
        .ok_or(SnapshotError::NoDevices)?;
    if devices.is_empty() {
        return Err(SnapshotError::Empty);
    }
    devices
        .iter()
        .enumerate()
        .map(|(i, d)| {
            d.pointer("/firmwares/fw_bundle_version")
                .and_then(Value::as_str)
                .map(|v| v.trim().to_string())
                .ok_or(SnapshotError::NoVersion(i))
        })
        .collect()
}

/// Longest report message: the termination message holds 4096 bytes in all.
pub const MESSAGE_MAX: usize = 1024;

/// A tool's line for a report: ANSI escape sequences (tt-smi colours its
/// errors even when not on a terminal) removed, whitespace trimmed.
pub fn plain(line: &str) -> String {
    let mut out = String::with_capacity(line.len());
    let mut chars = line.chars().peekable();
    while let Some(c) = chars.next() {
        if c == '\u{1b}' {
            // CSI: ESC [ parameters final-byte; other escapes: ESC + one char.
            if chars.next_if_eq(&'[').is_some() {
                for c in chars.by_ref() {
                    if ('@'..='~').contains(&c) {
                        break;
                    }
                }
            } else {
                chars.next();
            }
        } else if !c.is_control() || c == '\t' {
            out.push(c);
        }
    }
    out.trim().to_string()
}

/// `message` cut to [`MESSAGE_MAX`] bytes (on a character boundary).
pub fn bounded(mut message: String) -> String {
    if message.len() > MESSAGE_MAX {
        let mut cut = MESSAGE_MAX - 3;
        while !message.is_char_boundary(cut) {
            cut -= 1;
        }
        message.truncate(cut);
        message.push_str("...");
    }
    message
}

/// Every card reads `target` (and there is at least one card).
pub fn all_read(versions: &[String], target: &str) -> bool {
    !versions.is_empty() && versions.iter().all(|v| v == target)
}

/// The cards report different versions from each other.
pub fn mixed(versions: &[String]) -> bool {
    versions.windows(2).any(|w| w[0] != w[1])
}

/// What the flash run does after the readback before it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Plan {
    /// Every card already reads the target: write nothing.
    Skip,
    /// Run tt-flash with these extra arguments (after the bundle).
    Flash { args: Vec<String> },
}

/// The switches of one flash run (the Job's environment).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Switches {
    /// `TT_FLASH_ARGS`, split on whitespace.
    pub flash_args: Vec<String>,
    /// `TT_FORCE_WRITE`.
    pub force_write: bool,
    /// `TT_HOMOGENIZE_FIRMWARE_VERSIONS`.
    pub homogenize: bool,
}

/// Skip, or flash with which arguments. `before` is `None` when the
/// readback before the flash failed (and the run goes on regardless).
pub fn plan(before: Option<&[String]>, target: &str, sw: &Switches) -> Plan {
    let mut args = sw.flash_args.clone();
    let mut force = sw.force_write;
    if !sw.force_write
        && let Some(before) = before
    {
        if all_read(before, target) {
            return Plan::Skip;
        }
        force = sw.homogenize && mixed(before);
    }
    if force && !args.iter().any(|a| a == FORCE) {
        args.push(FORCE.to_string());
    }
    Plan::Flash { args }
}

/// tt-flash's outcome: `Err(why)` when it failed, though it may have exited 0.
pub fn flash_outcome(exit_ok: bool, exit: &str, output: &str) -> Result<(), String> {
    if !exit_ok {
        return Err(format!("tt-flash failed ({exit})"));
    }
    if let Some(line) = output
        .lines()
        .find(|l| l.contains(CONFIG_SPACE_RESET_FAILED))
    {
        return Err(format!(
            "tt-flash exited 0 but a card did not come back from its reset: {}",
            plain(line)
        ));
    }
    Ok(())
}

/// The readback after the flash: `Err(message)` unless every card reads
/// the target.
pub fn check_after(after: &[String], target: &str) -> Result<(), String> {
    if all_read(after, target) {
        return Ok(());
    }
    let off: Vec<String> = after
        .iter()
        .enumerate()
        .filter(|(_, v)| *v != target)
        .map(|(i, v)| format!("card {i} reads {v}"))
        .collect();
    Err(format!(
        "after the flash {} of {} card(s) do not read back {target}: {}",
        off.len(),
        after.len(),
        off.join(", ")
    ))
}

/// What every card must read back: `TT_FW_READBACK`, else `TT_FW_VERSION`
/// with `.0` (the firmware policy's default).
pub fn target(readback: Option<&str>, version: Option<&str>) -> Option<String> {
    match (readback.map(str::trim), version.map(str::trim)) {
        (Some(r), _) if !r.is_empty() => Some(r.to_string()),
        (_, Some(v)) if !v.is_empty() => Some(format!("{v}.0")),
        _ => None,
    }
}

/// A bundle manifest's `version` (three parts, `19.8.0`) as tt-smi reads
/// it back once flashed (four, `19.8.0.0`).
pub fn readback_of_bundle(version: &str) -> String {
    let v = version.trim();
    if v.split('.').count() >= 4 {
        v.to_string()
    } else {
        format!("{v}.0")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn v(xs: &[&str]) -> Vec<String> {
        xs.iter().map(|s| s.to_string()).collect()
    }

    #[test]
    fn snapshot_reads_every_card() {
        let out = r#"Gathering information...
{"time": "x", "host_info": {}, "device_info": [
  {"board_info": {"bus_id": "0000:01:00.0"}, "firmwares": {"fw_bundle_version": "19.8.0.0", "cm_fw": "0.1"}},
  {"firmwares": {"fw_bundle_version": " 19.7.0.0 "}}
]}
trailing"#;
        assert_eq!(parse_snapshot(out), Ok(v(&["19.8.0.0", "19.7.0.0"])));
    }

    #[test]
    fn snapshot_errors() {
        assert_eq!(
            parse_snapshot("Error: no chips found"),
            Err(SnapshotError::NoJson)
        );
        assert!(matches!(
            parse_snapshot("{\"device_info\": ["),
            Err(SnapshotError::Json(_))
        ));
        assert_eq!(parse_snapshot("{}"), Err(SnapshotError::NoDevices));
        assert_eq!(
            parse_snapshot("{\"device_info\": []}"),
            Err(SnapshotError::Empty)
        );
        assert_eq!(
            parse_snapshot("{\"device_info\": [{\"firmwares\": {}}]}"),
            Err(SnapshotError::NoVersion(0))
        );
    }

    #[test]
    fn heal_picks_the_galaxy_reset_for_galaxy_boards_only() {
        assert_eq!(
            heal_for([("0x1e52", "0x0035\n"), ("0x8086", "0x0000")]),
            Heal::GalaxyReset
        );
        assert_eq!(heal_for([("0x1E52", "0x0047")]), Heal::GalaxyReset);
        assert_eq!(heal_for([("0x1e52", "0x0040")]), Heal::Reset);
        // A Galaxy subsystem id on another vendor's device is not a Galaxy.
        assert_eq!(heal_for([("0x10de", "0x0035")]), Heal::Reset);
        assert_eq!(heal_for([]), Heal::Reset);
        assert_eq!(Heal::GalaxyReset.tt_smi_args(), ["-glx_reset"]);
        assert_eq!(Heal::Reset.tt_smi_args(), ["-r"]);
    }

    #[test]
    fn plain_and_bounded_messages() {
        assert_eq!(
            plain("\u{1b}[91m No Tenstorrent driver detected! \u{1b}[0m\r"),
            "No Tenstorrent driver detected!"
        );
        assert_eq!(plain("a\u{1b}Mb"), "ab");
        let long = "é".repeat(MESSAGE_MAX);
        let b = bounded(long);
        assert!(b.len() <= MESSAGE_MAX && b.ends_with("..."), "{}", b.len());
        assert_eq!(bounded("short".into()), "short");
    }

    #[test]
    fn flags() {
        assert!(env_flag(Some("true")) && env_flag(Some("TRUE")) && env_flag(Some("1")));
        assert!(!env_flag(Some("false")) && !env_flag(Some("")) && !env_flag(None));
        assert!(!env_flag(Some("yes")));
    }

    #[test]
    fn skips_when_every_card_reads_the_target() {
        let sw = Switches::default();
        let t = "19.8.0.0";
        assert_eq!(plan(Some(&v(&[t, t])), t, &sw), Plan::Skip);
        assert_eq!(
            plan(Some(&v(&[t, "19.7.0.0"])), t, &sw),
            Plan::Flash { args: vec![] }
        );
        // No readback: flash (continue-on-readback-failure got us here).
        assert_eq!(plan(None, t, &sw), Plan::Flash { args: vec![] });
        assert_eq!(plan(Some(&[]), t, &sw), Plan::Flash { args: vec![] });
    }

    #[test]
    fn force_write_never_skips_and_passes_force_once() {
        let t = "19.8.0.0";
        let sw = Switches {
            force_write: true,
            ..Default::default()
        };
        assert_eq!(
            plan(Some(&v(&[t])), t, &sw),
            Plan::Flash {
                args: v(&["--force"])
            }
        );
        let sw = Switches {
            force_write: true,
            flash_args: v(&["--force", "--skip-missing-fw"]),
            ..Default::default()
        };
        assert_eq!(
            plan(None, t, &sw),
            Plan::Flash {
                args: v(&["--force", "--skip-missing-fw"])
            }
        );
    }

    #[test]
    fn homogenize_forces_only_mixed_cards() {
        let t = "19.8.0.0";
        let sw = Switches {
            homogenize: true,
            ..Default::default()
        };
        // Different from each other: --force (a card newer than the target too).
        assert_eq!(
            plan(Some(&v(&["19.9.0.0", "19.7.0.0"])), t, &sw),
            Plan::Flash {
                args: v(&["--force"])
            }
        );
        // All the same, not the target: a plain flash.
        assert_eq!(
            plan(Some(&v(&["19.7.0.0", "19.7.0.0"])), t, &sw),
            Plan::Flash { args: vec![] }
        );
        // All the target: skip, homogenize or not.
        assert_eq!(plan(Some(&v(&[t, t])), t, &sw), Plan::Skip);
        // Unknown versions: nothing to homogenize.
        assert_eq!(plan(None, t, &sw), Plan::Flash { args: vec![] });
        // Without the switch mixed cards get no --force.
        assert_eq!(
            plan(Some(&v(&["19.9.0.0", "19.7.0.0"])), t, &Switches::default()),
            Plan::Flash { args: vec![] }
        );
    }

    #[test]
    fn flash_outcome_catches_the_silent_reset_failure() {
        assert!(flash_outcome(true, "exit status: 0", "Stage: DONE\n").is_ok());
        assert_eq!(
            flash_outcome(false, "exit status: 1", ""),
            Err("tt-flash failed (exit status: 1)".into())
        );
        let e = flash_outcome(
            true,
            "exit status: 0",
            "Stage: FLASH\n  Config space reset not completed for device 0\nDone\n",
        )
        .expect_err("fails");
        assert!(e.contains("device 0"), "{e}");
    }

    #[test]
    fn readback_after_names_the_versions() {
        let t = "19.8.0.0";
        assert!(check_after(&v(&[t, t]), t).is_ok());
        let e = check_after(&v(&[t, "19.7.0.0"]), t).expect_err("mismatch");
        assert!(
            e.contains("1 of 2") && e.contains("card 1 reads 19.7.0.0"),
            "{e}"
        );
        assert!(check_after(&[], t).is_err());
    }

    #[test]
    fn targets_and_bundle_versions() {
        assert_eq!(
            target(Some("19.8.0.1"), Some("19.8.0")),
            Some("19.8.0.1".into())
        );
        assert_eq!(target(Some(""), Some("19.8.0")), Some("19.8.0.0".into()));
        assert_eq!(target(None, None), None);
        assert_eq!(readback_of_bundle("19.8.0"), "19.8.0.0");
        assert_eq!(readback_of_bundle("19.8.0.2"), "19.8.0.2");
        assert!(mixed(&v(&["a", "b"])) && !mixed(&v(&["a", "a"])) && !mixed(&[]));
    }
}
