//! The mpqemu wire format (QEMU `include/hw/remote/mpqemu-link.h`, 6.0 and later), as
//! spoken by `x-pci-proxy-dev`: a 16-byte header `{i32 cmd; i32 pad; u64 size}` and
//! `size` bytes of payload, all little-endian.

use std::io::{self, Read, Write};

pub const SYNC_SYSMEM: i32 = 0;
pub const RET: i32 = 1;
pub const PCI_CFGWRITE: i32 = 2;
pub const PCI_CFGREAD: i32 = 3;
pub const BAR_WRITE: i32 = 4;
pub const BAR_READ: i32 = 5;
pub const SET_IRQFD: i32 = 6;
pub const DEVICE_RESET: i32 = 7;

pub const HEADER_LEN: usize = 16;
/// `PciConfDataMsg {u32 addr; u32 val; int len}`.
pub const CONF_LEN: usize = 12;
/// `BarAccessMsg {hwaddr addr; u64 val; unsigned size; bool memory}` (3 bytes padding).
pub const BAR_LEN: usize = 24;
/// The largest payload QEMU sends is SYNC_SYSMEM's (3 × 8 u64); anything far bigger means
/// the stream is out of step.
const MAX_PAYLOAD: u64 = 4096;

/// One message from QEMU.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Request {
    /// Guest RAM memfds (dropped unread: the model does no DMA). No reply.
    SyncSysmem,
    /// INTx eventfds (dropped: the model raises no interrupt). No reply.
    SetIrqfd,
    CfgRead {
        addr: u32,
        len: u32,
    },
    CfgWrite {
        addr: u32,
        val: u32,
        len: u32,
    },
    /// `gpa` is an absolute guest physical address.
    BarRead {
        gpa: u64,
        size: u32,
    },
    BarWrite {
        gpa: u64,
        val: u64,
        size: u32,
    },
    DeviceReset,
    Unknown {
        cmd: i32,
    },
}

fn u32_at(b: &[u8], at: usize) -> u32 {
    let mut w = [0u8; 4];
    w.copy_from_slice(&b[at..at + 4]);
    u32::from_le_bytes(w)
}

fn u64_at(b: &[u8], at: usize) -> u64 {
    let mut w = [0u8; 8];
    w.copy_from_slice(&b[at..at + 8]);
    u64::from_le_bytes(w)
}

fn short(what: &str, got: usize) -> io::Error {
    io::Error::new(
        io::ErrorKind::InvalidData,
        format!("{what} payload of {got} bytes is too short"),
    )
}

/// Decodes one message from its command and payload.
pub fn decode(cmd: i32, payload: &[u8]) -> io::Result<Request> {
    let conf = |p: &[u8]| {
        if p.len() < CONF_LEN {
            return Err(short("PciConfDataMsg", p.len()));
        }
        // len is a C int; QEMU only sends 1, 2 or 4.
        Ok((u32_at(p, 0), u32_at(p, 4), u32_at(p, 8).min(4)))
    };
    let bar = |p: &[u8]| {
        if p.len() < BAR_LEN - 3 {
            return Err(short("BarAccessMsg", p.len()));
        }
        Ok((u64_at(p, 0), u64_at(p, 8), u32_at(p, 16).min(8)))
    };
    Ok(match cmd {
        SYNC_SYSMEM => Request::SyncSysmem,
        SET_IRQFD => Request::SetIrqfd,
        DEVICE_RESET => Request::DeviceReset,
        PCI_CFGREAD => {
            let (addr, _, len) = conf(payload)?;
            Request::CfgRead { addr, len }
        }
        PCI_CFGWRITE => {
            let (addr, val, len) = conf(payload)?;
            Request::CfgWrite { addr, val, len }
        }
        BAR_READ => {
            let (gpa, _, size) = bar(payload)?;
            Request::BarRead { gpa, size }
        }
        BAR_WRITE => {
            let (gpa, val, size) = bar(payload)?;
            Request::BarWrite { gpa, val, size }
        }
        cmd => Request::Unknown { cmd },
    })
}

