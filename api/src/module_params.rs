//! `spec.moduleParameters`: the tt-kmd module parameters a policy sets, and
//! the one definition of their canonical string (modprobe syntax
//! `name=value`, sorted by name, booleans `Y`/`N`, as sysfs prints them) and
//! of "these parameters are in effect" given the values the loaded module
//! shows in `/sys/module/tenstorrent/parameters/<name>`. The controller, the
//! agent and the simulated agent all compare through [`mismatches`].

use std::collections::BTreeMap;
use std::fmt;

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

/// Parameter name (as the module declares it) to its canonical value.
pub type Values = BTreeMap<String, String>;

/// The C type of a module parameter, which decides how a value is written
/// and read back.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Kind {
    /// `uint`: 0 to 4294967295.
    Uint,
    /// `byte`: 0 to 255.
    Byte,
    /// `bool`: `Y` or `N` in sysfs.
    Bool,
}

/// One tt-kmd parameter the policy can set.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Parameter {
    /// The module's name for it (`modinfo -p`, sysfs).
    pub name: &'static str,
    pub kind: Kind,
    /// The first tt-kmd release that has it (`module_param` in module.c).
    pub since: &'static str,
    /// Its default in every release that has it (as sysfs prints it).
    pub default: &'static str,
    /// Writable at run time (`module_param(..., 0644)`): a new value is
    /// written to `/sys/module/tenstorrent/parameters/<name>` while the
    /// module serves, never a reload (and so never a cordon or a drain).
    pub runtime: bool,
}

/// tt-kmd's parameters as of ttkmd-2.10.0, with the release that introduced
/// each (read from module.c of every tag).
pub const PARAMETERS: [Parameter; 6] = [
    Parameter {
        name: "auto_reset_timeout",
        kind: Kind::Byte,
        since: "1.26",
        default: "10",
        runtime: false,
    },
    Parameter {
        name: "dma_address_bits",
        kind: Kind::Uint,
        since: "1.6",
        default: "0",
        runtime: false,
    },
    Parameter {
        name: "idle_power_down_grace_ms",
        kind: Kind::Uint,
        since: "2.9.0",
        default: "5000",
        runtime: true,
    },
    Parameter {
        name: "max_devices",
        kind: Kind::Uint,
        since: "1.1",
        default: "32",
        runtime: false,
    },
    Parameter {
        name: "power_policy",
        kind: Kind::Bool,
        since: "2.6.0",
        default: "Y",
        runtime: false,
    },
    Parameter {
        name: "reset_limit",
        kind: Kind::Uint,
        since: "1.19",
        default: "10",
        runtime: false,
    },
];

impl Parameter {
    /// Whether tt-kmd `version` (`MAJOR.MINOR.PATCH`, a pre-release suffix
    /// ignored) has this parameter; None when `version` does not parse.
    pub fn in_version(&self, version: &str) -> Option<bool> {
        Some(release(version)? >= release(self.since)?)
    }
}

/// `1.26` or `2.9.0-rc1` as (major, minor, patch), for ordering releases.
pub fn release(v: &str) -> Option<(u64, u64, u64)> {
    let core = v.trim().split(['-', '+']).next()?;
    let mut parts = core.split('.').map(|p| p.parse::<u64>().ok());
    let major = parts.next()??;
    let minor = parts.next().unwrap_or(Some(0))?;
    let patch = parts.next().unwrap_or(Some(0))?;
    Some((major, minor, patch))
}

/// Every parameter at its default, as a module of 2.9.0 or later shows them.
pub fn defaults() -> Values {
    PARAMETERS
        .iter()
        .map(|p| (p.name.to_string(), p.default.to_string()))
        .collect()
}

/// The parameter of that name, if tt-kmd has one we know.
pub fn parameter(name: &str) -> Option<&'static Parameter> {
    PARAMETERS.iter().find(|p| p.name == name)
}

