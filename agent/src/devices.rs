//! Access to the devices after a container install, as DKMS (and the Go
//! operator's builder) leave it: the udev rule that makes `/dev/tenstorrent/*`
//! world-accessible with by-id links, a udev reload where udevadm exists, and a
//! chmod of the device nodes already there (only under our own rule: a host's
//! rule, such as an administrator's `MODE="0660"`, decides the modes and is
//! never widened); and the removal of the pre-5.x tt-smi virtualenv under
//! `/opt/tt`. Every step works under the host root and is best effort: a
//! failure is a warning, never a failed install.

use std::path::{Path, PathBuf};
use std::process::Command;

use rustix::fs::FileType;

use crate::host::HostRoot;
use crate::hostfs::{self, HostFsError};

/// Where the rule is installed on the host.
pub const UDEV_RULE_PATH: &str = "/etc/udev/rules.d/50-tenstorrent.rules";
/// The device directory.
pub const DEV_DIR: &str = "/dev/tenstorrent";
/// The pre-5.x tt-smi virtualenv.
pub const OLD_VENV_DIR: &str = "/opt/tt";

/// The first line of the rule this agent writes: how it knows its own file.
pub const UDEV_RULE_MARK: &str = "# Installed by the tt-kmd installer (tt-driver-manager)";

/// tt-kmd's `udev-50-tenstorrent.rules` (since ttkmd-2.6.0): every
/// Tenstorrent device node 0666, and `/dev/tenstorrent/by-id/<kind>-<ASIC id>`
/// links for Wormhole (0x401e) and Blackhole (0xb140), named from the
/// driver's `tt_asic_id` attribute once it is readable (the guard: the
/// driver sends a change uevent when its telemetry comes up).
pub const UDEV_RULE: &str = concat!(
    "# Installed by the tt-kmd installer (tt-driver-manager)",
    r#", as tt-kmd's
# udev-50-tenstorrent.rules: Tenstorrent devices are usable by every user.
SUBSYSTEM=="tenstorrent", MODE="0666"
SUBSYSTEM=="tenstorrent", ATTRS{device}=="0x401e", ATTR{tt_asic_id}=="?*", SYMLINK+="tenstorrent/by-id/wormhole-%s{tt_asic_id}"
SUBSYSTEM=="tenstorrent", ATTRS{device}=="0xb140", ATTR{tt_asic_id}=="?*", SYMLINK+="tenstorrent/by-id/blackhole-%s{tt_asic_id}"
"#
);

/// What to do with the file at [`UDEV_RULE_PATH`].
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum RuleAction {
    /// Absent, an older rule of ours, or one that names links from
    /// `pci_addr` (an attribute no tt-kmd version has: every card's link
    /// would be the same): written.
    Write,
    /// Ours, as it should be.
    Current,
    /// The host's own rule for the Tenstorrent devices (`make dkms` installs
    /// tt-kmd's; an admin may restrict the mode): kept as it is, with why.
    Keep(String),
}

