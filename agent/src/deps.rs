//! The modules tt-kmd needs loaded first. `finit_module(2)` resolves no
//! dependencies (modprobe does that from `modules.dep`): a `tenstorrent.ko`
//! whose `depends:` names a module that is neither loaded nor built in fails
//! with "Unknown symbol" (on a kernel with `CONFIG_HWMON=m`, hwmon). Before
//! the swap, the agent works out from the host's
//! `/lib/modules/<kver>/modules.dep` what to load and in which order
//! ([`plan`], pure), so a missing one fails the node before anything is
//! unloaded; right before the module's own load it loads them ([`load`]).
//! Dependencies are never unloaded again, as with modprobe.

use std::collections::{HashMap, HashSet};
use std::os::unix::fs::FileExt;
use std::path::Path;

use crate::error::{AgentError, Result};
use crate::host::HostRoot;
use crate::kernel::KernelOps;
// Public here too, where dependency loading is described (they live in
// `kernel`, which implements the loads, so `kernel` needs nothing of `deps`).
pub use crate::kernel::{MODULE_INIT_COMPRESSED_FILE, compressed_unsupported};
use crate::modinfo;

/// The most of `modules.dep` or `modules.builtin` read (a distribution
/// kernel's are under 1 MiB).
pub const MODULES_INDEX_MAX: u64 = 32 << 20;

/// A module to load before tt-kmd.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Dependency {
    /// Module name (`_` for `-`, as the kernel names it in /sys/module).
    pub name: String,
    /// Host path of its file.
    pub path: String,
    /// Compressed (`.ko.xz`, `.ko.zst`, `.ko.gz`): the kernel decompresses it.
    pub compressed: bool,
}

/// The kernel's name for a module file or a `depends:` entry:
/// `kernel/lib/crc-itu-t.ko.xz` → `crc_itu_t`.
pub fn module_name(file_or_name: &str) -> String {
    let base = file_or_name.rsplit('/').next().unwrap_or(file_or_name);
    let base = [".ko.xz", ".ko.zst", ".ko.gz", ".ko"]
        .iter()
        .find_map(|ext| base.strip_suffix(ext))
        .unwrap_or(base);
    base.replace('-', "_")
}

/// `modules.dep`: module name → (its file, the files it depends on, in
/// modprobe's order: the last is loaded first).
pub fn parse_modules_dep(text: &str) -> HashMap<String, (String, Vec<String>)> {
    text.lines()
        .filter_map(|l| l.split_once(':'))
        .map(|(file, deps)| {
            let deps = deps.split_whitespace().map(str::to_string).collect();
            (module_name(file), (file.trim().to_string(), deps))
        })
        .collect()
}

/// The `depends:` of a module's `.modinfo`, as names.
pub fn parse_depends(field: Option<&str>) -> Vec<String> {
    field
        .unwrap_or("")
        .split(',')
        .map(str::trim)
        .filter(|d| !d.is_empty())
        .map(module_name)
        .collect()
}

/// What to load, in order, so that every name in `depends` is present:
/// each one's own dependencies first, none that `present` (loaded or built
/// in) already, none twice. `tree` is the host path of
/// `/lib/modules/<kver>`, to which `modules.dep`'s relative paths are
/// relative. Err names the first dependency found nowhere.
pub fn plan(
    depends: &[String],
    index: &HashMap<String, (String, Vec<String>)>,
    tree: &str,
    present: &dyn Fn(&str) -> bool,
) -> std::result::Result<Vec<Dependency>, String> {
    fn visit(
        name: &str,
        index: &HashMap<String, (String, Vec<String>)>,
        tree: &str,
        present: &dyn Fn(&str) -> bool,
        seen: &mut HashSet<String>,
        out: &mut Vec<Dependency>,
    ) -> std::result::Result<(), String> {
        if present(name) || !seen.insert(name.to_string()) {
            return Ok(());
        }
        let (file, deps) = index.get(name).ok_or_else(|| name.to_string())?;
        // modules.dep lists the deepest dependency last.
        for d in deps.iter().rev() {
            visit(&module_name(d), index, tree, present, seen, out)?;
        }
        let path = if file.starts_with('/') {
            file.clone()
        } else {
            format!("{}/{file}", tree.trim_end_matches('/'))
        };
        out.push(Dependency {
            name: name.to_string(),
            compressed: !file.ends_with(".ko"),
            path,
        });
        Ok(())
    }
    let mut seen = HashSet::new();
    let mut out = vec![];
    for d in depends {
        visit(d, index, tree, present, &mut seen, &mut out)?;
    }
    Ok(out)
}

/// The whole `.modinfo` of an open module file, read without moving its
/// offset (the same descriptor is what `finit_module` loads).
fn depends_of_file(module: &std::fs::File, path: &Path) -> Result<Vec<String>> {
    let len = module
        .metadata()
        .map_err(|source| AgentError::io("inspecting", path, source))?
        .len();
    let mut bytes = vec![0u8; usize::try_from(len).unwrap_or(0)];
    module
        .read_exact_at(&mut bytes, 0)
        .map_err(|source| AgentError::io("reading", path, source))?;
    let field =
        modinfo::field_of_bytes(&bytes, "depends").map_err(|reason| AgentError::ModInfo {
            path: path.to_path_buf(),
            reason,
        })?;
    Ok(parse_depends(field.as_deref()))
}

