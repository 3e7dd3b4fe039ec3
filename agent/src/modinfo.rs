//! Reads `key=value` entries of a kernel module's `.modinfo` ELF section,
//! which is what `modinfo -F version` prints. Only 64-bit little-endian ELF
//! (x86_64, aarch64) is supported; anything else is reported as unreadable.

use std::path::Path;

use crate::error::{AgentError, Result};

/// Value of `field` in the module's `.modinfo` section, if present.
pub fn modinfo_field(ko: &Path, field: &str) -> Result<Option<String>> {
    let bytes = std::fs::read(ko).map_err(|e| AgentError::ModInfo {
        path: ko.to_path_buf(),
        reason: e.to_string(),
    })?;
    let section = modinfo_section(&bytes).map_err(|reason| AgentError::ModInfo {
        path: ko.to_path_buf(),
        reason,
    })?;
    Ok(field_in(section, field))
}

/// Value of `field` in the `.modinfo` section of a module's bytes; Err says
/// why the bytes are no module.
pub fn field_of_bytes(bytes: &[u8], field: &str) -> std::result::Result<Option<String>, String> {
    Ok(field_in(modinfo_section(bytes)?, field))
}

/// The first word of a `vermagic` value: the kernel release the module was
/// built for (the rest are build flags such as `SMP mod_unload`).
pub fn vermagic_release(vermagic: &str) -> &str {
    vermagic.split_whitespace().next().unwrap_or("")
}

/// The module's version (`MODULE_VERSION`), if it has one.
pub fn module_version(ko: &Path) -> Result<Option<String>> {
    modinfo_field(ko, "version")
}

/// The module parameters a module declares: the names of its `parmtype=`
/// entries (every `module_param` has one) and `parm=` entries (its
/// description), what `modinfo` prints as `parm:`.
pub fn declared_parameters(
    bytes: &[u8],
) -> std::result::Result<std::collections::BTreeSet<String>, String> {
    let section = modinfo_section(bytes)?;
    Ok(section
        .split(|b| *b == 0)
        .filter_map(|entry| {
            let rest = entry
                .strip_prefix(b"parmtype=")
                .or_else(|| entry.strip_prefix(b"parm="))?;
            let name = rest.split(|b| *b == b':').next()?;
            (!name.is_empty()).then(|| String::from_utf8_lossy(name).into_owned())
        })
        .collect())
}

/// The type of each parameter a module declares with `parmtype=<name>:<type>`
/// (`uint`, `bool`, `byte`, ...).
pub fn parameter_types(
    bytes: &[u8],
) -> std::result::Result<std::collections::BTreeMap<String, String>, String> {
    let section = modinfo_section(bytes)?;
    Ok(section
        .split(|b| *b == 0)
        .filter_map(|entry| {
            let rest = String::from_utf8_lossy(entry.strip_prefix(b"parmtype=")?).into_owned();
            let (name, kind) = rest.split_once(':')?;
            (!name.is_empty()).then(|| (name.to_string(), kind.trim().to_string()))
        })
        .collect())
}

fn field_in(section: &[u8], field: &str) -> Option<String> {
    let prefix = format!("{field}=");
    section
        .split(|b| *b == 0)
        .find_map(|entry| entry.strip_prefix(prefix.as_bytes()))
        .map(|v| String::from_utf8_lossy(v).trim().to_string())
}

// Offsets come from the file (which may be corrupt): every sum is checked, so a
// header pointing near the top of the address space is "truncated", not a panic.
fn u16_at(b: &[u8], off: usize) -> Option<u16> {
    Some(u16::from_le_bytes(
        b.get(off..off.checked_add(2)?)?.try_into().ok()?,
    ))
}
fn u32_at(b: &[u8], off: usize) -> Option<u32> {
    Some(u32::from_le_bytes(
        b.get(off..off.checked_add(4)?)?.try_into().ok()?,
    ))
}
fn u64_at(b: &[u8], off: usize) -> Option<u64> {
    Some(u64::from_le_bytes(
        b.get(off..off.checked_add(8)?)?.try_into().ok()?,
    ))
}