/// Whether a udev rule line applies to the Tenstorrent device nodes.
fn matches_devices(line: &str) -> bool {
    let l: String = line.chars().filter(|c| !c.is_whitespace()).collect();
    !l.starts_with('#')
        && (l.contains(r#"SUBSYSTEM=="tenstorrent""#) || l.contains(r#"KERNEL=="tenstorrent"#))
}

/// What to do with the host's file at [`UDEV_RULE_PATH`], from its text.
pub fn rule_action(existing: Option<&str>) -> RuleAction {
    let Some(text) = existing else {
        return RuleAction::Write;
    };
    if text == UDEV_RULE {
        return RuleAction::Current;
    }
    if text.starts_with(UDEV_RULE_MARK) || text.contains("{pci_addr}") {
        return RuleAction::Write;
    }
    if !text.lines().any(matches_devices) {
        return RuleAction::Write;
    }
    let links = if text.contains("tt_asic_id") {
        "with by-id links"
    } else {
        "without by-id links (tt-kmd before 2.6.0 shipped none)"
    };
    RuleAction::Keep(format!(
        "the host's own rule for the Tenstorrent devices, {links}: left as it is"
    ))
}

/// What [`ensure_device_access`] did, for the log.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct DeviceAccess {
    /// The rule file was written (absent, ours but older, or broken before).
    pub rule_written: bool,
    /// The host's own rule was found and kept, with why.
    pub rule_kept: Option<String>,
    /// udevadm was found and asked to reload; None when not found.
    pub udev_reloaded: Option<bool>,
    /// By-id links our rule names that were missing after udev settled (a
    /// lost uevent): the subsystem was triggered again for them.
    pub links_retriggered: Vec<String>,
    /// By-id links still missing after that (a warning names them).
    pub links_missing: Vec<String>,
    /// Device nodes whose mode was changed to 0666.
    pub chmodded: Vec<PathBuf>,
    /// The old virtualenv(s) removed.
    pub removed: Vec<PathBuf>,
    /// Steps that failed (warnings).
    pub warnings: Vec<String>,
}

/// Installs the udev rule, reloads udev if it can, makes the existing device
/// nodes 0666 when the rule in force is ours, and removes the pre-5.x
/// virtualenv. Never fails.
pub fn ensure_device_access(root: &HostRoot) -> DeviceAccess {
    let mut out = DeviceAccess::default();
    match install_rule(root) {
        Ok(RuleAction::Write) => out.rule_written = true,
        Ok(RuleAction::Current) => {}
        Ok(RuleAction::Keep(why)) => out.rule_kept = Some(why),
        Err(e) => out
            .warnings
            .push(format!("installing {UDEV_RULE_PATH}: {e}")),
    }
    if out.rule_written {
        match reload_udev(root) {
            None => {}
            Some(Ok(())) => out.udev_reloaded = Some(true),
            Some(Err(e)) => {
                out.udev_reloaded = Some(false);
                out.warnings.push(format!("udev reload: {e}"));
            }
        }
    }
    // Under our rule every card with a readable tt_asic_id has its by-id
    // link once udev has settled. One that lacks it lost its uevent (udevd
    // busy, restarted, or the rule came after the event): trigger once more
    // rather than leave tools that open cards by id without the card.
    if out.rule_kept.is_none() && udevadm(root).is_some() {
        let missing = missing_links(root);
        if !missing.is_empty() {
            if let Some(Err(e)) = retrigger_udev(root) {
                out.warnings.push(format!("udev trigger: {e}"));
            }
            out.links_retriggered = missing;
            out.links_missing = missing_links(root);
            if !out.links_missing.is_empty() {
                out.warnings.push(format!(
                    "by-id links missing after udev settled twice: {}",
                    out.links_missing.join(", ")
                ));
            }
        }
    }
    // A host's own rule sets the modes (udev applies it to every node it
    // makes): widening the nodes here would undo an administrator's
    // restriction until the next uevent.
    if out.rule_kept.is_none() {
        match chmod_devices(root) {
            Ok(changed) => out.chmodded = changed,
            Err(e) => out.warnings.push(format!("chmod {DEV_DIR}/*: {e}")),
        }
    }
    match remove_old_venv(root) {
        Ok(removed) => out.removed = removed,
        Err(e) => out
            .warnings
            .push(format!("removing the old venv under {OLD_VENV_DIR}: {e}")),
    }
    out
}

/// Writes the rule (0644) when [`rule_action`] says so; returns what it did.
/// A link, FIFO or device at its path is refused ([`crate::hostfs`]).
fn install_rule(root: &HostRoot) -> Result<RuleAction, HostFsError> {
    let (dir, name) = hostfs::split(Path::new(UDEV_RULE_PATH))?;
    let dir = root.dir(dir, true)?;
    let existing = dir.read_optional(name, hostfs::SMALL_FILE_MAX)?;
    let action = rule_action(existing.as_deref().map(String::from_utf8_lossy).as_deref());
    if action == RuleAction::Write {
        dir.write_atomic(name, &mut UDEV_RULE.as_bytes(), 0o644)?;
    }
    Ok(action)
}

/// The host's udevadm, if it has one.
fn udevadm(root: &HostRoot) -> Option<&'static str> {
    [
        "/usr/bin/udevadm",
        "/bin/udevadm",
        "/sbin/udevadm",
        "/usr/sbin/udevadm",
    ]
    .into_iter()
    .find(|p| root.path(p).is_file())
}

