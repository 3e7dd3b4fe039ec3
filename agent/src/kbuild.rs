//! Debian's kernel header trees reach their build helpers through links into
//! `/usr/lib/linux-kbuild-<major.minor>` (`scripts/`, `tools/`), and the
//! arch-specific tree includes the `-common` tree by absolute path. The pod
//! mounts the host's `/usr/src` at the same path but sees the host's `/usr/lib`
//! only under the host root, so those links would dangle inside the pod and the
//! build would fail on Debian hosts. Linking each host kbuild tree into the
//! agent's own `/usr/lib` makes them resolve as on the host.

use std::path::{Path, PathBuf};

use crate::error::{AgentError, Result};
use crate::host::HostRoot;

/// Links every `<host root>/usr/lib/linux-kbuild-*` into `into` (the agent's
/// own `/usr/lib`) unless something of that name is already there. Returns the
/// links created. Nothing to do when the host has no kbuild trees.
pub fn link_host_kbuild(root: &HostRoot, into: &Path) -> Result<Vec<PathBuf>> {
    let host_lib = root.path("/usr/lib");
    let entries = match std::fs::read_dir(&host_lib) {
        Ok(e) => e,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(vec![]),
        Err(e) => return Err(AgentError::io("listing", host_lib, e)),
    };
    let mut made = Vec::new();
    for entry in entries {
        let entry = entry.map_err(|e| AgentError::io("listing", &host_lib, e))?;
        let name = entry.file_name();
        if !name.to_string_lossy().starts_with("linux-kbuild-") {
            continue;
        }
        // A link on the host (to /etc, say) is not a kbuild tree: never
        // expose what it points to.
        if !entry.file_type().is_ok_and(|t| t.is_dir()) {
            tracing::warn!(path = %entry.path().display(), "not a directory (a link?); not linking it for the build");
            continue;
        }
        let link = into.join(&name);
        if link.symlink_metadata().is_ok() {
            continue;
        }
        std::os::unix::fs::symlink(entry.path(), &link)
            .map_err(|e| AgentError::io("linking the host's kbuild tree at", &link, e))?;
        made.push(link);
    }
    Ok(made)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn host_kbuild_trees_become_visible_and_dangling_header_links_resolve() {
        let host = tempfile::tempdir().expect("tempdir");
        let own_lib = tempfile::tempdir().expect("tempdir");
        let kbuild = host.path().join("usr/lib/linux-kbuild-6.1/scripts");
        std::fs::create_dir_all(&kbuild).expect("mkdir");
        std::fs::write(kbuild.join("Makefile.build"), "# kbuild\n").expect("write");
        std::fs::create_dir_all(host.path().join("usr/lib/x86_64-linux-gnu")).expect("mkdir");
        // As in Debian's -common header tree, seen through the pod's /usr/src
        // mount: a relative link that climbs to <own lib>/linux-kbuild-6.1.
        let headers = own_lib.path().join("src/linux-headers-6.1.0-common");
        std::fs::create_dir_all(&headers).expect("mkdir");
        std::os::unix::fs::symlink("../../linux-kbuild-6.1/scripts", headers.join("scripts"))
            .expect("symlink");
        assert!(
            !headers.join("scripts/Makefile.build").exists(),
            "dangles before"
        );

        let root = HostRoot::new(host.path());
        let made = link_host_kbuild(&root, own_lib.path()).expect("links");
        assert_eq!(made, [own_lib.path().join("linux-kbuild-6.1")]);
        assert!(
            headers.join("scripts/Makefile.build").exists(),
            "resolves after"
        );
        // Idempotent, and never replaces what the image already has.
        assert!(
            link_host_kbuild(&root, own_lib.path())
                .expect("again")
                .is_empty()
        );
    }

    #[test]
    fn no_kbuild_trees_on_the_host_is_fine() {
        let host = tempfile::tempdir().expect("tempdir");
        let own_lib = tempfile::tempdir().expect("tempdir");
        let root = HostRoot::new(host.path());
        assert!(
            link_host_kbuild(&root, own_lib.path())
                .expect("ok")
                .is_empty()
        );
    }
}
