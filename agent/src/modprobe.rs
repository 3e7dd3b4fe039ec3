//! The host's own `options tenstorrent ...` lines (modprobe.d). A DKMS host
//! loads tt-kmd through modprobe, which applies them; `finit_module` does
//! not, so the agent reads them itself and adopts them at every load (the
//! policy's `spec.moduleParameters` win per name), so a host handed over
//! from DKMS keeps its parameters.
//!
//! Read as kmod reads them: the `*.conf` files of `/etc/modprobe.d`,
//! `/run/modprobe.d`, `/usr/local/lib/modprobe.d`, `/usr/lib/modprobe.d` and
//! `/lib/modprobe.d`, a file name in an earlier directory hiding the same
//! name in a later one (so `/etc` overrides), all files taken in the order
//! of their names, lines in order; a later value of a parameter overrides an
//! earlier one (the kernel applies the joined options left to right). `#`
//! starts a comment line, a `\` at the end of a line continues it. Every
//! path is read through [`HostRoot`] without following a link: a linked
//! file or directory is reported and skipped.
//!
//! The kernel command line's `tenstorrent.<name>=<value>` options count too:
//! modprobe applies them (kmod reads `/proc/cmdline` before the modprobe.d
//! files, so a file's value for the same name wins), and a host booted with
//! `tenstorrent.max_devices=8` keeps it across our loads.

use std::collections::BTreeMap;

use ttdrv_api::module_params::{self, Values};

use crate::host::{HostRoot, MODULE_NAME};
use crate::hostfs::SMALL_FILE_MAX;

/// The modprobe.d directories, highest priority first.
pub const DIRS: [&str; 5] = [
    "/etc/modprobe.d",
    "/run/modprobe.d",
    "/usr/local/lib/modprobe.d",
    "/usr/lib/modprobe.d",
    "/lib/modprobe.d",
];

/// What the host's modprobe configuration says about tenstorrent.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct HostOptions {
    /// Known tt-kmd parameters and their values, canonical.
    pub values: Values,
    /// What was not adopted, and why (an unknown parameter, a value the
    /// kernel would refuse, a file not read), for the log.
    pub ignored: Vec<String>,
    /// The files that had an `options tenstorrent` line (host paths).
    pub files: Vec<String>,
}

impl HostOptions {
    pub fn is_empty(&self) -> bool {
        self.values.is_empty() && self.ignored.is_empty()
    }
}

/// The host's `options tenstorrent` lines, read from `root`.
pub fn host_options(root: &HostRoot) -> HostOptions {
    let mut out = HostOptions::default();
    if let Some(cmdline) = root.read_small(CMDLINE).ok().flatten() {
        let options = cmdline_options(&cmdline, MODULE_NAME);
        if !options.is_empty() {
            out.files.push(CMDLINE.to_string());
        }
        for (k, v) in options {
            match adoptable(&k, &v) {
                Ok(v) => {
                    out.values.insert(k, v);
                }
                Err(why) => out.ignored.push(format!("{CMDLINE}: {why}")),
            }
        }
    }
    // name -> the directory it is read from (the first that has it).
    let mut files: BTreeMap<String, &str> = BTreeMap::new();
    for dir in DIRS {
        let entries = match root.dir(dir, false).and_then(|d| d.entries()) {
            Ok(e) => e,
            Err(e) if e.is_not_found() => continue,
            Err(e) => {
                // /lib is a link to usr/lib on a merged-/usr host: read there.
                if !matches!(e, crate::hostfs::HostFsError::Link { .. }) {
                    out.ignored.push(format!("{dir}: {e}"));
                }
                continue;
            }
        };
        for (name, _) in entries {
            if name.ends_with(".conf") {
                files.entry(name).or_insert(dir);
            }
        }
    }
    for (name, dir) in files {
        let path = format!("{dir}/{name}");
        let text = match root
            .dir(dir, false)
            .and_then(|d| d.read(&name, SMALL_FILE_MAX))
        {
            Ok(b) => String::from_utf8_lossy(&b).into_owned(),
            Err(e) => {
                out.ignored.push(format!("{path}: {e}"));
                continue;
            }
        };
        let options = options_of(&text, MODULE_NAME);
        if options.is_empty() {
            continue;
        }
        out.files.push(path.clone());
        for (k, v) in options {
            match adoptable(&k, &v) {
                Ok(v) => {
                    out.values.insert(k, v);
                }
                Err(why) => out.ignored.push(format!("{path}: {why}")),
            }
        }
    }
    out
}