/// Runs the host's udevadm with `args` (through chroot when the root is not
/// `/`); the error says which command failed and what it printed.
fn run_udevadm(root: &HostRoot, found: &str, args: &[&str]) -> Result<(), String> {
    let mut cmd = if root.root() == Path::new("/") {
        Command::new(found)
    } else {
        let mut c = Command::new("chroot");
        c.arg(root.root()).arg(found);
        c
    };
    let what = format!("udevadm {}", args.join(" "));
    match cmd.args(args).output() {
        Ok(o) if o.status.success() => Ok(()),
        Ok(o) => Err(format!(
            "{what}: {}: {}",
            o.status,
            String::from_utf8_lossy(&o.stderr).trim()
        )),
        Err(e) => Err(format!("{what}: {e}")),
    }
}

/// udevd's queue drained, or 30 s: what the links are checked after.
const SETTLE: &[&str] = &["settle", "--timeout=30"];
/// The devices already there get their links and modes again.
const TRIGGER: &[&str] = &["trigger", "--subsystem-match=tenstorrent", "--action=add"];

/// Reloads the rules, then triggers the tenstorrent subsystem so the links
/// and modes apply to the devices already there, and waits for udev to
/// settle. The trigger runs even when the reload failed (udevd reads changed
/// rules by itself). None when the host has no udevadm.
fn reload_udev(root: &HostRoot) -> Option<Result<(), String>> {
    let found = udevadm(root)?;
    let reload = run_udevadm(root, found, &["control", "--reload-rules"]);
    let trigger = run_udevadm(root, found, TRIGGER);
    let settle = run_udevadm(root, found, SETTLE);
    Some(reload.and(trigger).and(settle))
}

/// Triggers the tenstorrent subsystem again and waits for udev to settle.
fn retrigger_udev(root: &HostRoot) -> Option<Result<(), String>> {
    let found = udevadm(root)?;
    let trigger = run_udevadm(root, found, TRIGGER);
    let settle = run_udevadm(root, found, SETTLE);
    Some(trigger.and(settle))
}

/// The by-id links [`UDEV_RULE`] names that do not exist: one per card
/// (`/sys/class/tenstorrent/tenstorrent!N`) whose `tt_asic_id` is readable
/// and whose function is a Wormhole or a Blackhole. A card served without
/// telemetry has no id and so no link to miss.
pub fn missing_links(root: &HostRoot) -> Vec<String> {
    let read = |p: String| {
        std::fs::read_to_string(root.path(p))
            .ok()
            .map(|v| v.trim().to_string())
            .filter(|v| !v.is_empty())
    };
    let mut missing = vec![];
    for card in crate::validate::cards(root) {
        let dir = format!("{}/{card}", crate::validate::CLASS_DIR);
        let Some(id) = read(format!("{dir}/tt_asic_id")) else {
            continue;
        };
        let Some(kind) = read(format!("{dir}/device/device"))
            .and_then(|d| u16::from_str_radix(d.trim_start_matches("0x"), 16).ok())
            .and_then(|d| {
                ttdrv_api::vfio::KMD_SERVED_DEVICE_IDS
                    .iter()
                    .find(|(id, _)| *id == d)
            })
            .map(|(_, name)| name.to_lowercase())
        else {
            continue;
        };
        let link = format!("{DEV_DIR}/by-id/{kind}-{id}");
        if std::fs::symlink_metadata(root.path(&link)).is_err() {
            missing.push(link);
        }
    }
    missing
}