/// Locates the `.modinfo` section's bytes.
fn modinfo_section(b: &[u8]) -> std::result::Result<&[u8], String> {
    if b.get(0..4) != Some(b"\x7fELF".as_slice()) {
        return Err("not an ELF file".into());
    }
    if b.get(4) != Some(&2) || b.get(5) != Some(&1) {
        return Err("not a 64-bit little-endian ELF file".into());
    }
    let truncated = || "truncated ELF header".to_string();
    let shoff =
        usize::try_from(u64_at(b, 0x28).ok_or_else(truncated)?).map_err(|e| e.to_string())?;
    let shentsize = usize::from(u16_at(b, 0x3A).ok_or_else(truncated)?);
    let shnum = usize::from(u16_at(b, 0x3C).ok_or_else(truncated)?);
    let shstrndx = usize::from(u16_at(b, 0x3E).ok_or_else(truncated)?);
    if shentsize < 64 || shstrndx >= shnum {
        return Err("malformed section header table".into());
    }
    let header = |i: usize| -> std::result::Result<(u32, &[u8]), String> {
        let base = i
            .checked_mul(shentsize)
            .and_then(|o| o.checked_add(shoff))
            .ok_or("section header offset overflows")?;
        let name = u32_at(b, base).ok_or("truncated section header")?;
        let field = |at: usize| base.checked_add(at).and_then(|o| u64_at(b, o));
        let off = field(24).ok_or("truncated section header")?;
        let size = field(32).ok_or("truncated section header")?;
        let start = usize::try_from(off).map_err(|e| e.to_string())?;
        let end = start
            .checked_add(usize::try_from(size).map_err(|e| e.to_string())?)
            .ok_or("section size overflows")?;
        let data = b.get(start..end).ok_or("section lies outside the file")?;
        Ok((name, data))
    };
    let (_, strtab) = header(shstrndx)?;
    for i in 0..shnum {
        let (name_off, data) = header(i)?;
        let name = strtab
            .get(name_off as usize..)
            .and_then(|s| s.split(|c| *c == 0).next())
            .unwrap_or_default();
        if name == b".modinfo" {
            return Ok(data);
        }
    }
    Err("no .modinfo section (not a kernel module?)".into())
}

/// Builds a minimal ELF64 file whose `.modinfo` section holds `entries`
/// (`key=value`). Used by the fakes and tests in place of a compiled module.
#[cfg(any(test, feature = "fake"))]
pub fn fake_module_bytes(entries: &[&str]) -> Vec<u8> {
    let mut modinfo = Vec::new();
    for e in entries {
        modinfo.extend_from_slice(e.as_bytes());
        modinfo.push(0);
    }
    let shstrtab: &[u8] = b"\0.modinfo\0.shstrtab\0";
    let mut out = vec![0u8; 64];
    out[0..4].copy_from_slice(b"\x7fELF");
    out[4] = 2; // 64-bit
    out[5] = 1; // little endian
    out[6] = 1; // version
    out[16..18].copy_from_slice(&1u16.to_le_bytes()); // ET_REL
    out[18..20].copy_from_slice(&62u16.to_le_bytes()); // x86_64
    let modinfo_off = out.len();
    out.extend_from_slice(&modinfo);
    let shstr_off = out.len();
    out.extend_from_slice(shstrtab);
    while !out.len().is_multiple_of(8) {
        out.push(0);
    }
    let shoff = out.len();
    // null section, .modinfo, .shstrtab
    let sections: [(u32, u32, usize, usize); 3] = [
        (0, 0, 0, 0),
        (1, 1, modinfo_off, modinfo.len()),
        (10, 3, shstr_off, shstrtab.len()),
    ];
    for (name, ty, off, size) in sections {
        let mut sh = [0u8; 64];
        sh[0..4].copy_from_slice(&name.to_le_bytes());
        sh[4..8].copy_from_slice(&ty.to_le_bytes());
        sh[24..32].copy_from_slice(&(off as u64).to_le_bytes());
        sh[32..40].copy_from_slice(&(size as u64).to_le_bytes());
        out.extend_from_slice(&sh);
    }
    out[0x28..0x30].copy_from_slice(&(shoff as u64).to_le_bytes());
    out[0x34..0x36].copy_from_slice(&64u16.to_le_bytes()); // ehsize
    out[0x3A..0x3C].copy_from_slice(&64u16.to_le_bytes()); // shentsize
    out[0x3C..0x3E].copy_from_slice(&3u16.to_le_bytes()); // shnum
    out[0x3E..0x40].copy_from_slice(&2u16.to_le_bytes()); // shstrndx
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_version_from_fake_module() {
        let bytes = fake_module_bytes(&["srcversion=ABC", "version=2.8.0", "name=tenstorrent"]);
        let section = modinfo_section(&bytes).expect("section");
        assert_eq!(field_in(section, "version").as_deref(), Some("2.8.0"));
        assert_eq!(field_in(section, "name").as_deref(), Some("tenstorrent"));
        assert_eq!(field_in(section, "license"), None);
    }

    #[test]
    fn declared_parameters_are_the_parm_and_parmtype_entries() {
        let bytes = fake_module_bytes(&[
            "version=2.10.0",
            "parm=max_devices:Maximum number of tenstorrent devices (chips) to support.",
            "parmtype=max_devices:uint",
            "parmtype=power_policy:bool",
            "parm=idle_power_down_grace_ms:Delay in ms",
            "depends=",
        ]);
        let names: Vec<String> = declared_parameters(&bytes)
            .expect("module")
            .into_iter()
            .collect();
        assert_eq!(
            names,
            ["idle_power_down_grace_ms", "max_devices", "power_policy"]
        );
        assert!(declared_parameters(b"nope").is_err());
    }

    #[test]
    fn rejects_garbage() {
        assert!(modinfo_section(b"hello").is_err());
        let mut bytes = fake_module_bytes(&["version=1.0.0"]);
        bytes.truncate(100);
        assert!(modinfo_section(&bytes).is_err());
    }
}
