//! Processes holding the device: a walk of `<root>/proc/*/fd` for links into
//! /dev/tenstorrent (fuser misses them across mount namespaces) and of
//! `<root>/proc/*/maps` for mappings of it (a mapping pins the module after
//! its fd is closed), with each
//! PID's command name and, where its cgroup path tells, pod UID and container.
//! A path is not enough: a pod that mounts the host's `/dev` elsewhere (or
//! made its own node with mknod) holds the device under another name, so an
//! fd, or a shared mapping, of a character device with tt-kmd's major
//! (`/proc/devices`) counts too; and tt-kmd's own list of open files,
//! `/proc/driver/tenstorrent/<N>/pids` (one line per open file, mapping-only
//! holders included), adds any process the walk missed.
//! The [`Holder`] type itself lives in [`crate::holder`] (re-exported here).

use std::fs;
use std::path::Path;

pub use crate::holder::Holder;
use crate::host::HostRoot;

/// Every process under `<root>/proc` with an open file in /dev/tenstorrent,
/// sorted by PID. Processes that vanish during the walk are skipped.
pub fn find_holders(root: &HostRoot) -> Vec<Holder> {
    let proc_dir = root.path("/proc");
    let Ok(entries) = fs::read_dir(&proc_dir) else {
        return Vec::new();
    };
    let major = root
        .read_small("/proc/devices")
        .ok()
        .flatten()
        .and_then(|t| char_major(&t, ttdrv_api::vfio::KMD_PCI_DRIVER));
    let mut holders: Vec<Holder> = entries
        .filter_map(|e| e.ok())
        .filter_map(|e| {
            let pid: u32 = e.file_name().to_str()?.parse().ok()?;
            holder_of(root, &e.path(), pid, major)
        })
        .collect();
    // The driver's own list: open files the walk could not see (another
    // PID namespace's view, a file passed on and the opener's fds closed).
    for (pid, files) in driver_open_files(root) {
        if holders.iter().any(|h| h.pid == pid) {
            continue;
        }
        let mut h = bare_holder(root, pid);
        h.devices = files
            .iter()
            .map(|n| format!("{} (tt-kmd's pids list)", n))
            .collect();
        h.references = u32::try_from(files.len()).unwrap_or(u32::MAX);
        holders.push(h);
    }
    holders.sort_by_key(|h| h.pid);
    holders
}

/// The major number of the character device `name` in a `/proc/devices`
/// text (its "Character devices:" section).
pub fn char_major(devices: &str, name: &str) -> Option<u32> {
    devices
        .lines()
        .skip_while(|l| !l.starts_with("Character devices"))
        .take_while(|l| !l.starts_with("Block devices"))
        .find_map(|l| {
            let mut f = l.split_whitespace();
            let major = f.next()?.parse().ok()?;
            (f.next()? == name && f.next().is_none()).then_some(major)
        })
}

/// tt-kmd's open files by PID, from `/proc/driver/tenstorrent/<N>/pids`:
/// each PID with the device nodes (`/dev/tenstorrent/<N>`) it has open,
/// once per open file.
fn driver_open_files(root: &HostRoot) -> Vec<(u32, Vec<String>)> {
    let dir = "/proc/driver/tenstorrent";
    let Ok(cards) = fs::read_dir(root.path(dir)) else {
        return Vec::new();
    };
    let mut by_pid: std::collections::BTreeMap<u32, Vec<String>> = Default::default();
    for card in cards.filter_map(|e| e.ok()) {
        let Some(n) = card.file_name().to_str().map(str::to_string) else {
            continue;
        };
        let Some(text) = root.read_small(format!("{dir}/{n}/pids")).ok().flatten() else {
            continue;
        };
        for pid in text.lines().filter_map(|l| l.trim().parse::<u32>().ok()) {
            // 0: the opener is in no PID namespace this agent sees.
            if pid != 0 {
                by_pid
                    .entry(pid)
                    .or_default()
                    .push(format!("{}/{n}", ttdrv_api::labels::DEVICE_DIR));
            }
        }
    }
    by_pid.into_iter().collect()
}

