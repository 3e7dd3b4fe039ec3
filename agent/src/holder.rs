//! A process holding /dev/tenstorrent open, as plain data: what the /proc walk
//! (`holders`) finds and what errors list. Depends on no other module.

use std::fmt;

use serde::Serialize;

/// The refcnt of a loaded module whose `refcnt` file is missing or
/// unparsable: the largest count, so every check sees the module in use
/// (fail closed).
pub const REFCNT_UNKNOWN: u32 = u32::MAX;

#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Holder {
    pub pid: u32,
    /// `/proc/<pid>/comm`.
    pub comm: String,
    /// Device files the process holds open, e.g. `/dev/tenstorrent/0`.
    pub devices: Vec<String>,
    /// Device files the process has mapped (`/proc/<pid>/maps`): a mapping
    /// pins the module after the fd is closed.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub mapped: Vec<String>,
    /// Module references this process explains: its fds on the device, and
    /// each mapped device it has no fd on.
    #[serde(skip)]
    pub references: u32,
    /// Pod UID from the cgroup path, when the process runs in a pod.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub pod_uid: Option<String>,
    /// `namespace/name` of that pod, when the API server told us.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub pod: Option<String>,
    /// Container ID from the cgroup path.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub container_id: Option<String>,
}

impl fmt::Display for Holder {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "pid {} ({})", self.pid, self.comm)?;
        match (&self.pod, &self.pod_uid) {
            (Some(pod), _) => write!(f, " in pod {pod}")?,
            (None, Some(uid)) => write!(f, " in pod uid {uid}")?,
            _ => {}
        }
        if let Some(c) = &self.container_id {
            let short: String = c.chars().take(12).collect();
            write!(f, " container {short}")?;
        }
        // Another name for the device (the host's /dev mounted elsewhere in
        // a pod): the path says where to look.
        let elsewhere: Vec<&str> = self
            .devices
            .iter()
            .chain(&self.mapped)
            .map(String::as_str)
            .filter(|d| !d.starts_with(ttdrv_api::labels::DEVICE_DIR))
            .collect();
        if !elsewhere.is_empty() {
            write!(f, ", through {}", elsewhere.join(", "))?;
        }
        if !self.mapped.is_empty() && self.devices.is_empty() {
            write!(f, ", mapping {} (no fd open)", self.mapped.join(", "))?;
        }
        Ok(())
    }
}
