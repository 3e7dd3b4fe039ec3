//! What the agent asks of the kernel, behind traits so tests run on a fake
//! host root: loading/unloading the module, and killing device holders.

use std::ffi::CString;
use std::fs::File;
use std::io;

/// For [`KernelOps::load_dependency`] implementations: the flag that makes
/// the kernel decompress a module file itself (Linux 5.17+).
pub const MODULE_INIT_COMPRESSED_FILE: u32 = 4;

/// An `io::Error` for a compressed dependency the kernel cannot decompress.
pub fn compressed_unsupported(name: &str) -> io::Error {
    io::Error::new(
        io::ErrorKind::Unsupported,
        format!(
            "{name} is compressed and this kernel does not decompress modules itself (Linux 5.17+ with CONFIG_MODULE_DECOMPRESS)"
        ),
    )
}

/// Loads and unloads kernel modules.
pub trait KernelOps {
    /// Loads the module from `module`, a descriptor of the very file that
    /// was verified (never its path again, which could change in between),
    /// with the module parameters `parameters` (`name=value ...`, as
    /// modprobe passes its `options`).
    fn load(&self, module: &File, parameters: &str) -> io::Result<()>;
    /// Offers `module` to the kernel while a module of its name is loaded,
    /// to learn whether the kernel trusts its signature: the kernel checks
    /// the signature before anything else and then, the name being taken,
    /// loads nothing (EEXIST). A refusal of the key is EKEYREJECTED (EPERM
    /// under lockdown alone).
    fn probe(&self, module: &File) -> io::Result<()>;
    /// Loads `name`, a module tt-kmd depends on, from `module` (the kernel
    /// decompresses it when `compressed`); EEXIST when already loaded.
    fn load_dependency(&self, name: &str, module: &File, compressed: bool) -> io::Result<()>;
    /// Unloads the module `name`; fails (EWOULDBLOCK/EBUSY) while it is in use.
    fn unload(&self, name: &str) -> io::Result<()>;
}

/// Sends SIGKILL to processes holding the device.
pub trait ProcessKiller {
    fn kill(&self, pid: u32) -> io::Result<()>;
}

/// The real kernel: `finit_module(2)` and `delete_module(2)`.
#[derive(Debug, Default, Clone, Copy)]
pub struct RealKernel;

impl KernelOps for RealKernel {
    fn load(&self, module: &File, parameters: &str) -> io::Result<()> {
        let parameters =
            CString::new(parameters).map_err(|e| io::Error::new(io::ErrorKind::InvalidInput, e))?;
        nix::kmod::finit_module(module, &parameters, nix::kmod::ModuleInitFlags::empty())
            .map_err(io::Error::from)
    }

    fn probe(&self, module: &File) -> io::Result<()> {
        // The same system call: only the module already loaded makes it a
        // probe (the signature is checked before the parameters are read).
        self.load(module, "")
    }

    fn load_dependency(&self, name: &str, module: &File, compressed: bool) -> io::Result<()> {
        let flags = if compressed {
            nix::kmod::ModuleInitFlags::from_bits_retain(MODULE_INIT_COMPRESSED_FILE)
        } else {
            nix::kmod::ModuleInitFlags::empty()
        };
        match nix::kmod::finit_module(module, c"", flags) {
            // A kernel that cannot decompress refuses the flag itself.
            Err(nix::errno::Errno::EINVAL) if compressed => Err(compressed_unsupported(name)),
            r => r.map_err(io::Error::from),
        }
    }

    fn unload(&self, name: &str) -> io::Result<()> {
        let name =
            CString::new(name).map_err(|e| io::Error::new(io::ErrorKind::InvalidInput, e))?;
        // O_NONBLOCK: fail at once while the module is in use, as rmmod does;
        // never O_TRUNC (forced removal of a module in use).
        nix::kmod::delete_module(&name, nix::kmod::DeleteModuleFlags::O_NONBLOCK)
            .map_err(io::Error::from)
    }
}

/// The real `kill(2)`. PIDs are those of the host PID namespace, so the agent
/// pod needs `hostPID: true`.
#[derive(Debug, Default, Clone, Copy)]
pub struct RealKiller;

impl ProcessKiller for RealKiller {
    fn kill(&self, pid: u32) -> io::Result<()> {
        let raw = i32::try_from(pid).map_err(|e| io::Error::new(io::ErrorKind::InvalidInput, e))?;
        match nix::sys::signal::kill(
            nix::unistd::Pid::from_raw(raw),
            nix::sys::signal::Signal::SIGKILL,
        ) {
            Ok(()) | Err(nix::errno::Errno::ESRCH) => Ok(()),
            Err(e) => Err(io::Error::from(e)),
        }
    }
}