/// Whether an fd's `fdinfo` text describes a dma-buf tt-kmd exported
/// (`exp_name:` is the exporting module's name).
pub fn is_kmd_dmabuf(fdinfo: &str) -> bool {
    fdinfo.lines().any(|l| {
        l.strip_prefix("exp_name:")
            .is_some_and(|v| v.trim() == ttdrv_api::vfio::KMD_PCI_DRIVER)
    })
}

/// Whether `path` (a /proc magic link, followed) is tt-kmd's character
/// device: its device number's major is `major`. A stat: nothing is opened.
fn is_kmd_device(path: &Path, major: Option<u32>) -> Option<String> {
    use std::os::unix::fs::{FileTypeExt, MetadataExt};
    let major = major?;
    let md = fs::metadata(path).ok()?;
    if !md.file_type().is_char_device() || rustix::fs::major(md.rdev()) != major {
        return None;
    }
    Some(format!("{major}:{}", rustix::fs::minor(md.rdev())))
}

/// The most of `/proc/<pid>/maps` read: a process with more mappings than
/// this (about 100,000 lines) is read up to here.
const MAPS_MAX: u64 = 8 << 20;

fn holder_of(root: &HostRoot, pid_dir: &Path, pid: u32, major: Option<u32>) -> Option<Holder> {
    let mut devices: Vec<String> = fs::read_dir(pid_dir.join("fd"))
        .into_iter()
        .flatten()
        .filter_map(|fd| fd.ok())
        .filter_map(|fd| {
            let target = fs::read_link(fd.path()).ok()?.to_str()?.to_string();
            if is_device_path(&target) {
                return Some(target);
            }
            // A dma-buf tt-kmd exported (2.10 and later): it holds a module
            // reference for as long as any fd or mapping of it lives.
            if target.contains("dmabuf") {
                let name = fd.file_name();
                let info = root
                    .read_small(format!("/proc/{pid}/fdinfo/{}", name.to_string_lossy()))
                    .ok()
                    .flatten()?;
                return is_kmd_dmabuf(&info).then(|| {
                    format!(
                        "dma-buf fd {} (exported by tenstorrent)",
                        name.to_string_lossy()
                    )
                });
            }
            // Another name for the same device (the host's /dev mounted
            // elsewhere, a node made with mknod).
            is_kmd_device(&fd.path(), major).map(|n| format!("{target} (device {n})"))
        })
        .collect();
    let fd_count = u32::try_from(devices.len()).unwrap_or(u32::MAX);
    // Through crate::hostfs: no link followed, no FIFO waited on; a larger
    // maps file is read up to MAPS_MAX.
    let mapped = root
        .dir(format!("/proc/{pid}"), false)
        .and_then(|d| d.open_file("maps"))
        .map(|f| {
            use std::io::Read;
            let mut bytes = Vec::new();
            let _ = f.take(MAPS_MAX).read_to_end(&mut bytes);
            let text = String::from_utf8_lossy(&bytes);
            let mut m = mapped_devices(&text);
            m.extend(mapped_elsewhere(pid_dir, &text, major));
            m.sort();
            m.dedup();
            m
        })
        .unwrap_or_default();
    if devices.is_empty() && mapped.is_empty() {
        return None;
    }
    devices.sort();
    devices.dedup();
    let unopened = mapped.iter().filter(|m| !devices.contains(m)).count();
    let references = fd_count.saturating_add(u32::try_from(unopened).unwrap_or(u32::MAX));
    let mut h = bare_holder(root, pid);
    h.devices = devices;
    h.mapped = mapped;
    h.references = references;
    Some(h)
}

/// A holder with its command name and, where its cgroup tells, pod and
/// container; no devices yet.
fn bare_holder(root: &HostRoot, pid: u32) -> Holder {
    // Bounded, non-blocking reads that follow no link (crate::hostfs): a
    // planted FIFO or /dev/zero link there costs nothing.
    let read = |name: &str| {
        root.read_small(format!("/proc/{pid}/{name}"))
            .ok()
            .flatten()
    };
    let comm = read("comm")
        .map(|c| c.trim().to_string())
        .unwrap_or_else(|| "?".to_string());
    let (pod_uid, container_id) = read("cgroup")
        .map(|c| parse_cgroup(&c))
        .unwrap_or((None, None));
    Holder {
        pid,
        comm,
        devices: Vec::new(),
        mapped: Vec::new(),
        references: 0,
        pod_uid,
        pod: None,
        container_id,
    }
}