/// The `name=value` options of every `options <module> ...` line in a
/// modprobe.d file, in order. A bare `name` (no value; the kernel reads a
/// bool as true) is `name=Y`; quotes around a value are removed. Module
/// names compare with `-` and `_` alike, as modprobe does.
pub fn options_of(text: &str, module: &str) -> Vec<(String, String)> {
    let same = |a: &str| a.replace('-', "_") == module.replace('-', "_");
    let mut out = Vec::new();
    for line in logical_lines(text) {
        let mut words = line.split_whitespace();
        if words.next() != Some("options") || !words.next().is_some_and(same) {
            continue;
        }
        for w in words {
            let (k, v) = w.split_once('=').unwrap_or((w, "Y"));
            let v = v.trim_matches('"');
            out.push((k.replace('-', "_"), v.to_string()));
        }
    }
    out
}

/// A host option as the agent keeps it: a parameter of today's tt-kmd
/// normalized ([`module_params::normalize`]); any other name (an older
/// release's own, such as 2.0.0's `arc_fw_init`) kept as one plain word for
/// the target module's own list to judge at the load
/// (`agent::load_parameters`), never dropped here by today's list.
fn adoptable(name: &str, value: &str) -> Result<String, String> {
    if module_params::parameter(name).is_some() {
        module_params::normalize(name, value)
    } else {
        module_params::raw(name, value)
    }
}

/// The kernel command line, read before the modprobe.d files.
pub const CMDLINE: &str = "/proc/cmdline";

/// The `<module>.<name>=<value>` options of a kernel command line, in order
/// (a bare `<module>.<name>` is `=Y`; double quotes group and are removed,
/// as the kernel's own parser does). Module names compare with `-` and `_`
/// alike.
pub fn cmdline_options(cmdline: &str, module: &str) -> Vec<(String, String)> {
    let mut words = Vec::new();
    let (mut cur, mut quoted) = (String::new(), false);
    for c in cmdline.chars() {
        match c {
            '"' => quoted = !quoted,
            c if c.is_whitespace() && !quoted => {
                if !cur.is_empty() {
                    words.push(std::mem::take(&mut cur));
                }
            }
            c => cur.push(c),
        }
    }
    if !cur.is_empty() {
        words.push(cur);
    }
    let module = module.replace('-', "_");
    words
        .into_iter()
        // Everything after a bare `--` is for init, not the kernel.
        .take_while(|w| w != "--")
        .filter_map(|w| {
            let (key, value) = w.split_once('=').unwrap_or((&w, "Y"));
            let (m, name) = key.split_once('.')?;
            (m.replace('-', "_") == module && !name.is_empty())
                .then(|| (name.replace('-', "_"), value.to_string()))
        })
        .collect()
}

/// Lines with `\`-continuations joined, comments and blank lines dropped.
fn logical_lines(text: &str) -> Vec<String> {
    let mut out = Vec::new();
    let mut cur = String::new();
    for raw in text.lines() {
        let line = raw.trim_end();
        if cur.is_empty() && line.trim_start().starts_with('#') {
            continue;
        }
        if let Some(body) = line.strip_suffix('\\') {
            cur.push_str(body);
            cur.push(' ');
            continue;
        }
        cur.push_str(line);
        if !cur.trim().is_empty() {
            out.push(std::mem::take(&mut cur));
        }
        cur.clear();
    }
    if !cur.trim().is_empty() {
        out.push(cur);
    }
    out
}