/// `spec.moduleParameters`. Each field sets the tt-kmd module parameter
/// named in its description when the installer loads the module; an absent
/// field leaves the module's default (or the host's `options tenstorrent`
/// line, adopted at the hand-over from DKMS). A change is a drained cycle:
/// the module is reloaded at the same version.
#[derive(Deserialize, Serialize, Clone, Debug, Default, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct ModuleParameters {
    /// Module parameter `max_devices` (uint, tt-kmd 1.1 and later; default
    /// 32): the most Tenstorrent devices (chips) the driver supports, 1 to
    /// 1048576 (the driver reserves that many char device minors at load:
    /// 0 would serve no card, more than the kernel's 2^20 minors fails the
    /// load).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 1, max = 1048576))]
    pub max_devices: Option<i64>,
    /// Module parameter `dma_address_bits` (uint, tt-kmd 1.6 and later;
    /// default 0 = automatic): DMA address bits, 0 to 64 (the driver builds
    /// its DMA masks with the kernel's `DMA_BIT_MASK(n)`, defined up to 64).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 0, max = 64))]
    pub dma_address_bits: Option<i64>,
    /// Module parameter `reset_limit` (uint, tt-kmd 1.19 and later; default
    /// 10): the most times a device is reset during boot.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 0, max = 4294967295_i64))]
    pub reset_limit: Option<i64>,
    /// Module parameter `auto_reset_timeout` (byte, 0 to 255, tt-kmd 1.26
    /// and later; default 10): seconds to wait for the M3 auto reset.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 0, max = 255))]
    pub auto_reset_timeout: Option<i64>,
    /// Module parameter `power_policy` (bool, tt-kmd 2.6.0 and later;
    /// default true): low power at probe, re-aggregate on close.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub power_policy: Option<bool>,
    /// Module parameter `idle_power_down_grace_ms` (uint, tt-kmd 2.9.0 and
    /// later; default 5000): milliseconds between the last close of a device
    /// and its idle power-down (0: at close).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 0, max = 4294967295_i64))]
    pub idle_power_down_grace_ms: Option<i64>,
}

impl ModuleParameters {
    /// The values set, by module parameter name, canonical.
    pub fn values(&self) -> Values {
        let uint = |v: Option<i64>| v.map(|n| n.to_string());
        [
            ("auto_reset_timeout", uint(self.auto_reset_timeout)),
            ("dma_address_bits", uint(self.dma_address_bits)),
            (
                "idle_power_down_grace_ms",
                uint(self.idle_power_down_grace_ms),
            ),
            ("max_devices", uint(self.max_devices)),
            ("power_policy", self.power_policy.map(bool_value)),
            ("reset_limit", uint(self.reset_limit)),
        ]
        .into_iter()
        .filter_map(|(k, v)| Some((k.to_string(), v?)))
        .collect()
    }
}

fn bool_value(b: bool) -> String {
    if b { "Y" } else { "N" }.to_string()
}

/// The canonical parameter string: `name=value` sorted by name, separated
/// by one space (what the installer passes to `finit_module`, the
/// `TT_KMD_MODULE_PARAMETERS` variable, the node annotation).
pub fn canonical(values: &Values) -> String {
    values
        .iter()
        .map(|(k, v)| format!("{k}={v}"))
        .collect::<Vec<_>>()
        .join(" ")
}

/// Reads a canonical string (or any `name=value` list separated by
/// whitespace) back; every name must be a known parameter and every value
/// valid for its type ([`normalize`]).
pub fn parse(s: &str) -> Result<Values, String> {
    let mut out = Values::new();
    for token in s.split_whitespace() {
        let Some((name, value)) = token.split_once('=') else {
            return Err(format!("{token:?} is not name=value"));
        };
        out.insert(name.to_string(), normalize(name, value)?);
    }
    Ok(out)
}

/// `value` as the kernel would take it for parameter `name`, in canonical
/// form: numbers in decimal (the kernel reads `0x` hexadecimal and a
/// leading `0` as octal, as `kstrtouint` does), booleans `Y`/`N` (the kernel
/// takes what starts with `y`, `t`, `1` or is `on`, and `n`, `f`, `0`, `off`). Err says why the
/// kernel would refuse it (EINVAL), or that tt-kmd has no such parameter.
pub fn normalize(name: &str, value: &str) -> Result<String, String> {
    let Some(p) = parameter(name) else {
        return Err(format!("tt-kmd has no module parameter {name:?}"));
    };
    normalize_as(p.kind, name, value)
}

/// The `Kind` of a module's `parmtype=<name>:<type>` type: `uint`, `byte`,
/// `bool`; None for any other (an int, a charp, an array).
pub fn kind_of(parmtype: &str) -> Option<Kind> {
    match parmtype.trim() {
        "uint" => Some(Kind::Uint),
        "byte" => Some(Kind::Byte),
        "bool" => Some(Kind::Bool),
        _ => None,
    }
}

/// A parameter this crate does not list (an older release's, such as
/// 2.0.0's `arc_fw_init`), kept for the module's own list to judge: its name
/// a C identifier, its value one plain word. Err says why not.
pub fn raw(name: &str, value: &str) -> Result<String, String> {
    let value = value.trim();
    let ident = !name.is_empty()
        && name.len() <= 64
        && name.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'_')
        && !name.as_bytes()[0].is_ascii_digit();
    if !ident {
        return Err(format!("{name:?} is not a module parameter name"));
    }
    let word = !value.is_empty()
        && value.len() <= 256
        && value
            .bytes()
            .all(|b| b.is_ascii_graphic() && b != b'"' && b != b'\'');
    if !word {
        return Err(format!("{name}={value:?}: not one plain word"));
    }
    Ok(value.to_string())
}