/// Shared mappings of tt-kmd's device under another path: each shared,
/// file-backed line of `maps` not under /dev/tenstorrent is checked through
/// `/proc/<pid>/map_files/<range>` (a stat of the mapped file; private
/// mappings, libraries among them, are never the device's).
fn mapped_elsewhere(pid_dir: &Path, maps: &str, major: Option<u32>) -> Vec<String> {
    major.map_or_else(Vec::new, |_| {
        maps.lines()
            .filter_map(|l| {
                let f: Vec<&str> = l.split_whitespace().collect();
                let (range, perms) = (*f.first()?, *f.get(1)?);
                let path = f.get(5..)?.join(" ");
                if !perms.ends_with('s') || !path.starts_with('/') || is_device_path(&path) {
                    return None;
                }
                let n = is_kmd_device(&pid_dir.join("map_files").join(range), major)?;
                Some(format!("{path} (device {n})"))
            })
            .collect()
    })
}

/// The device files mapped in a `/proc/<pid>/maps` text (its sixth field,
/// the path), sorted and once each.
pub fn mapped_devices(maps: &str) -> Vec<String> {
    let mut out: Vec<String> = maps
        .lines()
        .filter_map(|l| {
            let path = l.split_whitespace().skip(5).collect::<Vec<_>>().join(" ");
            // A node unlinked since (udev re-created it) still pins the module.
            let path = path.strip_suffix(" (deleted)").unwrap_or(&path).to_string();
            is_device_path(&path).then_some(path)
        })
        .collect();
    out.sort();
    out.dedup();
    out
}

fn is_device_path(target: &str) -> bool {
    let dir = ttdrv_api::labels::DEVICE_DIR;
    target == dir
        || target
            .strip_prefix(dir)
            .is_some_and(|rest| rest.starts_with('/'))
}

/// Pod UID and container ID from `/proc/<pid>/cgroup` content. Handles the
/// systemd driver (`kubepods-besteffort-pod<uid_with_underscores>.slice/
/// cri-containerd-<id>.scope`) and the cgroupfs driver
/// (`/kubepods/besteffort/pod<uid>/<id>`), cgroup v1 and v2.
pub fn parse_cgroup(content: &str) -> (Option<String>, Option<String>) {
    for line in content.lines() {
        // hierarchy-ID:controllers:path
        let Some(path) = line.splitn(3, ':').nth(2) else {
            continue;
        };
        if !path.contains("kubepods") {
            continue;
        }
        let segments: Vec<&str> = path.split('/').filter(|s| !s.is_empty()).collect();
        let mut pod_uid = None;
        let mut container = None;
        for (i, seg) in segments.iter().enumerate() {
            let stem = seg.strip_suffix(".slice").unwrap_or(seg);
            if let Some(idx) = stem.rfind("pod") {
                let candidate = stem[idx + 3..].replace('_', "-");
                if looks_like_uid(&candidate) {
                    pod_uid = Some(candidate);
                    if let Some(next) = segments.get(i + 1) {
                        container = container_id(next);
                    }
                }
            }
        }
        if pod_uid.is_some() {
            return (pod_uid, container);
        }
    }
    (None, None)
}

fn looks_like_uid(s: &str) -> bool {
    s.len() == 36
        && s.chars().enumerate().all(|(i, c)| {
            if [8, 13, 18, 23].contains(&i) {
                c == '-'
            } else {
                c.is_ascii_hexdigit()
            }
        })
}

