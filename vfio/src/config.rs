//! The device list (`--config`, the chart's ConfigMap), in the Go operator's
//! format and with its checks:
//!
//! ```yaml
//! devices:
//!   - resourceName: tenstorrent.com/wormhole
//!     vendorId: "1e52"
//!     deviceId: ["401e"]
//!     locality: individual   # individual (default) | numa | all
//! ```
//!
//! `locality` is for whatever advertises the functions to the kubelet: the
//! binder only validates it, so one file serves both. Unknown keys are
//! ignored for the same reason.

use std::path::Path;

use serde::Deserialize;

use crate::error::{Result, VfioError};

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Config {
    pub devices: Vec<DeviceGroup>,
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct DeviceGroup {
    pub resource_name: String,
    pub vendor_id: u16,
    pub device_ids: Vec<u16>,
    pub locality: Locality,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Locality {
    Individual,
    Numa,
    All,
}

#[derive(Deserialize)]
struct RawConfig {
    #[serde(default)]
    devices: Option<Vec<RawGroup>>,
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct RawGroup {
    #[serde(default)]
    resource_name: String,
    #[serde(default)]
    vendor_id: String,
    #[serde(default, rename = "deviceId")]
    device_ids: Vec<String>,
    #[serde(default)]
    locality: Option<String>,
}

impl Config {
    pub fn load(path: &Path) -> Result<Config> {
        let text = std::fs::read_to_string(path).map_err(|source| VfioError::ConfigRead {
            path: path.to_path_buf(),
            source,
        })?;
        let raw: RawConfig = if text.trim().is_empty() {
            RawConfig { devices: None }
        } else {
            serde_yaml::from_str(&text).map_err(|source| VfioError::ConfigParse {
                path: path.to_path_buf(),
                source,
            })?
        };
        Self::validate(raw)
    }

    /// Parses a config's text (for tests and `load`).
    pub fn parse(text: &str) -> Result<Config> {
        let raw: RawConfig =
            serde_yaml::from_str(text).map_err(|source| VfioError::ConfigParse {
                path: "<text>".into(),
                source,
            })?;
        Self::validate(raw)
    }

    fn validate(raw: RawConfig) -> Result<Config> {
        let mut devices = Vec::new();
        for (i, g) in raw.devices.unwrap_or_default().into_iter().enumerate() {
            let bad = |field: &str, why: String| {
                VfioError::ConfigInvalid(format!("devices[{i}].{field}: {why}"))
            };
            if !valid_resource_name(&g.resource_name) {
                return Err(bad(
                    "resourceName",
                    format!(
                        "{:?} must match ^[a-z0-9.\\-]+/[a-z0-9.\\-]+$",
                        g.resource_name
                    ),
                ));
            }
            let vendor_id = parse_id(&g.vendor_id)
                .ok_or_else(|| bad("vendorId", format!("{:?} is not 4 hex digits", g.vendor_id)))?;
            if g.device_ids.is_empty() {
                return Err(bad(
                    "deviceId",
                    "is empty: the group matches nothing".into(),
                ));
            }
            let mut device_ids = Vec::new();
            for (j, d) in g.device_ids.iter().enumerate() {
                let id = parse_id(d).ok_or_else(|| {
                    bad(
                        &format!("deviceId[{j}]"),
                        format!("{d:?} is not 4 hex digits"),
                    )
                })?;
                device_ids.push(id);
            }
            let locality = match g.locality.as_deref().unwrap_or("") {
                "" | "individual" => Locality::Individual,
                "numa" => Locality::Numa,
                "all" => Locality::All,
                other => {
                    return Err(bad(
                        "locality",
                        format!("{other:?} is not individual, numa or all"),
                    ));
                }
            };
            devices.push(DeviceGroup {
                resource_name: g.resource_name,
                vendor_id,
                device_ids,
                locality,
            });
        }
        Ok(Config { devices })
    }

    /// The resource name of the first group matching `vendor:device`.
    pub fn resource_of(&self, vendor: u16, device: u16) -> Option<&str> {
        self.devices
            .iter()
            .find(|g| g.vendor_id == vendor && g.device_ids.contains(&device))
            .map(|g| g.resource_name.as_str())
    }
}

/// Go's `^[a-z0-9.\-]+/[a-z0-9.\-]+$`.
fn valid_resource_name(s: &str) -> bool {
    let part = |p: &str| {
        !p.is_empty()
            && p.bytes()
                .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'.' || b == b'-')
    };
    matches!(s.split_once('/'), Some((a, b)) if part(a) && part(b))
}

/// A PCI ID as the config writes it: exactly 4 hex digits, either case, no `0x`.
fn parse_id(s: &str) -> Option<u16> {
    if s.len() != 4 || !s.bytes().all(|b| b.is_ascii_hexdigit()) {
        return None;
    }
    u16::from_str_radix(s, 16).ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn err(text: &str) -> String {
        Config::parse(text).expect_err("invalid").to_string()
    }

    #[test]
    fn gos_format_parses_with_its_defaults() {
        // Unquoted IDs too: 1e52 reads as a float in YAML, but is taken as written.
        let c = Config::parse(
            "devices:\n- resourceName: tenstorrent.com/wormhole\n  vendorId: 1e52\n  deviceId: [\"401E\", b140]\n\
             - resourceName: tenstorrent.com/bh\n  vendorId: \"1E52\"\n  deviceId: [\"b140\"]\n  locality: numa\n  extra: ignored\n",
        )
        .expect("valid");
        assert_eq!(c.devices.len(), 2);
        assert_eq!(c.devices[0].vendor_id, 0x1e52);
        assert_eq!(c.devices[0].device_ids, vec![0x401e, 0xb140]);
        assert_eq!(c.devices[0].locality, Locality::Individual);
        assert_eq!(c.devices[1].locality, Locality::Numa);
        assert_eq!(
            c.resource_of(0x1e52, 0xb140),
            Some("tenstorrent.com/wormhole")
        );
        assert_eq!(c.resource_of(0x1e52, 0x1234), None);
        assert_eq!(Config::parse("devices: []").expect("empty").devices, vec![]);
        assert_eq!(Config::parse("{}").expect("none").devices, vec![]);
    }

    #[test]
    fn invalid_fields_are_named_with_their_index() {
        let ok = "  vendorId: \"1e52\"\n  deviceId: [\"401e\"]\n";
        let cases = [
            (
                format!("- resourceName: Tenstorrent.com/x\n{ok}"),
                ["devices[0].resourceName", "Tenstorrent.com/x"],
            ),
            (
                format!("- resourceName: tenstorrent.com\n{ok}"),
                ["devices[0].resourceName", "must match"],
            ),
            (
                format!(
                    "- resourceName: a/b\n{ok}- resourceName: a/c\n  vendorId: \"0x1e52\"\n  deviceId: [\"401e\"]\n"
                ),
                ["devices[1].vendorId", "4 hex digits"],
            ),
            (
                "- resourceName: a/b\n  vendorId: \"1e52\"\n  deviceId: [\"401e\", \"40g1\"]\n"
                    .to_string(),
                ["devices[0].deviceId[1]", "40g1"],
            ),
            (
                "- resourceName: a/b\n  vendorId: \"1e52\"\n".to_string(),
                ["devices[0].deviceId", "is empty"],
            ),
            (
                format!("- resourceName: a/b\n{ok}  locality: rack\n"),
                ["devices[0].locality", "rack"],
            ),
        ];
        for (devices, wants) in cases {
            let e = err(&format!("devices:\n{devices}"));
            assert!(wants.iter().all(|w| e.contains(w)), "{wants:?} in {e}");
        }
        assert!(err("devices: 3").contains("parsing config"));
    }
}