/// [`normalize`] for a parameter of kind `kind` (from the module's own
/// `parmtype`, for names this crate does not list).
pub fn normalize_as(kind: Kind, name: &str, value: &str) -> Result<String, String> {
    let value = value.trim();
    let bad = |what: &str| format!("{name}={value:?}: {what}");
    match kind {
        Kind::Bool => match value.as_bytes() {
            [b'y' | b'Y' | b't' | b'T' | b'1', ..] | [b'o', b'n', ..] => Ok("Y".into()),
            [b'n' | b'N' | b'f' | b'F' | b'0', ..] | [b'o', b'f', ..] => Ok("N".into()),
            _ => Err(bad("not a boolean (Y, N, 1, 0, on, off)")),
        },
        Kind::Uint | Kind::Byte => {
            let max = if kind == Kind::Byte {
                u64::from(u8::MAX)
            } else {
                u64::from(u32::MAX)
            };
            let digits = value.strip_prefix('+').unwrap_or(value);
            let parsed = if let Some(hex) = digits
                .strip_prefix("0x")
                .or_else(|| digits.strip_prefix("0X"))
            {
                u64::from_str_radix(hex, 16)
            } else if digits.len() > 1 && digits.starts_with('0') {
                u64::from_str_radix(&digits[1..], 8)
            } else {
                digits.parse::<u64>()
            };
            match parsed {
                Ok(n) if n <= max => Ok(n.to_string()),
                Ok(_) => Err(bad(&format!("more than {max}"))),
                Err(_) => Err(bad("not an unsigned number")),
            }
        }
    }
}

/// Whether every difference between `wanted` and `in_effect` is a parameter
/// writable at run time ([`Parameter::runtime`]): then the loaded module
/// takes the new values through sysfs, without a reload. False when nothing
/// differs.
pub fn runtime_only(wanted: &Values, in_effect: Option<&Values>) -> bool {
    let off = mismatches(wanted, in_effect);
    !off.is_empty()
        && off
            .iter()
            .all(|m| m.found.is_some() && parameter(&m.name).is_some_and(|p| p.runtime))
}

/// A wanted parameter whose value is not the one in effect.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Mismatch {
    pub name: String,
    pub wanted: String,
    /// What the loaded module shows (None: the parameter is not there, or
    /// nothing was reported).
    pub found: Option<String>,
}

impl fmt::Display for Mismatch {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match &self.found {
            Some(v) => write!(f, "{}={} (wanted {})", self.name, v, self.wanted),
            None => write!(f, "{} not reported (wanted {})", self.name, self.wanted),
        }
    }
}

/// The one definition of "the wanted parameters are in effect": every
/// wanted parameter shows its value in `in_effect` (sysfs values, or the
/// node annotation that reports them), compared after [`normalize`].
/// Parameters not wanted are not compared: they keep the module's default
/// or the host's `options` line. `None` (nothing reported) satisfies only
/// an empty wish. A name this crate does not list (an older release's own
/// parameter, adopted from the host's options as the module declares it) is
/// not compared: nothing reports it, and the kernel refused a bad value at
/// the load.
pub fn mismatches(wanted: &Values, in_effect: Option<&Values>) -> Vec<Mismatch> {
    wanted
        .iter()
        .filter(|(name, _)| parameter(name).is_some())
        .filter_map(|(name, want)| {
            let found = in_effect.and_then(|m| m.get(name));
            let same = found.is_some_and(|f| {
                normalize(name, f).is_ok_and(|f| normalize(name, want).is_ok_and(|w| f == w))
            });
            (!same).then(|| Mismatch {
                name: name.clone(),
                wanted: want.clone(),
                found: found.cloned(),
            })
        })
        .collect()
}

/// Joins mismatches for a message: `max_devices=32 (wanted 4), ...`.
pub fn describe(m: &[Mismatch]) -> String {
    m.iter()
        .map(ToString::to_string)
        .collect::<Vec<_>>()
        .join(", ")
}

#[cfg(test)]
mod tests {
    use super::*;

    fn v(pairs: &[(&str, &str)]) -> Values {
        pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect()
    }

    #[test]
    fn canonical_string_is_sorted_modprobe_syntax_with_y_n() {
        let p = ModuleParameters {
            max_devices: Some(4),
            power_policy: Some(false),
            auto_reset_timeout: Some(255),
            dma_address_bits: Some(0),
            ..Default::default()
        };
        assert_eq!(
            canonical(&p.values()),
            "auto_reset_timeout=255 dma_address_bits=0 max_devices=4 power_policy=N"
        );
        assert_eq!(canonical(&ModuleParameters::default().values()), "");
        assert_eq!(parse(&canonical(&p.values())), Ok(p.values()));
        assert_eq!(parse(""), Ok(Values::new()));
    }