/// What the agent loads with: the host's values, then the policy's over
/// them (the policy wins per name).
pub fn merged(host: &Values, policy: &Values) -> Values {
    let mut v = host.clone();
    v.extend(policy.iter().map(|(k, v)| (k.clone(), v.clone())));
    v
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::fs;

    #[test]
    fn options_lines_with_comments_and_continuations() {
        let text = "\
# options tenstorrent max_devices=99
options snd-hda-intel model=auto
options tenstorrent max_devices=4 \\
    power_policy=N
  options   tenstorrent reset_limit=\"3\"
options tenstorrent auto_reset_timeout
blacklist tenstorrent

options tenstorrent max_devices=8
";
        assert_eq!(
            options_of(text, "tenstorrent"),
            vec![
                ("max_devices".to_string(), "4".to_string()),
                ("power_policy".to_string(), "N".to_string()),
                ("reset_limit".to_string(), "3".to_string()),
                ("auto_reset_timeout".to_string(), "Y".to_string()),
                ("max_devices".to_string(), "8".to_string()),
            ]
        );
        assert!(options_of("options tenstorrent-x a=1\n", "tenstorrent").is_empty());
        assert_eq!(
            options_of("options tenstorrent max-devices=2\n", "tenstorrent"),
            vec![("max_devices".to_string(), "2".to_string())]
        );
    }

    fn write(root: &std::path::Path, path: &str, text: &str) {
        let p = HostRoot::new(root).path(path);
        if let Some(d) = p.parent() {
            fs::create_dir_all(d).expect("dir");
        }
        fs::write(p, text).expect("write");
    }

    #[test]
    fn etc_overrides_a_file_of_the_same_name_and_later_files_override_earlier() {
        let dir = tempfile::tempdir().expect("tempdir");
        let root = dir.path();
        write(
            root,
            "/usr/lib/modprobe.d/tenstorrent.conf",
            "options tenstorrent max_devices=2 reset_limit=5\n",
        );
        write(
            root,
            "/etc/modprobe.d/tenstorrent.conf",
            "options tenstorrent max_devices=4\n",
        );
        write(
            root,
            "/lib/modprobe.d/zz-late.conf",
            "options tenstorrent power_policy=0 bogus=1 dma_address_bits=x\n",
        );
        write(
            root,
            "/run/modprobe.d/aa-early.conf",
            "options tenstorrent max_devices=16 idle_power_down_grace_ms=0x10\n",
        );
        write(
            root,
            "/etc/modprobe.d/other.conf.disabled",
            "options tenstorrent max_devices=1\n",
        );
        let o = host_options(&HostRoot::new(root));
        assert_eq!(
            module_params::canonical(&o.values),
            "bogus=1 idle_power_down_grace_ms=16 max_devices=4 power_policy=N",
            "{o:?}"
        );
        assert_eq!(
            o.files,
            [
                "/run/modprobe.d/aa-early.conf",
                "/etc/modprobe.d/tenstorrent.conf",
                "/lib/modprobe.d/zz-late.conf"
            ]
        );
        // An unknown name is kept for the target module's own list to judge;
        // a known one with a bad value is not.
        assert_eq!(o.ignored.len(), 1, "{:?}", o.ignored);
        assert!(o.ignored[0].contains("dma_address_bits"), "{:?}", o.ignored);
        let m = merged(
            &o.values,
            &[("max_devices".to_string(), "8".to_string())].into(),
        );
        assert_eq!(
            module_params::canonical(&m),
            "bogus=1 idle_power_down_grace_ms=16 max_devices=8 power_policy=N"
        );
    }

    #[test]
    fn the_kernel_command_line_counts_and_modprobe_d_wins_over_it() {
        assert_eq!(
            cmdline_options(
                "BOOT_IMAGE=/vmlinuz ro tenstorrent.max_devices=8 quiet tenstorrent.power-policy \
                 tenstorrent.reset_limit=\"3\" tenstorrentx.a=1 tenstorrent.=2 -- tenstorrent.dma_address_bits=40",
                "tenstorrent"
            ),
            [
                ("max_devices".to_string(), "8".to_string()),
                ("power_policy".to_string(), "Y".to_string()),
                ("reset_limit".to_string(), "3".to_string()),
            ]
        );
        let dir = tempfile::tempdir().expect("tempdir");
        write(
            dir.path(),
            "/proc/cmdline",
            "ro tenstorrent.max_devices=8 tenstorrent.reset_limit=2 tenstorrent.max_devices2=\"a b\"\n",
        );
        let o = host_options(&HostRoot::new(dir.path()));
        assert_eq!(
            module_params::canonical(&o.values),
            "max_devices=8 reset_limit=2"
        );
        assert_eq!(o.files, ["/proc/cmdline"]);
        assert!(o.ignored[0].contains("max_devices2"), "{:?}", o.ignored);
        write(
            dir.path(),
            "/etc/modprobe.d/tt.conf",
            "options tenstorrent reset_limit=5\n",
        );
        let o = host_options(&HostRoot::new(dir.path()));
        assert_eq!(
            module_params::canonical(&o.values),
            "max_devices=8 reset_limit=5"
        );
    }

    #[test]
    fn a_linked_file_is_not_followed() {
        let dir = tempfile::tempdir().expect("tempdir");
        let outside = tempfile::tempdir().expect("tempdir");
        let secret = outside.path().join("secret.conf");
        fs::write(&secret, "options tenstorrent max_devices=7\n").expect("write");
        write(
            dir.path(),
            "/etc/modprobe.d/keep.conf",
            "options tenstorrent reset_limit=2\n",
        );
        std::os::unix::fs::symlink(
            &secret,
            HostRoot::new(dir.path()).path("/etc/modprobe.d/link.conf"),
        )
        .expect("link");
        let o = host_options(&HostRoot::new(dir.path()));
        assert_eq!(module_params::canonical(&o.values), "reset_limit=2");
        assert_eq!(o.ignored.len(), 1, "{:?}", o.ignored);
        assert!(o.ignored[0].contains("link.conf"), "{:?}", o.ignored);
        assert_eq!(
            host_options(&HostRoot::new(outside.path())),
            HostOptions::default()
        );
    }
}