/// Is `name` loaded or built in (a built-in module with parameters also
/// shows in /sys/module; `modules.builtin` lists every one).
fn present_fn(root: &HostRoot, builtin: HashSet<String>) -> impl Fn(&str) -> bool + '_ {
    move |name: &str| builtin.contains(name) || root.path(format!("/sys/module/{name}")).is_dir()
}

/// The dependencies `module` needs loaded, in load order (empty when it
/// names none or all are there). Fails, naming the module and where it was
/// looked for, when one is nowhere.
pub fn resolve(
    root: &HostRoot,
    kver: &str,
    module: &std::fs::File,
    path: &Path,
) -> Result<Vec<Dependency>> {
    let depends = depends_of_file(module, path)?;
    if depends.is_empty() {
        return Ok(vec![]);
    }
    let tree = root.modules_tree(kver);
    let read = |name: &str| -> Result<String> {
        // No tree at all reads as empty: the missing dependency is named.
        let bytes = match root.dir(&tree, false) {
            Ok(d) => d.read_optional(name, MODULES_INDEX_MAX)?,
            Err(e) if e.is_not_found() => None,
            Err(e) => return Err(e.into()),
        };
        Ok(String::from_utf8_lossy(&bytes.unwrap_or_default()).into_owned())
    };
    let index = parse_modules_dep(&read("modules.dep")?);
    let builtin: HashSet<String> = read("modules.builtin")?.lines().map(module_name).collect();
    let present = present_fn(root, builtin);
    plan(&depends, &index, &tree, &present).map_err(|missing| AgentError::DependencyMissing {
        dependency: missing,
        needed_by: depends.join(","),
        kver: kver.to_string(),
        tree: tree.clone(),
    })
}

/// Loads each of `deps` not loaded meanwhile, in order.
pub fn load(root: &HostRoot, kernel: &dyn KernelOps, deps: &[Dependency]) -> Result<()> {
    for d in deps {
        if root.path(format!("/sys/module/{}", d.name)).is_dir() {
            continue;
        }
        let (dir, file) = d.path.rsplit_once('/').unwrap_or(("/", d.path.as_str()));
        let f = root.dir(dir, false).and_then(|dir| dir.open_file(file))?;
        tracing::info!(module = %d.name, path = %d.path, "loading a dependency of tenstorrent");
        match kernel.load_dependency(&d.name, &f, d.compressed) {
            Ok(()) => {}
            Err(e) if e.raw_os_error() == Some(nix::errno::Errno::EEXIST as i32) => {}
            Err(source) => {
                return Err(AgentError::DependencyLoad {
                    dependency: d.name.clone(),
                    path: d.path.clone(),
                    source,
                });
            }
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    const DEP: &str = "kernel/lib/crc7.ko:\n\
kernel/drivers/hwmon/hwmon.ko.xz: kernel/lib/crc-itu-t.ko\n\
kernel/lib/crc-itu-t.ko:\n\
kernel/drivers/a.ko: kernel/drivers/b.ko kernel/drivers/c.ko\n\
kernel/drivers/b.ko: kernel/drivers/c.ko\n\
kernel/drivers/c.ko:\n";

    fn names(p: &[Dependency]) -> Vec<&str> {
        p.iter().map(|d| d.name.as_str()).collect()
    }

    #[test]
    fn names_follow_the_kernel() {
        assert_eq!(module_name("kernel/lib/crc-itu-t.ko.xz"), "crc_itu_t");
        assert_eq!(module_name("hwmon"), "hwmon");
        assert_eq!(module_name("/x/y/crc7.ko"), "crc7");
        assert_eq!(
            parse_depends(Some("crc7, crc-itu-t,,")),
            vec!["crc7", "crc_itu_t"]
        );
        assert!(parse_depends(Some("")).is_empty());
        assert!(parse_depends(None).is_empty());
    }

    #[test]
    fn dependencies_load_deepest_first_and_once() {
        let index = parse_modules_dep(DEP);
        let p = plan(&["a".into(), "b".into()], &index, "/lib/modules/k", &|_| {
            false
        })
        .expect("plan");
        assert_eq!(names(&p), vec!["c", "b", "a"]);
        assert_eq!(p[2].path, "/lib/modules/k/kernel/drivers/a.ko");
        assert!(!p[2].compressed);
    }

    #[test]
    fn present_modules_are_skipped_and_compression_is_noted() {
        let index = parse_modules_dep(DEP);
        let p = plan(&["hwmon".into()], &index, "/usr/lib/modules/k/", &|n| {
            n == "crc_itu_t"
        })
        .expect("plan");
        assert_eq!(names(&p), vec!["hwmon"]);
        assert!(p[0].compressed);
        assert_eq!(
            p[0].path,
            "/usr/lib/modules/k/kernel/drivers/hwmon/hwmon.ko.xz"
        );
        let none = plan(&["crc7".into()], &index, "/t", &|n| n == "crc7").expect("plan");
        assert!(none.is_empty());
    }

    #[test]
    fn a_dependency_found_nowhere_is_named() {
        let index = parse_modules_dep(DEP);
        assert_eq!(
            plan(&["crc7".into(), "nope".into()], &index, "/t", &|_| false),
            Err("nope".to_string())
        );
    }
}
