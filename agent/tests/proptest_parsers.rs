//! Property tests of everything the agent parses from the host: `/proc/<pid>/cgroup`,
//! `/proc/<pid>/fd` links, `/proc/sys/kernel/osrelease`, `sys/module/tenstorrent/{version,refcnt}`,
//! a module's `.modinfo` ELF section, and version strings (against the CRD's pattern).
//! None of them may panic on any input; each must recover what a well-formed input holds.

use std::fs;
use std::sync::LazyLock;

use proptest::prelude::*;
use regex::Regex;
use ttdrv_agent::HostRoot;
use ttdrv_agent::fake::{fake_host, set_loaded};
use ttdrv_agent::holders::{find_holders, parse_cgroup};
use ttdrv_agent::host::{validate_version, version_matches};
use ttdrv_agent::modinfo::{fake_module_bytes, modinfo_field, module_version};

/// `spec.version`'s pattern in the CRD (generated from the same definition the
/// agent uses, `ttdrv_api::validation`).
static CRD_VERSION: LazyLock<Regex> =
    LazyLock::new(|| Regex::new(&ttdrv_api::validation::version_pattern()).expect("compiles"));

fn hex(n: usize) -> impl Strategy<Value = String> {
    prop::collection::vec(prop::sample::select(b"0123456789abcdef".to_vec()), n)
        .prop_map(|v| String::from_utf8(v).expect("ascii"))
}

fn uid() -> impl Strategy<Value = String> {
    (hex(8), hex(4), hex(4), hex(4), hex(12))
        .prop_map(|(a, b, c, d, e)| format!("{a}-{b}-{c}-{d}-{e}"))
}

/// A cgroup line of a container in a pod, in one of the layouts kubelet uses.
fn pod_cgroup_line() -> impl Strategy<Value = (String, String, String)> {
    (
        uid(),
        hex(64),
        prop::sample::select(vec!["", "besteffort", "burstable"]),
        0..4usize,
        prop::sample::select(vec!["cri-containerd", "crio", "docker"]),
    )
        .prop_map(|(uid, cid, qos, layout, runtime)| {
            let line = match layout {
                // systemd driver, cgroup v2
                0 | 1 => {
                    let u = uid.replace('-', "_");
                    let (qslice, pod) = if qos.is_empty() {
                        (String::new(), format!("kubepods-pod{u}.slice"))
                    } else {
                        (
                            format!("kubepods-{qos}.slice/"),
                            format!("kubepods-{qos}-pod{u}.slice"),
                        )
                    };
                    let prefix = if layout == 0 {
                        "0::"
                    } else {
                        "1:name=systemd:"
                    };
                    format!("{prefix}/kubepods.slice/{qslice}{pod}/{runtime}-{cid}.scope")
                }
                // cgroupfs driver, cgroup v1 and v2
                _ => {
                    let q = if qos.is_empty() {
                        String::new()
                    } else {
                        format!("{qos}/")
                    };
                    let prefix = if layout == 2 { "4:pids:" } else { "0::" };
                    format!("{prefix}/kubepods/{q}pod{uid}/{cid}")
                }
            };
            (line, uid, cid)
        })
}

fn noise_line() -> impl Strategy<Value = String> {
    prop_oneof![
        Just("0::/user.slice/user-1000.slice/session-2.scope".to_string()),
        Just("12:cpuset:/".to_string()),
        Just("".to_string()),
        Just("garbage without colons".to_string()),
        "[ -~]{0,40}".prop_filter("no kubepods", |s| !s.contains("kubepods")),
    ]
}

