//! Firmware bundles (`fw_pack-<version>.fwbundle`): a tar whose
//! `./manifest.json` names the bundle's `version`, as tt-flash reads it.
//! The simulated host reads the version from there and its `fetch` writes
//! such a bundle; uncompressed tar only (the simulation's own bundles).

use serde_json::Value;

const BLOCK: usize = 512;

fn field(bytes: &[u8]) -> &[u8] {
    let end = bytes.iter().position(|b| *b == 0).unwrap_or(bytes.len());
    &bytes[..end]
}

fn octal(bytes: &[u8]) -> Option<usize> {
    let s = std::str::from_utf8(field(bytes)).ok()?.trim();
    usize::from_str_radix(s, 8).ok()
}

/// The `version` of `manifest.json` in a tar, if it is one that has it.
pub fn manifest_version(tar: &[u8]) -> Option<String> {
    let mut at = 0;
    while at + BLOCK <= tar.len() {
        let h = &tar[at..at + BLOCK];
        if h.iter().all(|b| *b == 0) {
            return None;
        }
        let name = String::from_utf8_lossy(field(&h[..100])).into_owned();
        let size = octal(&h[124..136])?;
        let data = at + BLOCK;
        if name.trim_start_matches("./") == "manifest.json" {
            let body = tar.get(data..data.checked_add(size)?)?;
            let manifest: Value = serde_json::from_slice(body).ok()?;
            return manifest
                .get("version")
                .and_then(Value::as_str)
                .map(str::to_string);
        }
        at = data + size.div_ceil(BLOCK) * BLOCK;
    }
    None
}

/// A tar holding only `./manifest.json` with this `version`.
pub fn with_manifest(version: &str) -> Vec<u8> {
    let body = serde_json::json!({ "version": version }).to_string();
    let mut h = [0u8; BLOCK];
    let put = |h: &mut [u8; BLOCK], at: usize, s: &str| {
        h[at..at + s.len()].copy_from_slice(s.as_bytes());
    };
    put(&mut h, 0, "./manifest.json");
    put(&mut h, 100, "0000644");
    put(&mut h, 108, "0000000");
    put(&mut h, 116, "0000000");
    put(&mut h, 124, &format!("{:011o}", body.len()));
    put(&mut h, 136, "00000000000");
    put(&mut h, 148, "        ");
    h[156] = b'0';
    put(&mut h, 257, "ustar");
    put(&mut h, 263, "00");
    let sum: u32 = h.iter().map(|b| u32::from(*b)).sum();
    put(&mut h, 148, &format!("{sum:06o}\0 "));
    let mut out = h.to_vec();
    out.extend_from_slice(body.as_bytes());
    out.resize(BLOCK + body.len().div_ceil(BLOCK) * BLOCK + 2 * BLOCK, 0);
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn round_trip() {
        let tar = with_manifest("19.8.0");
        assert_eq!(tar.len() % BLOCK, 0);
        assert_eq!(manifest_version(&tar).as_deref(), Some("19.8.0"));
    }

    #[test]
    fn not_a_bundle() {
        assert_eq!(manifest_version(b"not a tar"), None);
        assert_eq!(manifest_version(&[0u8; 1024]), None);
        let mut cut = with_manifest("19.8.0");
        cut.truncate(BLOCK + 4);
        assert_eq!(manifest_version(&cut), None);
    }

    #[test]
    fn system_tar_reads_our_bundle() {
        // tar(1) must accept what the simulation writes (GNU tar is on the
        // build machines; skip where it is not).
        let dir = tempfile::tempdir().expect("tempdir");
        let p = dir.path().join("b.fwbundle");
        std::fs::write(&p, with_manifest("1.2.3")).expect("write");
        let Ok(out) = std::process::Command::new("tar")
            .arg("-xOf")
            .arg(&p)
            .arg("./manifest.json")
            .output()
        else {
            return;
        };
        assert!(out.status.success(), "{out:?}");
        assert_eq!(
            String::from_utf8_lossy(&out.stdout),
            r#"{"version":"1.2.3"}"#
        );
    }
}
