//! Firmware bundles (`fw_pack-<version>.fwbundle`): a tar whose
//! `./manifest.json` names the bundle's `version`, as tt-flash reads it.
//! The simulated host reads the version from there and its `fetch` writes
//! such a bundle; uncompressed tar only (the simulation's own bundles).

use serde_json::Value;

const BLOCK: usize = 512;

/// Checks that the file at `path` has the SHA-256 `want` (hex, any case).
pub fn check_sha256(path: &std::path::Path, want: &str) -> Result<(), String> {
    use sha2::{Digest, Sha256};
    use std::io::Read;
    let mut f = std::fs::File::open(path)
        .map_err(|e| format!("cannot read the bundle {}: {e}", path.display()))?;
    let mut h = Sha256::new();
    let mut buf = vec![0u8; 64 * 1024];
    loop {
        let n = f
            .read(&mut buf)
            .map_err(|e| format!("cannot read the bundle {}: {e}", path.display()))?;
        if n == 0 {
            break;
        }
        h.update(&buf[..n]);
    }
    let got: String = h.finalize().iter().map(|b| format!("{b:02x}")).collect();
    if got.eq_ignore_ascii_case(want.trim()) {
        Ok(())
    } else {
        Err(format!(
            "the downloaded bundle's SHA-256 is {got}, not spec.bundleSHA256 {want}: refused, nothing was flashed"
        ))
    }
}

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
    fn a_bundle_is_checked_against_its_sha256() {
        let dir = tempfile::tempdir().expect("tmp");
        let path = dir.path().join("b.fwbundle");
        std::fs::write(&path, b"abc").expect("write");
        // sha256("abc")
        let abc = "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad";
        assert_eq!(check_sha256(&path, abc), Ok(()));
        assert_eq!(check_sha256(&path, &abc.to_uppercase()), Ok(()));
        let wrong = "0".repeat(64);
        let e = check_sha256(&path, &wrong).expect_err("a wrong sum");
        assert!(e.contains(abc) && e.contains(&wrong), "{e}");
        assert!(check_sha256(&dir.path().join("missing"), abc).is_err());
    }

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
