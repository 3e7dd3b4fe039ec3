//! Processes holding the device: a walk of `<root>/proc/*/fd` for links into
//! /dev/tenstorrent (fuser misses them across mount namespaces), with each
//! PID's command name and, where its cgroup path tells, pod UID and container.
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
    let mut holders: Vec<Holder> = entries
        .filter_map(|e| e.ok())
        .filter_map(|e| {
            let pid: u32 = e.file_name().to_str()?.parse().ok()?;
            holder_of(root, &e.path(), pid)
        })
        .collect();
    holders.sort_by_key(|h| h.pid);
    holders
}

fn holder_of(root: &HostRoot, pid_dir: &Path, pid: u32) -> Option<Holder> {
    let fds = fs::read_dir(pid_dir.join("fd")).ok()?;
    let mut devices: Vec<String> = fds
        .filter_map(|fd| fd.ok())
        .filter_map(|fd| fs::read_link(fd.path()).ok())
        .filter_map(|target| target.to_str().map(str::to_string))
        .filter(|t| is_device_path(t))
        .collect();
    if devices.is_empty() {
        return None;
    }
    devices.sort();
    devices.dedup();
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
    Some(Holder {
        pid,
        comm,
        devices,
        pod_uid,
        pod: None,
        container_id,
    })
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
    fn device_paths() {
        assert!(is_device_path("/dev/tenstorrent/0"));
        assert!(is_device_path("/dev/tenstorrent"));
        assert!(!is_device_path("/dev/tenstorrent0"));
        assert!(!is_device_path("/dev/null"));
    }
}