fn container_id(segment: &str) -> Option<String> {
    let s = segment.strip_suffix(".scope").unwrap_or(segment);
    let s = s.rsplit('-').next().unwrap_or(s);
    (s.len() >= 12 && s.chars().all(|c| c.is_ascii_hexdigit())).then(|| s.to_string())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_systemd_cgroup_v2() {
        let c = "0::/kubepods.slice/kubepods-besteffort.slice/kubepods-besteffort-pod0f1e2d3c_4b5a_6978_8a9b_0c1d2e3f4a5b.slice/cri-containerd-0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef.scope\n";
        let (uid, ctr) = parse_cgroup(c);
        assert_eq!(uid.as_deref(), Some("0f1e2d3c-4b5a-6978-8a9b-0c1d2e3f4a5b"));
        assert_eq!(
            ctr.as_deref(),
            Some("0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef")
        );
    }

    #[test]
    fn parses_cgroupfs_v1() {
        let c = "12:pids:/kubepods/burstable/pod0f1e2d3c-4b5a-6978-8a9b-0c1d2e3f4a5b/abcdefabcdef0123\n1:name=systemd:/kubepods/burstable/pod0f1e2d3c-4b5a-6978-8a9b-0c1d2e3f4a5b/abcdefabcdef0123\n";
        let (uid, ctr) = parse_cgroup(c);
        assert_eq!(uid.as_deref(), Some("0f1e2d3c-4b5a-6978-8a9b-0c1d2e3f4a5b"));
        assert_eq!(ctr.as_deref(), Some("abcdefabcdef0123"));
    }

    #[test]
    fn host_process_has_no_pod() {
        assert_eq!(
            parse_cgroup("0::/user.slice/user-1000.slice/session-2.scope\n"),
            (None, None)
        );
        assert_eq!(parse_cgroup(""), (None, None));
    }

    #[test]
    fn mappings_of_the_device_are_found() {
        let maps = "\
7f0000000000-7f0000100000 rw-s 00000000 00:05 1234                       /dev/tenstorrent/0
7f0000100000-7f0000200000 rw-s 00100000 00:05 1234                       /dev/tenstorrent/0
7f0000200000-7f0000300000 r--p 00000000 08:01 99                         /usr/lib/libc.so.6
7f0000300000-7f0000400000 rw-p 00000000 00:00 0                          [heap]
7f0000400000-7f0000500000 rw-s 00000000 00:05 1235                       /dev/tenstorrent/1 (deleted)
";
        assert_eq!(
            mapped_devices(maps),
            ["/dev/tenstorrent/0", "/dev/tenstorrent/1"]
        );
        assert!(mapped_devices("").is_empty());
    }

    #[test]
    fn a_process_that_only_maps_the_device_holds_it() {
        let dir = tempfile::tempdir().expect("tempdir");
        let root = HostRoot::new(dir.path());
        let p = |rel: &str| root.path(rel);
        for pid in ["100", "200", "300"] {
            fs::create_dir_all(p(&format!("/proc/{pid}/fd"))).expect("mkdir");
            fs::write(p(&format!("/proc/{pid}/comm")), format!("p{pid}\n")).expect("comm");
        }
        std::os::unix::fs::symlink("/dev/tenstorrent/0", p("/proc/100/fd/3")).expect("fd");
        std::os::unix::fs::symlink("/dev/tenstorrent/0", p("/proc/100/fd/4")).expect("fd");
        // pid 200 closed its fd after mmap: only the mapping is left.
        let line = "7f00-7f10 rw-s 00000000 00:05 1 /dev/tenstorrent/1\n";
        fs::write(p("/proc/200/maps"), line).expect("maps");
        fs::write(
            p("/proc/300/maps"),
            "7f00-7f10 r--p 0 08:01 9 /usr/lib/x.so\n",
        )
        .expect("maps");
        let got = find_holders(&root);
        let pids: Vec<u32> = got.iter().map(|h| h.pid).collect();
        assert_eq!(pids, [100, 200]);
        assert_eq!(got[0].references, 2, "two fds");
        assert!(got[1].devices.is_empty());
        assert_eq!(got[1].mapped, ["/dev/tenstorrent/1"]);
        assert_eq!(got[1].references, 1);
        assert!(
            got[1].to_string().contains("mapping /dev/tenstorrent/1"),
            "{}",
            got[1]
        );
    }

    #[test]
    fn the_majors_come_from_the_character_section() {
        let devices = "Character devices:\n  1 mem\n240 tenstorrent\n241 tenstorrent2\n\nBlock devices:\n259 tenstorrent\n";
        assert_eq!(char_major(devices, "tenstorrent"), Some(240));
        assert_eq!(char_major(devices, "mem"), Some(1));
        assert_eq!(char_major(devices, "nvme"), None);
        assert_eq!(char_major("", "tenstorrent"), None);
    }

    #[test]
    fn the_drivers_pids_list_adds_what_the_walk_missed() {
        let dir = tempfile::tempdir().expect("tempdir");
        let root = HostRoot::new(dir.path());
        let p = |rel: &str| root.path(rel);
        for pid in ["100", "700"] {
            fs::create_dir_all(p(&format!("/proc/{pid}/fd"))).expect("mkdir");
            fs::write(p(&format!("/proc/{pid}/comm")), format!("p{pid}\n")).expect("comm");
        }
        std::os::unix::fs::symlink("/dev/tenstorrent/0", p("/proc/100/fd/3")).expect("fd");
        fs::create_dir_all(p("/proc/driver/tenstorrent/0")).expect("mkdir");
        fs::create_dir_all(p("/proc/driver/tenstorrent/1")).expect("mkdir");
        // 100 is found by its fd; 700 only by the driver (twice on card 1,
        // once on card 0: three open files); 0 is outside our namespace.
        fs::write(p("/proc/driver/tenstorrent/0/pids"), "100\n700\n0\n").expect("pids");
        fs::write(p("/proc/driver/tenstorrent/1/pids"), "700\n700\n").expect("pids");
        let got = find_holders(&root);
        assert_eq!(got.iter().map(|h| h.pid).collect::<Vec<_>>(), [100, 700]);
        assert_eq!(got[0].references, 1, "found by the walk, counted once");
        assert_eq!(got[1].references, 3, "once per open file");
        assert_eq!(got[1].comm, "p700");
        assert!(
            got[1].devices[0].starts_with("/dev/tenstorrent/0"),
            "{:?}",
            got[1].devices
        );
    }

    #[test]
    fn a_dmabuf_tt_kmd_exported_holds_the_module() {
        let dir = tempfile::tempdir().expect("tempdir");
        let root = HostRoot::new(dir.path());
        let p = |rel: &str| root.path(rel);
        for pid in ["100", "200"] {
            fs::create_dir_all(p(&format!("/proc/{pid}/fd"))).expect("mkdir");
            fs::create_dir_all(p(&format!("/proc/{pid}/fdinfo"))).expect("mkdir");
            fs::write(p(&format!("/proc/{pid}/comm")), "w\n").expect("comm");
        }
        // 100 holds tt-kmd's dma-buf; 200 another driver's.
        std::os::unix::fs::symlink("/dmabuf:", p("/proc/100/fd/7")).expect("fd");
        fs::write(
            p("/proc/100/fdinfo/7"),
            "pos:\t0\nflags:\t02\nsize:\t4096\ncount:\t1\nexp_name:\ttenstorrent\nname:\t\n",
        )
        .expect("fdinfo");
        std::os::unix::fs::symlink("anon_inode:dmabuf", p("/proc/200/fd/7")).expect("fd");
        fs::write(p("/proc/200/fdinfo/7"), "exp_name:\tsystem-heap\n").expect("fdinfo");
        let got = find_holders(&root);
        assert_eq!(got.iter().map(|h| h.pid).collect::<Vec<_>>(), [100]);
        assert_eq!(got[0].references, 1);
        assert_eq!(
            got[0].to_string(),
            "pid 100 (w), through dma-buf fd 7 (exported by tenstorrent)"
        );
    }

    #[test]
    fn a_holder_through_another_path_says_which() {
        let mut h = Holder {
            pid: 7,
            comm: "sleep".into(),
            devices: vec!["/host/dev/tenstorrent/1 (device 240:1)".into()],
            mapped: vec![],
            references: 1,
            pod_uid: None,
            pod: None,
            container_id: None,
        };
        assert_eq!(
            h.to_string(),
            "pid 7 (sleep), through /host/dev/tenstorrent/1 (device 240:1)"
        );
        h.devices = vec!["/dev/tenstorrent/1".into()];
        assert_eq!(h.to_string(), "pid 7 (sleep)");
    }

    #[test]
    fn device_paths() {
        assert!(is_device_path("/dev/tenstorrent/0"));
        assert!(is_device_path("/dev/tenstorrent"));
        assert!(!is_device_path("/dev/tenstorrent0"));
        assert!(!is_device_path("/dev/null"));
    }
}
