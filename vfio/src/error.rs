//! The binder's one error type.

use std::path::PathBuf;

use ttdrv_agent::hostfs::HostFsError;

#[derive(Debug, thiserror::Error)]
pub enum VfioError {
    #[error("reading config {path}: {source}")]
    ConfigRead {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("parsing config {path}: {source}")]
    ConfigParse {
        path: PathBuf,
        #[source]
        source: serde_yaml::Error,
    },
    #[error("invalid config: {0}")]
    ConfigInvalid(String),
    #[error(transparent)]
    HostFs(#[from] HostFsError),
    #[error(
        "refusing PCI function {bdf}: {link} points to {target}, which resolves outside /sys/devices"
    )]
    LinkEscapes {
        bdf: String,
        link: String,
        target: String,
    },
    #[error("modprobe {module}: {reason}")]
    Modprobe { module: String, reason: String },
    #[error(
        "PCI driver {driver} is not registered (/sys/bus/pci/drivers/{driver} is missing){hint}"
    )]
    DriverMissing { driver: String, hint: &'static str },
    #[error(
        "{bdf} has no IOMMU group: IOMMU is off: enable VT-d/AMD-Vi and intel_iommu=on/amd_iommu=on, or set vfioManager.noIommu"
    )]
    IommuOff { bdf: String },
    #[error(
        "no-IOMMU mode was asked for but the kernel's vfio has none (no /sys/module/vfio/parameters/enable_unsafe_noiommu_mode: built without CONFIG_VFIO_NOIOMMU)"
    )]
    NoiommuUnsupported,
    #[error("{op} {bdf}: {source}")]
    Sysfs {
        op: String,
        bdf: String,
        #[source]
        source: HostFsError,
    },
    #[error("state file {path}: {reason}")]
    State { path: String, reason: String },
    #[error("metrics server on {addr}: {source}")]
    Metrics {
        addr: String,
        #[source]
        source: std::io::Error,
    },
    #[error("reporting on node {node}: {reason}")]
    Node { node: String, reason: String },
    #[error("installing the SIGTERM handler: {0}")]
    Signal(#[source] std::io::Error),
}

pub type Result<T> = std::result::Result<T, VfioError>;