/// Makes every device node in /dev/tenstorrent (not the by-id links, not
/// directories) 0666; returns those it changed.
fn chmod_devices(root: &HostRoot) -> Result<Vec<PathBuf>, HostFsError> {
    let dir = match root.dir(DEV_DIR, false) {
        Ok(d) => d,
        Err(e) if e.is_not_found() => return Ok(vec![]),
        Err(e) => return Err(e),
    };
    let mut changed = vec![];
    for (name, t) in dir.entries()? {
        if !matches!(
            t,
            FileType::CharacterDevice | FileType::BlockDevice | FileType::RegularFile
        ) {
            continue;
        }
        let Some(st) = dir.stat(&name)? else {
            continue;
        };
        if st.st_mode & 0o777 != 0o666 {
            dir.chmod(&name, 0o666)?;
            changed.push(PathBuf::from(DEV_DIR).join(name));
        }
    }
    Ok(changed)
}

/// Removes the pre-5.x tt-smi virtualenv: `/opt/tt` when it is one (has
/// `pyvenv.cfg`), or each virtualenv directly under it (then `/opt/tt` when
/// left empty). Anything else under `/opt/tt` is left alone; links are
/// removed as links, never followed.
fn remove_old_venv(root: &HostRoot) -> Result<Vec<PathBuf>, HostFsError> {
    let (parent, name) = hostfs::split(Path::new(OLD_VENV_DIR))?;
    let parent = match root.dir(parent, false) {
        Ok(d) => d,
        Err(e) if e.is_not_found() => return Ok(vec![]),
        Err(e) => return Err(e),
    };
    let is_dir = |st: Option<rustix::fs::Stat>| {
        st.is_some_and(|st| FileType::from_raw_mode(st.st_mode) == FileType::Directory)
    };
    if !is_dir(parent.stat(name)?) {
        return Ok(vec![]);
    }
    let dir = parent.open_dir(name, false)?;
    let is_venv = |d: &hostfs::HostDir| {
        d.stat("pyvenv.cfg")
            .ok()
            .flatten()
            .is_some_and(|st| FileType::from_raw_mode(st.st_mode) == FileType::RegularFile)
    };
    if is_venv(&dir) {
        parent.remove_tree(name)?;
        return Ok(vec![PathBuf::from(OLD_VENV_DIR)]);
    }
    let mut removed = vec![];
    for (entry, t) in dir.entries()? {
        if t != FileType::Directory {
            continue;
        }
        if is_venv(&dir.open_dir(&entry, false)?) {
            dir.remove_tree(&entry)?;
            removed.push(PathBuf::from(OLD_VENV_DIR).join(entry));
        }
    }
    if !removed.is_empty() && dir.entries()?.is_empty() {
        parent.remove_empty_dir(name)?;
    }
    Ok(removed)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::fs;
    use std::os::unix::fs::PermissionsExt;

    fn mode(p: &Path) -> u32 {
        fs::symlink_metadata(p).expect("stat").permissions().mode() & 0o777
    }

    #[test]
    fn the_rule_is_tt_kmds_and_a_hosts_own_is_kept() {
        assert!(UDEV_RULE.starts_with(UDEV_RULE_MARK));
        // tt-kmd's own rule, as `make dkms` installs it (ttkmd-2.6.0 and later).
        let upstream = r#"SUBSYSTEM=="tenstorrent", MODE="0666"
SUBSYSTEM=="tenstorrent", ATTRS{device}=="0x401e", ATTR{tt_asic_id}=="?*", SYMLINK+="tenstorrent/by-id/wormhole-%s{tt_asic_id}"
SUBSYSTEM=="tenstorrent", ATTRS{device}=="0xb140", ATTR{tt_asic_id}=="?*", SYMLINK+="tenstorrent/by-id/blackhole-%s{tt_asic_id}"
"#;
        // The rule lines are the upstream ones, verbatim.
        let ours: Vec<&str> = UDEV_RULE.lines().filter(|l| !l.starts_with('#')).collect();
        assert_eq!(ours, upstream.lines().collect::<Vec<_>>());
        let older_ours = format!("{UDEV_RULE_MARK}\nSUBSYSTEM==\"tenstorrent\", MODE=\"0666\"\n");
        let pci_addr = r#"SUBSYSTEM=="tenstorrent", MODE="0666"
SUBSYSTEM=="tenstorrent", ATTRS{device}=="0x401e", SYMLINK+="tenstorrent/by-id/wormhole-$attr{pci_addr}"
"#;
        let kept = |t: &str| matches!(rule_action(Some(t)), RuleAction::Keep(_));
        assert_eq!(rule_action(None), RuleAction::Write);
        assert_eq!(rule_action(Some(UDEV_RULE)), RuleAction::Current);
        assert_eq!(rule_action(Some(&older_ours)), RuleAction::Write);
        assert_eq!(
            rule_action(Some(pci_addr)),
            RuleAction::Write,
            "links that collide"
        );
        assert_eq!(rule_action(Some("# empty\n")), RuleAction::Write);
        assert!(kept(upstream));
        // tt-kmd before 2.6.0, and an admin's restriction: never widened.
        assert!(kept("KERNEL==\"tenstorrent*\", MODE=\"0666\"\n"));
        assert!(kept(
            "SUBSYSTEM == \"tenstorrent\", GROUP=\"tt\", MODE=\"0660\"\n"
        ));
        let RuleAction::Keep(why) = rule_action(Some("KERNEL==\"tenstorrent*\", MODE=\"0666\""))
        else {
            unreachable!()
        };
        assert!(why.contains("without by-id links"), "{why}");
    }

    #[test]
    fn missing_links_are_those_of_cards_with_an_asic_id() {
        let dir = tempfile::tempdir().expect("tempdir");
        let root = HostRoot::new(dir.path());
        crate::fake::add_cards(dir.path(), 2).expect("cards");
        crate::fake::bind_cards(dir.path()).expect("bind");
        let want = |i: u32| format!("/dev/tenstorrent/by-id/wormhole-5A17C0DE000000{i:02X}");
        assert_eq!(missing_links(&root), [want(0), want(1)]);
        fs::create_dir_all(root.path("/dev/tenstorrent/by-id")).expect("mkdir");
        std::os::unix::fs::symlink("../0", root.path(want(0))).expect("link");
        assert_eq!(missing_links(&root), [want(1)], "card 0's link is there");
        // Served without telemetry: no id, so no link to miss.
        crate::fake::strip_telemetry(dir.path()).expect("strip");
        assert!(missing_links(&root).is_empty());
        // Without udevadm nothing makes links: none is reported missing.
        crate::fake::bind_cards(dir.path()).expect("bind");
        let got = ensure_device_access(&root);
        assert!(
            got.links_missing.is_empty() && got.links_retriggered.is_empty(),
            "{got:?}"
        );
        assert!(got.warnings.is_empty(), "{:?}", got.warnings);
    }

    #[test]
    fn a_hosts_rule_file_is_left_untouched() {
        let dir = tempfile::tempdir().expect("tempdir");
        let root = HostRoot::new(dir.path());
        let path = root.path(UDEV_RULE_PATH);
        fs::create_dir_all(path.parent().expect("parent")).expect("mkdir");
        let admin = "SUBSYSTEM==\"tenstorrent\", GROUP=\"tt\", MODE=\"0660\"\n";
        fs::write(&path, admin).expect("rule");
        // The node as the admin's rule made it: never widened.
        fs::create_dir_all(root.path(DEV_DIR)).expect("mkdir");
        let node = root.path(format!("{DEV_DIR}/0"));
        fs::write(&node, "").expect("device");
        fs::set_permissions(&node, fs::Permissions::from_mode(0o660)).expect("chmod");
        let got = ensure_device_access(&root);
        assert!(!got.rule_written && got.rule_kept.is_some(), "{got:?}");
        assert_eq!(fs::read_to_string(&path).expect("rule"), admin);
        assert_eq!(got.udev_reloaded, None, "nothing written, nothing reloaded");
        assert!(got.chmodded.is_empty(), "{got:?}");
        assert_eq!(mode(&node), 0o660, "the admin's 0660 was widened");
    }

    #[test]
    fn rule_installed_devices_opened_and_old_venv_removed() {
        let dir = tempfile::tempdir().expect("tempdir");
        let root = HostRoot::new(dir.path());
        fs::create_dir_all(root.path("/dev/tenstorrent/by-id")).expect("mkdir");
        for d in ["0", "1"] {
            let p = root.path(format!("/dev/tenstorrent/{d}"));
            fs::write(&p, "").expect("device");
            fs::set_permissions(&p, fs::Permissions::from_mode(0o600)).expect("chmod");
        }
        std::os::unix::fs::symlink("../0", root.path("/dev/tenstorrent/by-id/wormhole-x"))
            .expect("link");
        fs::create_dir_all(root.path("/opt/tt/bin")).expect("mkdir");
        fs::write(root.path("/opt/tt/pyvenv.cfg"), "home = /usr/bin\n").expect("venv");
        fs::create_dir_all(root.path("/opt/other")).expect("mkdir");

        let got = ensure_device_access(&root);
        assert!(got.rule_written);
        assert_eq!(got.udev_reloaded, None, "no udevadm in the planted host");
        assert_eq!(
            got.chmodded,
            [
                PathBuf::from("/dev/tenstorrent/0"),
                PathBuf::from("/dev/tenstorrent/1")
            ]
        );
        assert_eq!(got.removed, [PathBuf::from("/opt/tt")]);
        assert!(got.warnings.is_empty(), "{:?}", got.warnings);

        let rule = fs::read_to_string(root.path(UDEV_RULE_PATH)).expect("rule");
        assert!(rule.contains(r#"SUBSYSTEM=="tenstorrent", MODE="0666""#));
        assert!(rule.contains("0x401e") && rule.contains("0xb140"));
        assert_eq!(mode(&root.path(UDEV_RULE_PATH)), 0o644);
        assert_eq!(mode(&root.path("/dev/tenstorrent/0")), 0o666);
        assert_eq!(mode(&root.path("/dev/tenstorrent/1")), 0o666);
        assert!(!root.path("/opt/tt").exists());
        assert!(root.path("/opt/other").is_dir(), "only the venv goes");

        // Idempotent: nothing to do the second time.
        let again = ensure_device_access(&root);
        assert_eq!(again, DeviceAccess::default());
    }

    #[test]
    fn venvs_under_opt_tt_go_other_files_stay() {
        let dir = tempfile::tempdir().expect("tempdir");
        let root = HostRoot::new(dir.path());
        fs::create_dir_all(root.path("/opt/tt/venv/bin")).expect("mkdir");
        fs::write(root.path("/opt/tt/venv/pyvenv.cfg"), "").expect("venv");
        fs::write(root.path("/opt/tt/notes.txt"), "keep").expect("file");
        let got = ensure_device_access(&root);
        assert_eq!(got.removed, [PathBuf::from("/opt/tt/venv")]);
        assert!(root.path("/opt/tt/notes.txt").is_file());
        // No device directory: nothing to chmod, no warning.
        assert!(got.chmodded.is_empty());
        assert!(got.warnings.is_empty(), "{:?}", got.warnings);
    }
}