    #[test]
    fn every_parameter_has_a_field_and_the_table_is_sorted() {
        let all = ModuleParameters {
            max_devices: Some(1),
            dma_address_bits: Some(1),
            reset_limit: Some(1),
            auto_reset_timeout: Some(1),
            power_policy: Some(true),
            idle_power_down_grace_ms: Some(1),
        };
        let names: Vec<&str> = PARAMETERS.iter().map(|p| p.name).collect();
        assert_eq!(
            all.values().keys().map(String::as_str).collect::<Vec<_>>(),
            names
        );
        let mut sorted = names.clone();
        sorted.sort();
        assert_eq!(names, sorted);
    }

    #[test]
    fn values_read_as_the_kernel_reads_them() {
        assert_eq!(normalize("max_devices", "0x10"), Ok("16".into()));
        assert_eq!(normalize("max_devices", "010"), Ok("8".into()));
        assert_eq!(normalize("max_devices", "0"), Ok("0".into()));
        assert_eq!(normalize("max_devices", " 4\n"), Ok("4".into()));
        assert_eq!(
            normalize("max_devices", "4294967295"),
            Ok("4294967295".into())
        );
        assert!(normalize("max_devices", "4294967296").is_err());
        assert!(normalize("max_devices", "-1").is_err());
        assert!(normalize("max_devices", "four").is_err());
        assert_eq!(normalize("auto_reset_timeout", "255"), Ok("255".into()));
        assert!(normalize("auto_reset_timeout", "256").is_err());
        for y in ["Y", "y", "1", "on", "yes"] {
            assert_eq!(normalize("power_policy", y), Ok("Y".into()), "{y}");
        }
        for n in ["N", "n", "0", "off"] {
            assert_eq!(normalize("power_policy", n), Ok("N".into()), "{n}");
        }
        assert!(normalize("power_policy", "maybe").is_err());
        assert!(normalize("arc_fw_init", "Y").is_err(), "a 1.x parameter");
        assert!(parse("max_devices").is_err());
        assert!(parse("bogus=1").is_err());
    }

    #[test]
    fn each_parameter_knows_the_release_that_introduced_it() {
        let p = |n| parameter(n).expect("known");
        assert_eq!(
            p("idle_power_down_grace_ms").in_version("2.8.0"),
            Some(false)
        );
        assert_eq!(
            p("idle_power_down_grace_ms").in_version("2.9.0"),
            Some(true)
        );
        assert_eq!(
            p("idle_power_down_grace_ms").in_version("2.10.0"),
            Some(true)
        );
        assert_eq!(p("power_policy").in_version("2.5.0"), Some(false));
        assert_eq!(p("power_policy").in_version("2.6.0-rc1"), Some(true));
        assert_eq!(p("auto_reset_timeout").in_version("1.26"), Some(true));
        assert_eq!(p("auto_reset_timeout").in_version("1.25"), Some(false));
        assert_eq!(p("max_devices").in_version("x"), None);
    }

    #[test]
    fn in_effect_compares_only_what_is_wanted() {
        let sysfs = v(&[
            ("max_devices", "4"),
            ("power_policy", "Y"),
            ("reset_limit", "10"),
        ]);
        assert!(mismatches(&v(&[]), Some(&sysfs)).is_empty());
        assert!(mismatches(&v(&[]), None).is_empty());
        assert!(mismatches(&v(&[("max_devices", "4")]), Some(&sysfs)).is_empty());
        assert!(
            mismatches(&v(&[("max_devices", "0x4")]), Some(&sysfs)).is_empty(),
            "compared after normalizing"
        );
        assert_eq!(
            mismatches(
                &v(&[("max_devices", "8"), ("power_policy", "N")]),
                Some(&sysfs)
            ),
            vec![
                Mismatch {
                    name: "max_devices".into(),
                    wanted: "8".into(),
                    found: Some("4".into())
                },
                Mismatch {
                    name: "power_policy".into(),
                    wanted: "N".into(),
                    found: Some("Y".into())
                },
            ]
        );
        let missing = mismatches(&v(&[("idle_power_down_grace_ms", "0")]), Some(&sysfs));
        assert_eq!(
            describe(&missing),
            "idle_power_down_grace_ms not reported (wanted 0)"
        );
        assert_eq!(mismatches(&v(&[("max_devices", "4")]), None).len(), 1);
    }
}