/// Reads the next message; `None` when QEMU closed its end.
///
/// A plain `read` gets no control buffer, so the kernel closes the SCM_RIGHTS fds that
/// come with SYNC_SYSMEM and SET_IRQFD: nothing leaks.
pub fn read_request(r: &mut impl Read) -> io::Result<Option<Request>> {
    let mut header = [0u8; HEADER_LEN];
    match r.read_exact(&mut header) {
        Err(e) if e.kind() == io::ErrorKind::UnexpectedEof => return Ok(None),
        other => other?,
    }
    let cmd = i32::from_le_bytes([header[0], header[1], header[2], header[3]]);
    let size = u64_at(&header, 8);
    if size > MAX_PAYLOAD {
        return Err(io::Error::new(
            io::ErrorKind::InvalidData,
            format!("command {cmd} with a {size}-byte payload: stream out of step"),
        ));
    }
    let mut payload = vec![0u8; size as usize];
    r.read_exact(&mut payload)?;
    decode(cmd, &payload).map(Some)
}

/// A request message as QEMU would send it (for tests and fakes).
pub fn encode_request(req: &Request) -> Vec<u8> {
    let (cmd, payload): (i32, Vec<u8>) = match *req {
        Request::SyncSysmem => (SYNC_SYSMEM, vec![0; 192]),
        Request::SetIrqfd => (SET_IRQFD, vec![]),
        Request::DeviceReset => (DEVICE_RESET, vec![]),
        Request::CfgRead { addr, len } => (PCI_CFGREAD, conf_payload(addr, 0, len)),
        Request::CfgWrite { addr, val, len } => (PCI_CFGWRITE, conf_payload(addr, val, len)),
        Request::BarRead { gpa, size } => (BAR_READ, bar_payload(gpa, 0, size)),
        Request::BarWrite { gpa, val, size } => (BAR_WRITE, bar_payload(gpa, val, size)),
        Request::Unknown { cmd } => (cmd, vec![]),
    };
    let mut msg = header(cmd, payload.len() as u64).to_vec();
    msg.extend_from_slice(&payload);
    msg
}

fn header(cmd: i32, size: u64) -> [u8; HEADER_LEN] {
    let mut h = [0u8; HEADER_LEN];
    h[..4].copy_from_slice(&cmd.to_le_bytes());
    h[8..].copy_from_slice(&size.to_le_bytes());
    h
}

fn conf_payload(addr: u32, val: u32, len: u32) -> Vec<u8> {
    [addr, val, len]
        .iter()
        .flat_map(|w| w.to_le_bytes())
        .collect()
}

fn bar_payload(gpa: u64, val: u64, size: u32) -> Vec<u8> {
    let mut p = Vec::with_capacity(BAR_LEN);
    p.extend_from_slice(&gpa.to_le_bytes());
    p.extend_from_slice(&val.to_le_bytes());
    p.extend_from_slice(&size.to_le_bytes());
    p.extend_from_slice(&[1, 0, 0, 0]); // memory = true
    p
}

/// The `RET` message carrying `val`: QEMU's answer to every request that awaits one.
pub fn encode_ret(val: u64) -> [u8; HEADER_LEN + 8] {
    let mut m = [0u8; HEADER_LEN + 8];
    m[..HEADER_LEN].copy_from_slice(&header(RET, 8));
    m[HEADER_LEN..].copy_from_slice(&val.to_le_bytes());
    m
}

/// Reads one `RET` reply (the fake QEMU side in tests); its value.
pub fn read_ret(r: &mut impl Read) -> io::Result<u64> {
    let mut m = [0u8; HEADER_LEN + 8];
    r.read_exact(&mut m)?;
    let cmd = i32::from_le_bytes([m[0], m[1], m[2], m[3]]);
    if cmd != RET || u64_at(&m, 8) != 8 {
        return Err(io::Error::new(
            io::ErrorKind::InvalidData,
            format!("expected RET with 8 bytes, got command {cmd}"),
        ));
    }
    Ok(u64_at(&m, HEADER_LEN))
}

pub fn write_ret(w: &mut impl Write, val: u64) -> io::Result<()> {
    w.write_all(&encode_ret(val))
}