/// Regression (found by `modinfo_never_panics_on_wild_section_offsets`): a
/// section header table placed at the very top of the address space made the
/// offset arithmetic overflow (a panic in debug builds) instead of reporting a
/// truncated file.
#[test]
fn modinfo_section_table_at_the_top_of_the_address_space_is_an_error() {
    let mut b = fake_module_bytes(&["version=2.8.0"]);
    b[0x28..0x30].copy_from_slice(&(u64::MAX - 2).to_le_bytes());
    let f = tempfile::NamedTempFile::new().expect("tmp");
    fs::write(f.path(), &b).expect("write");
    let err = module_version(f.path()).expect_err("corrupt");
    assert!(
        err.to_string().contains("cannot read the module version"),
        "{err}"
    );
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 600, ..ProptestConfig::default() })]

    // ---- /proc/<pid>/cgroup ----

    #[test]
    fn cgroup_parser_never_panics(s in any::<String>()) {
        let (uid, cid) = parse_cgroup(&s);
        if let Some(u) = uid {
            prop_assert_eq!(u.len(), 36);
        }
        if let Some(c) = cid {
            prop_assert!(c.len() >= 12 && c.chars().all(|c| c.is_ascii_hexdigit()));
        }
    }

    #[test]
    fn cgroup_parser_finds_pod_and_container(
        (line, uid, cid) in pod_cgroup_line(),
        before in prop::collection::vec(noise_line(), 0..3),
        after in prop::collection::vec(noise_line(), 0..3),
    ) {
        let mut lines = before;
        lines.push(line.clone());
        lines.extend(after);
        let content = lines.join("\n") + "\n";
        let (got_uid, got_cid) = parse_cgroup(&content);
        prop_assert_eq!(got_uid.as_deref(), Some(uid.as_str()), "{}", content);
        prop_assert_eq!(got_cid.as_deref(), Some(cid.as_str()), "{}", content);
    }

    #[test]
    fn host_processes_have_no_pod(lines in prop::collection::vec(noise_line(), 0..5)) {
        prop_assert_eq!(parse_cgroup(&lines.join("\n")), (None, None));
    }

    // ---- /proc/*/fd ----

    #[test]
    fn holders_are_exactly_the_processes_with_device_links(
        procs in prop::collection::btree_map(
            1u32..100_000,
            prop::collection::vec(
                prop::sample::select(vec![
                    "/dev/tenstorrent/0", "/dev/tenstorrent/1", "/dev/tenstorrent",
                    "/dev/tenstorrent0", "/dev/null", "socket:[1234]", "/tmp/dev/tenstorrent/0",
                    "anon_inode:[eventfd]",
                ]),
                0..5,
            ),
            0..8,
        ),
        junk in prop::collection::btree_set("[a-z]{1,8}", 0..3),
    ) {
        let dir = tempfile::tempdir().expect("tempdir");
        let root = HostRoot::new(dir.path());
        for (pid, targets) in &procs {
            let fd = root.path(format!("/proc/{pid}/fd"));
            fs::create_dir_all(&fd).expect("mkdir");
            for (i, t) in targets.iter().enumerate() {
                std::os::unix::fs::symlink(t, fd.join(i.to_string())).expect("link");
            }
        }
        for j in &junk {
            // Non-PID entries of /proc (self, sys, ...) are ignored.
            fs::create_dir_all(root.path(format!("/proc/{j}/fd"))).expect("mkdir");
            std::os::unix::fs::symlink("/dev/tenstorrent/0", root.path(format!("/proc/{j}/fd/3"))).expect("link");
        }
        let holders = find_holders(&root);
        let is_dev = |t: &str| t == "/dev/tenstorrent" || t.starts_with("/dev/tenstorrent/");
        let want: Vec<(u32, Vec<String>)> = procs
            .iter()
            .filter_map(|(pid, ts)| {
                let mut d: Vec<String> = ts.iter().filter(|t| is_dev(t)).map(|t| t.to_string()).collect();
                d.sort();
                d.dedup();
                (!d.is_empty()).then_some((*pid, d))
            })
            .collect();
        let got: Vec<(u32, Vec<String>)> = holders.iter().map(|h| (h.pid, h.devices.clone())).collect();
        prop_assert_eq!(got, want);
        prop_assert!(holders.iter().all(|h| h.comm == "?"), "no comm file: shown as ?");
    }

    // ---- sys/module/tenstorrent ----

    #[test]
    fn sysfs_module_state_never_panics_and_is_trimmed(
        version in prop::collection::vec(any::<u8>(), 0..40),
        refcnt in prop::collection::vec(any::<u8>(), 0..20),
    ) {
        let dir = tempfile::tempdir().expect("tempdir");
        let root = HostRoot::new(dir.path());
        let m = root.path("/sys/module/tenstorrent");
        fs::create_dir_all(&m).expect("mkdir");
        fs::write(m.join("version"), &version).expect("write");
        fs::write(m.join("refcnt"), &refcnt).expect("write");
        let st = root.module_state().expect("readable").expect("loaded");
        let v = String::from_utf8_lossy(&version).trim().to_string();
        prop_assert_eq!(st.version, (!v.is_empty()).then_some(v));
        // Fail closed: a refcnt that is no number reads as in use.
        let r = String::from_utf8_lossy(&refcnt)
            .trim()
            .parse::<u32>()
            .unwrap_or(ttdrv_agent::host::REFCNT_UNKNOWN);
        prop_assert_eq!(st.refcnt, r);
    }

    #[test]
    fn sysfs_numbers_round_trip(v in "[0-9]{1,3}\\.[0-9]{1,3}\\.[0-9]{1,3}(-rc[0-9])?", refcnt in any::<u32>()) {
        let dir = tempfile::tempdir().expect("tempdir");
        set_loaded(dir.path(), &v, refcnt).expect("sysfs");
        let root = HostRoot::new(dir.path());
        let st = root.module_state().expect("readable").expect("loaded");
        prop_assert_eq!(st.version.as_deref(), Some(v.as_str()));
        prop_assert_eq!(st.refcnt, refcnt);
    }

    // ---- /proc/sys/kernel/osrelease ----

    #[test]
    fn kernel_release_never_escapes_the_cache(content in prop::collection::vec(any::<u8>(), 0..60)) {
        let dir = tempfile::tempdir().expect("tempdir");
        fake_host(dir.path(), "x").expect("host");
        let root = HostRoot::new(dir.path());
        fs::write(root.path("/proc/sys/kernel/osrelease"), &content).expect("write");
        let Ok(text) = String::from_utf8(content.clone()) else {
            // Not UTF-8: refused with an error naming the file.
            let err = root.kernel_release().expect_err("not UTF-8");
            prop_assert!(err.to_string().contains("proc/sys/kernel/osrelease"));
            return Ok(());
        };
        let trimmed = text.trim().to_string();
        match root.kernel_release() {
            Ok(k) => {
                prop_assert_eq!(&k, &trimmed);
                prop_assert!(!k.is_empty() && !k.contains('/') && !k.contains('\0') && k != "..");
                // The cache path built from it stays inside the cache directory.
                let p = ttdrv_agent::cache::Cache::host_path(&k, "2.8.0");
                prop_assert!(p.starts_with("/var/cache/tt-kmd/"));
                prop_assert_eq!(p.matches('/').count(), 6, "{}", p);
            }
            Err(_) => prop_assert!(
                trimmed.is_empty() || trimmed.contains('/') || trimmed.contains('\0') || trimmed == ".."
            ),
        }
    }

    // ---- .modinfo of a module file ----

    #[test]
    fn modinfo_never_panics_on_arbitrary_bytes(bytes in prop::collection::vec(any::<u8>(), 0..300)) {
        let f = tempfile::NamedTempFile::new().expect("tmp");
        fs::write(f.path(), &bytes).expect("write");
        let _ = module_version(f.path());
    }

    /// A valid module with its ELF header fields overwritten by arbitrary values.
    #[test]
    fn modinfo_never_panics_on_corrupt_headers(
        shoff in any::<u64>(),
        shentsize in any::<u16>(),
        shnum in any::<u16>(),
        shstrndx in any::<u16>(),
        which in 0..16u8,
        flip in any::<(usize, u8)>(),
    ) {
        let mut b = fake_module_bytes(&["license=GPL", "version=2.8.0"]);
        if which & 1 != 0 { b[0x28..0x30].copy_from_slice(&shoff.to_le_bytes()); }
        if which & 2 != 0 { b[0x3A..0x3C].copy_from_slice(&shentsize.to_le_bytes()); }
        if which & 4 != 0 { b[0x3C..0x3E].copy_from_slice(&shnum.to_le_bytes()); }
        if which & 8 != 0 { b[0x3E..0x40].copy_from_slice(&shstrndx.to_le_bytes()); }
        let i = flip.0 % b.len();
        b[i] ^= flip.1;
        let f = tempfile::NamedTempFile::new().expect("tmp");
        fs::write(f.path(), &b).expect("write");
        let _ = module_version(f.path());
    }

    /// Section headers whose offset/size point anywhere, up to the top of the address space.
    #[test]
    fn modinfo_never_panics_on_wild_section_offsets(
        off in prop_oneof![any::<u64>(), (u64::MAX - 64)..=u64::MAX],
        size in prop_oneof![any::<u64>(), (u64::MAX - 64)..=u64::MAX],
        shoff in prop_oneof![Just(None), (u64::MAX - 200..=u64::MAX).prop_map(Some)],
    ) {
        let mut b = fake_module_bytes(&["version=2.8.0"]);
        let sh = u64::from_le_bytes(b[0x28..0x30].try_into().expect("8 bytes")) as usize;
        // section 1 (.modinfo): offset at +24, size at +32
        b[sh + 64 + 24..sh + 64 + 32].copy_from_slice(&off.to_le_bytes());
        b[sh + 64 + 32..sh + 64 + 40].copy_from_slice(&size.to_le_bytes());
        if let Some(s) = shoff {
            b[0x28..0x30].copy_from_slice(&s.to_le_bytes());
        }
        let f = tempfile::NamedTempFile::new().expect("tmp");
        fs::write(f.path(), &b).expect("write");
        let _ = module_version(f.path());
    }

    #[test]
    fn modinfo_fields_round_trip(
        entries in prop::collection::btree_map("[a-z_]{1,12}", "[ -~&&[^\\x00]]{0,30}", 1..6),
    ) {
        let raw: Vec<String> = entries.iter().map(|(k, v)| format!("{k}={v}")).collect();
        let refs: Vec<&str> = raw.iter().map(String::as_str).collect();
        let f = tempfile::NamedTempFile::new().expect("tmp");
        fs::write(f.path(), fake_module_bytes(&refs)).expect("write");
        for (k, v) in &entries {
            let got = modinfo_field(f.path(), k).expect("readable");
            prop_assert_eq!(got.as_deref(), Some(v.trim()));
        }
        prop_assert_eq!(modinfo_field(f.path(), "absent-field").expect("readable"), None);
    }

    // ---- version strings: agent vs CRD ----

    /// The agent accepts a target exactly when the API server admits it (after
    /// trimming): one rule, at most 9 digits per part.
    #[test]
    fn agent_version_validation_agrees_with_the_crd(s in prop_oneof![
        any::<String>(),
        "[0-9]{1,11}\\.[0-9]{1,11}\\.[0-9]{1,11}",
        "[ \\n]?[0-9.]{0,12}(-rc1)?[ \\n]?",
    ]) {
        let trimmed = s.trim();
        match validate_version(&s) {
            Ok(v) => {
                prop_assert_eq!(v.as_str(), trimmed);
                prop_assert!(CRD_VERSION.is_match(trimmed), "agent accepts {:?}, CRD does not", s);
            }
            Err(e) => {
                prop_assert!(!CRD_VERSION.is_match(trimmed), "CRD admits {:?}, agent refuses", s);
                prop_assert!(e.to_string().contains("invalid target version"));
            }
        }
    }

    /// The readiness/upgrade comparison is exact equality after trimming: a
    /// suffixed or differently spelled version never counts as the target.
    #[test]
    fn version_match_is_trimmed_equality(
        target in "[0-9]{1,3}\\.[0-9]{1,3}\\.[0-9]{1,3}",
        loaded in prop_oneof![
            "[0-9]{1,3}\\.[0-9]{1,3}\\.[0-9]{1,3}",
            "[0-9]{1,3}\\.[0-9]{1,3}\\.[0-9]{1,3}-rc[0-9]",
            any::<String>(),
        ],
        pad in prop::sample::select(vec!["", "\n", " ", "\t\n"]),
    ) {
        let padded = format!("{target}{pad}");
        let suffixed = format!("{target}-rc1");
        prop_assert!(version_matches(Some(&padded), &target));
        prop_assert!(!version_matches(Some(&suffixed), &target));
        prop_assert!(!version_matches(None, &target));
        prop_assert_eq!(
            version_matches(Some(&loaded), &target),
            loaded.trim() == target,
            "{:?} vs {:?}", loaded, target
        );
    }
}
