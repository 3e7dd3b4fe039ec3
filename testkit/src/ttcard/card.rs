//! One emulated card: config space, BARs over sparse memory, and the few firmware
//! reactions tt-kmd waits for. Every decision is a method on [`Card`] taking the time
//! since the model started, so it is testable without sockets or sleeping.

use std::collections::HashMap;
use std::fmt;
use std::time::Duration;

use super::protocol::Request;

pub const VENDOR: u16 = 0x1E52;
/// Config offsets of the control registers (see the module doc): the kernel never
/// touches them, as the card has no capabilities.
pub const CONTROL_FAULTS: u32 = 0xF0;
pub const CONTROL_REARM: u32 = 0xF4;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    Wormhole,
    Blackhole,
}

impl Kind {
    pub fn parse(s: &str) -> Option<Kind> {
        match s {
            "wh" | "wormhole" => Some(Kind::Wormhole),
            "bh" | "blackhole" => Some(Kind::Blackhole),
            _ => None,
        }
    }

    /// Short name, PCI device id, subsystem id, and board type (telemetry BOARD_ID):
    /// n300 and p150a. Never subsystem 0x0035/0x0047, which turn on Galaxy ordinals.
    fn ids(self) -> (&'static str, u16, u16, u32) {
        match self {
            Kind::Wormhole => ("wh", 0x401E, 0x0014, 0x14),
            Kind::Blackhole => ("bh", 0xB140, 0x0040, 0x40),
        }
    }

    pub fn device_id(self) -> u16 {
        self.ids().1
    }

    /// PCI revision ID.
    fn revision(self) -> u32 {
        match self {
            Kind::Wormhole => 0x01,
            Kind::Blackhole => 0x00,
        }
    }
}

/// The faults switched on, as the bits of the control register at [`CONTROL_FAULTS`].
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct Faults(pub u32);

impl Faults {
    pub const VANISH: u32 = 1 << 0;
    pub const ARC_HUNG: u32 = 1 << 1;
    pub const NOPROBE: u32 = 1 << 2;
    pub const FW_NEVER_READY: u32 = 1 << 3;
    pub const ALL: u32 = 0xF;
    const NAMES: [(u32, &'static str); 4] = [
        (Self::VANISH, "vanish"),
        (Self::ARC_HUNG, "arc-hung"),
        (Self::NOPROBE, "noprobe"),
        (Self::FW_NEVER_READY, "fw-never-ready"),
    ];

    pub fn has(self, bit: u32) -> bool {
        self.0 & bit != 0
    }

    pub fn bit_named(name: &str) -> Option<u32> {
        Self::NAMES
            .iter()
            .find(|(_, n)| *n == name)
            .map(|(b, _)| *b)
    }
}

impl fmt::Display for Faults {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let on: Vec<&str> = Self::NAMES
            .iter()
            .filter(|(b, _)| self.has(*b))
            .map(|(_, n)| *n)
            .collect();
        if on.is_empty() {
            f.write_str("none")
        } else {
            f.write_str(&on.join(","))
        }
    }
}

#[derive(Debug, Clone)]
pub struct CardConfig {
    /// Ordinal in `--cards`; also the low half of the card's ASIC_ID.
    pub index: u32,
    pub kind: Kind,
    /// Wormhole BAR0 in MiB (a power of two): tt-kmd itself never touches it.
    pub wh_bar0_mb: u32,
    pub faults: Faults,
    /// Delay from the first MMIO access until the firmware publishes telemetry.
    pub fw_delay: Duration,
}

impl CardConfig {
    pub fn new(index: u32, kind: Kind) -> Self {
        CardConfig {
            index,
            kind,
            wh_bar0_mb: 512,
            faults: Faults::default(),
            fw_delay: Duration::ZERO,
        }
    }
}

/// An address space of the card: a BAR's own storage, or a NOC tile (Blackhole).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
enum Space {
    Bar(u8),
    Noc(u8, u8),
}

/// Sparse little-endian memory; what was never written reads 0.
#[derive(Default)]
struct Memory {
    pages: HashMap<(Space, u64), Box<[u8; 4096]>>,
}

impl Memory {
    fn read(&self, space: Space, addr: u64, size: u32) -> u64 {
        (0..u64::from(size)).fold(0, |v, i| {
            let a = addr.wrapping_add(i);
            let byte = self
                .pages
                .get(&(space, a >> 12))
                .map_or(0, |p| p[(a & 0xFFF) as usize]);
            v | u64::from(byte) << (8 * i)
        })
    }

    fn write(&mut self, space: Space, addr: u64, size: u32, val: u64) {
        for i in 0..u64::from(size) {
            let a = addr.wrapping_add(i);
            let page = self
                .pages
                .entry((space, a >> 12))
                .or_insert_with(|| Box::new([0; 4096]));
            page[(a & 0xFFF) as usize] = (val >> (8 * i)) as u8;
        }
    }
}

// Firmware data in the ARC CSM (0x10000000..0x1007FFFF), the same layout on both chips.
const CSM_BASE: u64 = 0x1000_0000;
pub const TELEM_TABLE: u64 = CSM_BASE + 0x7_0000;
pub const TELEM_DATA: u64 = CSM_BASE + 0x7_1000;
/// 2.8.0 Wormhole hwmon struct, the reply to legacy message 0x2C.
const LEGACY_TELEM: u64 = CSM_BASE + 0x7_2000;
const QUEUE_CB: u64 = CSM_BASE + 0x7_3000;
const QUEUE_BASE: u64 = CSM_BASE + 0x7_4000;
const QUEUE_ENTRIES: u64 = 4;

// Wormhole BAR4 is the system-register window at SoC 0x1E000000.
const WH_RESET_UNIT: u64 = 0x1FF3_0000 - 0x1E00_0000;
const WH_CSM: u64 = 0x1FE8_0000 - 0x1E00_0000;
const WH_TELEM_TABLE_PTR: u64 = WH_RESET_UNIT + 0x1D0;
const WH_TELEM_DATA_PTR: u64 = WH_RESET_UNIT + 0x1D4;
const WH_QCB_PTR: u64 = WH_RESET_UNIT + 0x1D8;
const WH_POST_CODE_RUNNING: u32 = 0xC0DE_0000;
const WH_MSG_PRESENT: u64 = 0xAA00;
const WH_MSG_GET_TELEMETRY_OFFSET: u64 = 0x2C;

const fn wh_scratch(n: u64) -> u64 {
    WH_RESET_UNIT + 0x60 + 4 * n
}

// Blackhole BAR0: 2 MiB TLB windows onto the NOC, their registers, and NOC2AXI.
const BH_TLB_REGS: u64 = 0x1FC0_0000;
const BH_NOC2AXI_NOC_ID: u64 = 0x1FD0_0000 + 0x4044;
const BH_WINDOWS: u64 = 202;
const BH_WINDOW_SHIFT: u64 = 21;
const BH_ARC: Space = Space::Noc(8, 0);

const fn bh_scratch(n: u64) -> u64 {
    0x8003_0400 + 4 * n
}

/// Every telemetry tag tt-kmd 2.8 to 2.10 reads, with its value, sorted by tag. Tags
/// 1/2 and 61/62 stay adjacent: 2.8.0 Blackhole reads hi at an address and lo at +4.
pub fn telemetry(index: u32, kind: Kind) -> Vec<(u16, u32)> {
    let card_type = kind.ids().3;
    vec![
        (1, card_type << 4),          // BOARD_ID hi: card type in bits 4..19
        (2, 0x1000_0000 + index),     // BOARD_ID lo
        (6, 850),                     // VCORE mV
        (7, 25),                      // POWER W
        (8, 30),                      // CURRENT A
        (9, (900 << 16) | 700),       // VDD_LIMITS max<<16 | min
        (11, 45 << 16),               // ASIC_TEMP 16.16
        (14, 1000),                   // AICLK
        (15, 900),                    // AXICLK
        (16, 540),                    // ARCCLK
        (24, (6 << 16) | (14 << 12)), // ETH FW 6.14.0
        (26, 0x0509_0000),
        (27, 0x0102_0000),
        (28, 0x5011_0000),
        (29, 0x021E_0000),
        (32, 12345), // heartbeat
        (41, 1800),  // fan rpm
        (55, 100),
        (56, 90),
        (58, 0x0302_0000),
        (60, 0),
        (61, ASIC_ID_HI), // ASIC_ID hi
        (62, index),      // ASIC_ID lo: tt_asic_id differs per card
        (64, 150),
    ]
}

/// The high word of every emulated card's ASIC id (telemetry tag 61); the low
/// word (tag 62) is the card's index.
pub const ASIC_ID_HI: u32 = 0x5A17_C0DE;

/// `tt_asic_id` as tt-kmd prints card `index`'s (tags 61 and 62, "%08X%08X"):
/// what its udev rule names the by-id link after.
pub fn tt_asic_id(index: u32) -> String {
    format!("{ASIC_ID_HI:08X}{index:08X}")
}

fn all_ones(size: u32) -> u64 {
    if size >= 8 {
        u64::MAX
    } else {
        (1u64 << (8 * size)) - 1
    }
}

pub struct Card {
    index: u32,
    kind: Kind,
    wh_bar0: u32,
    cfg: [u8; 256],
    /// Each BAR's size as of its last register write: QEMU and the guest only see a new
    /// size (noprobe) once they size the BAR again, so decoding follows that.
    decode: [u32; 6],
    mem: Memory,
    faults: Faults,
    rearm_secs: u32,
    fw_delay: Duration,
    /// When the telemetry pointers appear; `None` until the first MMIO access.
    publish_at: Option<Duration>,
    pub cfg_accesses: u64,
    pub mmio_accesses: u64,
    /// Firmware messages answered: `0xb7` (legacy, Wormhole) or `q:0xc0` (queue).
    pub messages: Vec<String>,
    events: Vec<String>,
}

impl Card {
    pub fn new(config: CardConfig) -> Card {
        let kind = config.kind;
        let mut card = Card {
            index: config.index,
            kind,
            wh_bar0: config.wh_bar0_mb.saturating_mul(1 << 20),
            cfg: [0; 256],
            decode: [0; 6],
            mem: Memory::default(),
            faults: config.faults,
            rearm_secs: 0,
            fw_delay: config.fw_delay,
            publish_at: None,
            cfg_accesses: 0,
            mmio_accesses: 0,
            messages: vec![],
            events: vec![],
        };
        card.cfg[0..2].copy_from_slice(&VENDOR.to_le_bytes());
        card.cfg[2..4].copy_from_slice(&kind.device_id().to_le_bytes());
        // Processing accelerator; the revision as the silicon reports it: Wormhole B0
        // is 0x01 (tt-umd refuses another), Blackhole 0x00. tt-kmd never reads it.
        card.cfg[8..12].copy_from_slice(&((0x12_0000u32 << 8) | kind.revision()).to_le_bytes());
        card.cfg[0x2C..0x2E].copy_from_slice(&VENDOR.to_le_bytes());
        card.cfg[0x2E..0x30].copy_from_slice(&kind.ids().2.to_le_bytes());
        for bar in 0..6 {
            card.decode[bar] = card.bar_size(bar);
        }
        card.init_firmware_data();
        card
    }

    pub fn name(&self) -> String {
        let (short, device, ..) = self.kind.ids();
        format!("card{} ({short} {device:04x})", self.index)
    }

    /// The line written to the log when QEMU goes away.
    pub fn summary(&self) -> String {
        format!(
            "{}: {} config accesses, {} MMIO accesses, firmware messages: {}",
            self.name(),
            self.cfg_accesses,
            self.mmio_accesses,
            self.messages.join(" ")
        )
    }

    /// Log lines (fault changes, oddities) since the last call.
    pub fn take_events(&mut self) -> Vec<String> {
        std::mem::take(&mut self.events)
    }

    /// Answers one request; `None` for the messages QEMU expects no reply to.
    pub fn handle(&mut self, req: &Request, now: Duration) -> Option<u64> {
        match *req {
            Request::SyncSysmem | Request::SetIrqfd => None,
            Request::CfgRead { addr, len } => {
                self.cfg_accesses += 1;
                Some(u64::from(self.cfg_read(addr, len)))
            }
            Request::CfgWrite { addr, val, len } => {
                self.cfg_accesses += 1;
                self.cfg_write(addr, val, len, now);
                Some(0)
            }
            Request::BarRead { gpa, size } => Some(self.bar_read(gpa, size, now)),
            Request::BarWrite { gpa, val, size } => {
                self.bar_write(gpa, val, size, now);
                Some(0)
            }
            Request::DeviceReset => Some(0),
            Request::Unknown { cmd } => {
                self.events
                    .push(format!("unknown command {cmd}, not answered"));
                None
            }
        }
    }

    // --- config space ---

    /// BAR sizes: all 32-bit memory BARs, as QEMU's proxy sizes one dword per slot.
    fn bar_size(&self, bar: usize) -> u32 {
        let noprobe = self.faults.has(Faults::NOPROBE);
        match (self.kind, bar) {
            (Kind::Wormhole, 0) => self.wh_bar0,
            (_, 2) => 1 << 20,
            // tt-kmd maps all of BAR4 (the system registers); without it init_device fails.
            (Kind::Wormhole, 4) if noprobe => 0,
            (Kind::Wormhole, 4) => 32 << 20,
            // tt-kmd maps BAR0 up to 0x1FE00000: 256 MiB fails the probe.
            (Kind::Blackhole, 0) if noprobe => 256 << 20,
            (Kind::Blackhole, 0) => 512 << 20,
            _ => 0,
        }
    }

    fn control_bytes(&self) -> [u8; 8] {
        let mut c = [0; 8];
        c[..4].copy_from_slice(&self.faults.0.to_le_bytes());
        c[4..].copy_from_slice(&self.rearm_secs.to_le_bytes());
        c
    }

    pub fn cfg_read(&self, addr: u32, len: u32) -> u32 {
        let control = self.control_bytes();
        (0..len.min(4)).fold(0, |v, i| {
            let a = addr.saturating_add(i);
            let byte = match a {
                0xF0..=0xF7 => control[(a - CONTROL_FAULTS) as usize],
                _ if self.faults.has(Faults::VANISH) => 0xFF,
                0..=0xFF => self.cfg[a as usize],
                _ => 0,
            };
            v | u32::from(byte) << (8 * i)
        })
    }

    pub fn cfg_write(&mut self, addr: u32, val: u32, len: u32, now: Duration) {
        let mut control = self.control_bytes();
        let (mut faults_written, mut rearm_written) = (false, false);
        let vanished = self.faults.has(Faults::VANISH);
        for i in 0..len.min(4) {
            let a = addr.saturating_add(i);
            let byte = (val >> (8 * i)) as u8;
            match a {
                0xF0..=0xF7 => {
                    control[(a - CONTROL_FAULTS) as usize] = byte;
                    faults_written |= a < CONTROL_REARM;
                    rearm_written |= a >= CONTROL_REARM;
                }
                _ if vanished => {}
                0x10..=0x27 => {
                    let bar = ((a - 0x10) / 4) as usize;
                    let size = self.bar_size(bar);
                    let mask = if size == 0 { 0 } else { !(size - 1) & !0xF };
                    self.cfg[a as usize] = byte & (mask >> (8 * ((a - 0x10) % 4))) as u8;
                    self.decode[bar] = size;
                }
                // command, cache line, latency timer, interrupt line
                0x04 | 0x05 | 0x0C | 0x0D | 0x3C => self.cfg[a as usize] = byte,
                _ => {}
            }
        }
        let word = |b: &[u8]| u32::from_le_bytes([b[0], b[1], b[2], b[3]]);
        if faults_written {
            let new = Faults(word(&control[..4]) & Faults::ALL);
            self.events
                .push(format!("faults {new} (were {})", self.faults));
            self.faults = new;
        }
        if rearm_written {
            self.rearm(word(&control[4..]), now);
        }
    }

    /// Withdraws the telemetry pointers now and publishes them `secs` later.
    fn rearm(&mut self, secs: u32, now: Duration) {
        self.rearm_secs = secs;
        self.publish_at = Some(now.saturating_add(Duration::from_secs(secs.into())));
        self.events.push(format!(
            "firmware re-armed: telemetry pointers withdrawn, published again in {secs} s"
        ));
    }

    // --- BARs ---

    fn bar_of(&self, gpa: u64) -> Option<(u8, u64)> {
        (0..6u8).find_map(|bar| {
            let size = u64::from(self.decode[usize::from(bar)]);
            let at = 0x10 + 4 * usize::from(bar);
            let reg = self.cfg[at..at + 4]
                .iter()
                .rev()
                .fold(0, |v, b| v << 8 | u64::from(*b));
            let base = reg & !0xF;
            (size != 0 && base != 0 && (base..base + size).contains(&gpa))
                .then(|| (bar, gpa - base))
        })
    }

    /// A BAR offset to the space and address it reaches: Blackhole's BAR0 windows go
    /// through their TLB registers to a NOC tile.
    fn translate(&self, bar: u8, off: u64) -> (Space, u64) {
        if self.kind == Kind::Blackhole && bar == 0 && off < BH_WINDOWS << BH_WINDOW_SHIFT {
            let regs = BH_TLB_REGS + 12 * (off >> BH_WINDOW_SHIFT);
            let lo = self.mem.read(Space::Bar(0), regs, 8);
            let hi = self.mem.read(Space::Bar(0), regs + 8, 4);
            let v = u128::from(lo) | u128::from(hi) << 64;
            let addr = ((v & ((1 << 43) - 1)) as u64) << BH_WINDOW_SHIFT;
            let (x, y) = (((v >> 43) & 0x3F) as u8, ((v >> 49) & 0x3F) as u8);
            return (
                Space::Noc(x, y),
                addr | (off & ((1 << BH_WINDOW_SHIFT) - 1)),
            );
        }
        (Space::Bar(bar), off)
    }

    fn is_arc(&self, space: Space) -> bool {
        match self.kind {
            Kind::Wormhole => space == Space::Bar(4),
            Kind::Blackhole => space == BH_ARC,
        }
    }

    fn on_mmio(&mut self, now: Duration) {
        self.mmio_accesses += 1;
        if self.publish_at.is_none() {
            self.publish_at = Some(now.saturating_add(self.fw_delay));
        }
    }

    fn fw_ready(&self) -> bool {
        !self.faults.has(Faults::FW_NEVER_READY)
    }

    fn published(&self, now: Duration) -> bool {
        self.fw_ready() && self.publish_at.is_some_and(|at| now >= at)
    }

    /// Registers the firmware owns, computed on each read so faults and re-arming
    /// take effect at once.
    fn firmware_registers(&self, space: Space, now: Duration) -> Vec<(u64, u32)> {
        let ptr = |p: u64| if self.published(now) { p as u32 } else { 0 };
        let post_code = if self.fw_ready() {
            WH_POST_CODE_RUNNING
        } else {
            0
        };
        match self.kind {
            Kind::Wormhole if space == Space::Bar(4) => vec![
                (wh_scratch(0), post_code),
                (WH_TELEM_TABLE_PTR, ptr(TELEM_TABLE)),
                (WH_TELEM_DATA_PTR, ptr(TELEM_DATA)),
            ],
            Kind::Blackhole if space == BH_ARC => vec![
                (bh_scratch(2), u32::from(self.fw_ready())), // boot status: ready for messages
                (bh_scratch(12), ptr(TELEM_DATA)),
                (bh_scratch(13), ptr(TELEM_TABLE)),
            ],
            _ => vec![],
        }
    }

    pub fn bar_read(&mut self, gpa: u64, size: u32, now: Duration) -> u64 {
        self.on_mmio(now);
        let size = size.min(8);
        let Some((bar, off)) = self
            .bar_of(gpa)
            .filter(|_| !self.faults.has(Faults::VANISH))
        else {
            return all_ones(size);
        };
        let (space, addr) = self.translate(bar, off);
        if self.faults.has(Faults::ARC_HUNG) && self.is_arc(space) {
            return all_ones(size);
        }
        let mut v = self.mem.read(space, addr, size);
        for (reg, val) in self.firmware_registers(space, now) {
            for i in 0..4u64 {
                if let Some(pos) = (reg + i).checked_sub(addr).filter(|p| *p < u64::from(size)) {
                    v = v & !(0xFF << (8 * pos)) | u64::from((val >> (8 * i)) as u8) << (8 * pos);
                }
            }
        }
        v
    }

    pub fn bar_write(&mut self, gpa: u64, val: u64, size: u32, now: Duration) {
        self.on_mmio(now);
        let Some((bar, off)) = self
            .bar_of(gpa)
            .filter(|_| !self.faults.has(Faults::VANISH))
        else {
            return;
        };
        let (space, addr) = self.translate(bar, off);
        self.mem.write(space, addr, size.min(8), val);
        // A hung or never-started ARC answers nothing.
        if self.fw_ready() && !self.faults.has(Faults::ARC_HUNG) {
            self.after_write(space, addr);
        }
    }

    // --- firmware ---

    fn csm(&self, addr: u64) -> (Space, u64) {
        match self.kind {
            Kind::Wormhole => (Space::Bar(4), WH_CSM + addr - CSM_BASE),
            Kind::Blackhole => (BH_ARC, addr),
        }
    }

    fn csm_read(&self, addr: u64) -> u64 {
        let (space, a) = self.csm(addr);
        self.mem.read(space, a, 4)
    }

    fn csm_write(&mut self, addr: u64, val: u64) {
        let (space, a) = self.csm(addr);
        self.mem.write(space, a, 4, val);
    }

    fn init_firmware_data(&mut self) {
        let tags = telemetry(self.index, self.kind);
        self.csm_write(TELEM_TABLE, 0x0001_0000); // version 1.0.0
        self.csm_write(TELEM_TABLE + 4, tags.len() as u64);
        for (i, (tag, val)) in (0u64..).zip(tags) {
            self.csm_write(TELEM_TABLE + 8 + 4 * i, u64::from(tag) | i << 16);
            self.csm_write(TELEM_DATA + 4 * i, val.into());
        }
        self.csm_write(QUEUE_CB + 4, QUEUE_ENTRIES);
        match self.kind {
            Kind::Wormhole => {
                let hwmon = [
                    (0x70, 850),
                    (0x74, 45 * 16),
                    (0x80, (150 << 16) | 25),
                    (0x84, (100 << 16) | 30),
                    (0x88, 900 << 16),
                    (0x8C, 90),
                ];
                for (off, v) in hwmon {
                    self.csm_write(LEGACY_TELEM + off, v);
                }
                // Wormhole's control block holds the queue's offset from the CSM base.
                self.csm_write(QUEUE_CB, QUEUE_BASE - CSM_BASE);
                self.mem.write(Space::Bar(4), WH_QCB_PTR, 4, QUEUE_CB);
            }
            Kind::Blackhole => {
                self.csm_write(QUEUE_CB, QUEUE_BASE);
                self.mem.write(BH_ARC, bh_scratch(11), 4, QUEUE_CB);
                self.mem.write(Space::Bar(0), BH_NOC2AXI_NOC_ID, 4, 2); // PCIe at NOC x=2
            }
        }
    }

    fn after_write(&mut self, space: Space, addr: u64) {
        if self.kind == Kind::Wormhole && space == Space::Bar(4) && addr == wh_scratch(5) {
            let v = self.mem.read(space, addr, 4);
            if v & 0xFF00 == WH_MSG_PRESENT {
                let msg = v & 0xFF;
                self.messages.push(format!("{msg:#x}"));
                if msg == WH_MSG_GET_TELEMETRY_OFFSET {
                    self.mem.write(space, wh_scratch(3), 4, LEGACY_TELEM);
                }
                // The id alone: done, exit code 0 in bits 16..31.
                self.mem.write(space, addr, 4, msg);
            }
        } else if (space, addr) == self.csm(QUEUE_BASE) {
            self.serve_queue();
        }
    }

    /// Answers every pending queue request with success (a zeroed response).
    fn serve_queue(&mut self) {
        let (n, base) = (QUEUE_ENTRIES, QUEUE_BASE);
        let wrap = 2 * n;
        let req_w = self.csm_read(base);
        let mut req_r = self.csm_read(base + 0x10);
        for _ in 0..wrap {
            if req_w.wrapping_sub(req_r).is_multiple_of(wrap) {
                break;
            }
            let header = self.csm_read(base + 32 + (req_r % n) * 32);
            self.messages.push(format!("q:{:#x}", header & 0xFF));
            let res_w = self.csm_read(base + 0x14);
            let response = base + 32 + n * 32 + (res_w % n) * 32;
            for i in 0..8 {
                self.csm_write(response + 4 * i, 0);
            }
            self.csm_write(base + 0x14, (res_w + 1) % wrap);
            req_r = (req_r + 1) % wrap;
            self.csm_write(base + 0x10, req_r);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const MIB: u32 = 1 << 20;
    /// Where the tests put the BARs (each aligned to its size).
    const BASES: [(u8, u32); 3] = [(0, 0xC000_0000), (2, 0xE000_0000), (4, 0xE200_0000)];
    const BH_KERNEL_TLB: u64 = 201;
    const T0: Duration = Duration::from_secs(100);

    fn card(index: u32, kind: Kind) -> Card {
        Card::new(CardConfig::new(index, kind))
    }

    fn cfg32(c: &mut Card, addr: u32) -> u32 {
        let v = c
            .handle(&Request::CfgRead { addr, len: 4 }, T0)
            .expect("reply");
        u32::try_from(v).expect("32 bits")
    }

    fn set_cfg32(c: &mut Card, addr: u32, val: u32, now: Duration) {
        let req = Request::CfgWrite { addr, val, len: 4 };
        assert_eq!(c.handle(&req, now), Some(0));
    }

    /// What the kernel learns sizing a BAR: write all ones, read back the mask.
    fn sized(c: &mut Card, bar: u32) -> u32 {
        let reg = 0x10 + 4 * bar;
        set_cfg32(c, reg, 0xFFFF_FFFF, T0);
        let mask = cfg32(c, reg) & !0xF;
        if mask == 0 {
            0
        } else {
            (!mask).wrapping_add(1)
        }
    }

    fn program_bars(c: &mut Card) {
        for (bar, base) in BASES {
            set_cfg32(c, 0x10 + 4 * u32::from(bar), base, T0);
        }
    }

    fn gpa(bar: u8, off: u64) -> u64 {
        let base = BASES.iter().find(|(b, _)| *b == bar).expect("bar").1;
        u64::from(base) + off
    }

    fn rd(c: &mut Card, bar: u8, off: u64, now: Duration) -> u64 {
        c.bar_read(gpa(bar, off), 4, now)
    }

    fn wr(c: &mut Card, bar: u8, off: u64, val: u64, now: Duration) {
        c.bar_write(gpa(bar, off), val, 4, now);
    }

    /// Points Blackhole TLB `window` at NOC (x, y) around `addr`, as tt-kmd programs its
    /// 12-byte registers; the BAR0 offset that reaches `addr`.
    fn bh_window(c: &mut Card, window: u64, (x, y): (u64, u64), addr: u64) -> u64 {
        let v = u128::from(addr >> 21) | u128::from(x) << 43 | u128::from(y) << 49;
        let regs = BH_TLB_REGS + 12 * window;
        for i in 0..3 {
            wr(c, 0, regs + 4 * i, (v >> (32 * i)) as u64 & 0xFFFF_FFFF, T0);
        }
        (window << 21) + (addr & 0x1F_FFFF)
    }

    fn noc_rd(c: &mut Card, x: u64, y: u64, addr: u64, now: Duration) -> u64 {
        let off = bh_window(c, BH_KERNEL_TLB, (x, y), addr);
        rd(c, 0, off, now)
    }

    fn noc_wr(c: &mut Card, x: u64, y: u64, addr: u64, val: u64) {
        let off = bh_window(c, BH_KERNEL_TLB, (x, y), addr);
        wr(c, 0, off, val, T0);
    }

    /// Reads the ARC CSM the way tt-kmd does on each chip.
    fn csm_rd(c: &mut Card, addr: u64, now: Duration) -> u64 {
        match c.kind {
            Kind::Wormhole => rd(c, 4, WH_CSM + addr - CSM_BASE, now),
            Kind::Blackhole => noc_rd(c, 8, 0, addr, now),
        }
    }

    fn csm_wr(c: &mut Card, addr: u64, val: u64) {
        match c.kind {
            Kind::Wormhole => wr(c, 4, WH_CSM + addr - CSM_BASE, val, T0),
            Kind::Blackhole => noc_wr(c, 8, 0, addr, val),
        }
    }

    fn telemetry_pointers(c: &mut Card, now: Duration) -> (u64, u64) {
        match c.kind {
            Kind::Wormhole => (
                rd(c, 4, WH_TELEM_TABLE_PTR, now),
                rd(c, 4, WH_TELEM_DATA_PTR, now),
            ),
            Kind::Blackhole => (
                noc_rd(c, 8, 0, bh_scratch(13), now),
                noc_rd(c, 8, 0, bh_scratch(12), now),
            ),
        }
    }

    #[test]
    fn tt_asic_id_is_tags_61_and_62_as_tt_kmd_prints_them() {
        assert_eq!(tt_asic_id(0), "5A17C0DE00000000");
        assert_eq!(tt_asic_id(2), "5A17C0DE00000002");
        let tags = telemetry(1, Kind::Wormhole);
        let tag = |t: u16| tags.iter().find(|(id, _)| *id == t).map(|(_, v)| *v);
        assert_eq!(
            format!("{:08X}{:08X}", tag(61).unwrap_or(0), tag(62).unwrap_or(0)),
            tt_asic_id(1)
        );
    }

    #[test]
    fn config_space_identity() {
        for (kind, ids, subsystem, class_rev) in [
            (Kind::Wormhole, 0x401E_1E52, 0x0014_1E52, 0x1200_0001),
            (Kind::Blackhole, 0xB140_1E52, 0x0040_1E52, 0x1200_0000),
        ] {
            let mut c = card(0, kind);
            assert_eq!(cfg32(&mut c, 0x00), ids, "{kind:?}");
            assert_eq!(
                cfg32(&mut c, 0x08),
                class_rev,
                "class 120000, revision ({kind:?})"
            );
            assert_eq!(cfg32(&mut c, 0x2C), subsystem, "{kind:?}");
            assert_eq!(cfg32(&mut c, 0x0C) >> 16 & 0xFF, 0, "header type 0");
            assert_eq!(cfg32(&mut c, 0x34), 0, "no capabilities");
            assert_eq!(cfg32(&mut c, 0x3C) >> 8 & 0xFF, 0, "no INTx pin");
            assert_eq!(
                (cfg32(&mut c, 0xF0), cfg32(&mut c, 0xF4)),
                (0, 0),
                "control registers idle"
            );
            assert_eq!(c.cfg_accesses, 8);
        }
    }

    #[test]
    fn wormhole_bar_sizes() {
        let mut c = card(0, Kind::Wormhole);
        assert_eq!(
            [0, 1, 2, 3, 4, 5].map(|b| sized(&mut c, b)),
            [512 * MIB, 0, MIB, 0, 32 * MIB, 0]
        );
        let mut small = Card::new(CardConfig {
            wh_bar0_mb: 64,
            ..CardConfig::new(1, Kind::Wormhole)
        });
        assert_eq!(sized(&mut small, 0), 64 * MIB);
        // QEMU's probe also sizes slot 6 at 0x28 (CardBus CIS): it must read 0.
        set_cfg32(&mut small, 0x28, 0xFFFF_FFFF, T0);
        assert_eq!(cfg32(&mut small, 0x28), 0);
    }

    #[test]
    fn blackhole_bar_sizes() {
        let mut c = card(0, Kind::Blackhole);
        assert_eq!(
            [0, 1, 2, 3, 4, 5].map(|b| sized(&mut c, b)),
            [512 * MIB, 0, MIB, 0, 0, 0]
        );
    }

    #[test]
    fn noprobe_shrinks_bars_at_the_next_sizing() {
        let faults = Faults(Faults::NOPROBE);
        let mut wh = Card::new(CardConfig {
            faults,
            ..CardConfig::new(0, Kind::Wormhole)
        });
        assert_eq!(sized(&mut wh, 4), 0, "WH without BAR4");
        let mut bh = Card::new(CardConfig {
            faults,
            ..CardConfig::new(0, Kind::Blackhole)
        });
        assert_eq!(sized(&mut bh, 0), 256 * MIB, "BH BAR0 below 0x1FE00000");

        // Switched on at runtime, the BARs already assigned keep decoding until resized.
        let mut c = card(0, Kind::Wormhole);
        program_bars(&mut c);
        set_cfg32(&mut c, CONTROL_FAULTS, Faults::NOPROBE, T0);
        assert_eq!(
            rd(&mut c, 4, wh_scratch(0), T0),
            u64::from(WH_POST_CODE_RUNNING)
        );
        assert_eq!(sized(&mut c, 4), 0);
        assert_eq!(rd(&mut c, 4, wh_scratch(0), T0), 0xFFFF_FFFF, "BAR4 gone");
    }

    #[test]
    fn wormhole_legacy_messages_are_echoed() {
        let mut c = card(0, Kind::Wormhole);
        program_bars(&mut c);
        wr(&mut c, 4, wh_scratch(5), 0xAA00 | 0xB7, T0);
        assert_eq!(rd(&mut c, 4, wh_scratch(5), T0), 0xB7, "done, exit code 0");
        wr(&mut c, 4, wh_scratch(5), 0xAA00 | 0x2C, T0);
        assert_eq!(rd(&mut c, 4, wh_scratch(5), T0), 0x2C);
        assert_eq!(
            rd(&mut c, 4, wh_scratch(3), T0),
            LEGACY_TELEM,
            "telemetry offset"
        );
        assert_eq!(
            csm_rd(&mut c, LEGACY_TELEM + 0x70, T0),
            850,
            "2.8.0 hwmon vcore"
        );
        wr(&mut c, 4, wh_scratch(5), 0x1234, T0);
        assert_eq!(
            rd(&mut c, 4, wh_scratch(5), T0),
            0x1234,
            "not a message: plain storage"
        );
        assert_eq!(c.messages, ["0xb7", "0x2c"]);
    }

    /// Pushes one request with `header` and rings the queue as tt-kmd does.
    fn push_request(c: &mut Card, header: u64) {
        let base = QUEUE_BASE;
        let wptr = csm_rd(c, base, T0);
        csm_wr(c, base + 32 + 4 * 32 + (wptr % 4) * 32, 0xDEAD); // stale response
        csm_wr(c, base + 32 + (wptr % 4) * 32, header);
        csm_wr(c, base, (wptr + 1) % 8);
    }

    #[test]
    fn arc_queue_is_served_on_request_pointer_write() {
        for kind in [Kind::Wormhole, Kind::Blackhole] {
            let mut c = card(0, kind);
            program_bars(&mut c);
            let cb = match kind {
                Kind::Wormhole => rd(&mut c, 4, WH_QCB_PTR, T0),
                Kind::Blackhole => noc_rd(&mut c, 8, 0, bh_scratch(11), T0),
            };
            assert_eq!((csm_rd(&mut c, cb + 4, T0)), QUEUE_ENTRIES, "{kind:?}");
            for (i, header) in [0xC0, 0xA3].into_iter().enumerate() {
                push_request(&mut c, header);
                let i = i as u64;
                assert_eq!(
                    csm_rd(&mut c, QUEUE_BASE + 0x10, T0),
                    i + 1,
                    "REQ_RPTR {kind:?}"
                );
                assert_eq!(
                    csm_rd(&mut c, QUEUE_BASE + 0x14, T0),
                    i + 1,
                    "RES_WPTR {kind:?}"
                );
                let response = QUEUE_BASE + 32 + 4 * 32 + i * 32;
                assert_eq!(csm_rd(&mut c, response, T0), 0, "header 0 = success");
            }
            assert_eq!(c.messages, ["q:0xc0", "q:0xa3"], "{kind:?}");
        }
    }

    #[test]
    fn blackhole_tlb_window_reaches_the_arc_tile() {
        let mut c = card(0, Kind::Blackhole);
        program_bars(&mut c);
        assert_eq!(
            noc_rd(&mut c, 8, 0, bh_scratch(2), T0),
            1,
            "boot status: ready"
        );
        assert_eq!(noc_rd(&mut c, 8, 0, bh_scratch(11), T0), QUEUE_CB);
        assert_eq!(noc_rd(&mut c, 9, 0, bh_scratch(2), T0), 0, "another tile");
        assert_eq!(rd(&mut c, 0, BH_NOC2AXI_NOC_ID, T0), 2, "PCIe NOC x");
        // Window 0 pointed elsewhere reaches the same tile memory as window 201.
        noc_wr(&mut c, 8, 0, 0x1000_0010, 0x77);
        let off = bh_window(&mut c, 0, (8, 0), 0x1000_0010);
        assert_eq!(off, 0x10);
        assert_eq!(rd(&mut c, 0, off, T0), 0x77);
    }

    #[test]
    fn telemetry_table_layout_and_distinct_asic_ids() {
        let mut asic_lo = vec![];
        for (index, kind) in [
            (0, Kind::Wormhole),
            (1, Kind::Wormhole),
            (2, Kind::Blackhole),
        ] {
            let mut c = card(index, kind);
            program_bars(&mut c);
            assert_eq!(telemetry_pointers(&mut c, T0), (TELEM_TABLE, TELEM_DATA));
            assert_eq!(
                csm_rd(&mut c, TELEM_TABLE, T0),
                0x0001_0000,
                "version 1.0.0"
            );
            let count = csm_rd(&mut c, TELEM_TABLE + 4, T0);
            assert_eq!(count, 24);
            let mut tags = vec![];
            for i in 0..count {
                let entry = csm_rd(&mut c, TELEM_TABLE + 8 + 4 * i, T0);
                assert_eq!(entry >> 16, i, "offset of entry {i}");
                let value = csm_rd(&mut c, TELEM_DATA + 4 * i, T0);
                tags.push((entry & 0xFFFF, value));
            }
            assert!(tags.windows(2).all(|w| w[0].0 < w[1].0), "sorted: {tags:?}");
            let at = |tag| tags.iter().position(|(t, _)| *t == tag).expect("tag");
            assert_eq!(at(62), at(61) + 1, "ASIC_ID lo right after hi");
            assert_eq!(at(2), at(1) + 1, "BOARD_ID lo right after hi");
            assert_eq!(tags[at(61)].1, 0x5A17_C0DE);
            asic_lo.push(tags[at(62)].1);
        }
        assert_eq!(asic_lo, [0, 1, 2]);
    }

    #[test]
    fn fw_delay_publishes_pointers_after_the_first_mmio() {
        for kind in [Kind::Wormhole, Kind::Blackhole] {
            let config = CardConfig {
                fw_delay: Duration::from_secs(8),
                ..CardConfig::new(0, kind)
            };
            let mut c = Card::new(config);
            program_bars(&mut c);
            let late = |s: f64| T0 + Duration::from_secs_f64(s);
            assert_eq!(
                telemetry_pointers(&mut c, T0),
                (0, 0),
                "{kind:?} at the first access"
            );
            assert_eq!(telemetry_pointers(&mut c, late(7.9)), (0, 0), "{kind:?}");
            assert_eq!(
                telemetry_pointers(&mut c, late(8.0)),
                (TELEM_TABLE, TELEM_DATA)
            );

            // Re-armed from the guest: withdrawn now, back 5 s later.
            set_cfg32(&mut c, CONTROL_REARM, 5, late(20.0));
            assert_eq!(cfg32(&mut c, CONTROL_REARM), 5);
            assert_eq!(
                telemetry_pointers(&mut c, late(20.0)),
                (0, 0),
                "{kind:?} withdrawn"
            );
            assert_eq!(
                telemetry_pointers(&mut c, late(25.0)),
                (TELEM_TABLE, TELEM_DATA)
            );
            assert!(c.take_events().iter().any(|e| e.contains("re-armed")));
        }
    }

    #[test]
    fn fw_never_ready_reports_no_firmware() {
        let never = Faults(Faults::FW_NEVER_READY);
        let late = T0 * 10;
        let mut wh = Card::new(CardConfig {
            faults: never,
            ..CardConfig::new(0, Kind::Wormhole)
        });
        program_bars(&mut wh);
        assert_ne!(rd(&mut wh, 4, wh_scratch(0), T0) >> 16, 0xC0DE, "POST code");
        assert_eq!(telemetry_pointers(&mut wh, late), (0, 0));
        wr(&mut wh, 4, wh_scratch(5), 0xAA00 | 0xB7, T0);
        assert_eq!(rd(&mut wh, 4, wh_scratch(5), T0), 0xAAB7, "unanswered");

        let mut bh = Card::new(CardConfig {
            faults: never,
            ..CardConfig::new(0, Kind::Blackhole)
        });
        program_bars(&mut bh);
        assert_eq!(
            noc_rd(&mut bh, 8, 0, bh_scratch(2), late) & 1,
            0,
            "boot status"
        );
        assert_eq!(telemetry_pointers(&mut bh, late), (0, 0));

        set_cfg32(&mut bh, CONTROL_FAULTS, 0, late);
        assert_eq!(
            noc_rd(&mut bh, 8, 0, bh_scratch(2), late),
            1,
            "cleared at runtime"
        );
    }

    #[test]
    fn arc_hung_reads_all_ones_from_the_arc() {
        let mut wh = card(0, Kind::Wormhole);
        program_bars(&mut wh);
        set_cfg32(&mut wh, CONTROL_FAULTS, Faults::ARC_HUNG, T0);
        for off in [0, wh_scratch(0), wh_scratch(6), WH_CSM] {
            assert_eq!(rd(&mut wh, 4, off, T0), 0xFFFF_FFFF, "BAR4 {off:#x}");
        }
        assert_eq!(rd(&mut wh, 2, 0x1200, T0), 0, "BAR2 still answers");

        let mut bh = card(0, Kind::Blackhole);
        program_bars(&mut bh);
        set_cfg32(&mut bh, CONTROL_FAULTS, Faults::ARC_HUNG, T0);
        assert_eq!(noc_rd(&mut bh, 8, 0, bh_scratch(2), T0), 0xFFFF_FFFF);
        assert_eq!(
            noc_rd(&mut bh, 8, 0, TELEM_TABLE, T0),
            0xFFFF_FFFF,
            "CSM is on the ARC tile"
        );
        assert_eq!(
            rd(&mut bh, 0, BH_NOC2AXI_NOC_ID, T0),
            2,
            "NOC2AXI still answers"
        );
        assert_eq!(bh.take_events(), ["faults arc-hung (were none)"]);
    }

    #[test]
    fn vanished_card_reads_all_ones_but_keeps_its_control_register() {
        let mut c = card(0, Kind::Wormhole);
        program_bars(&mut c);
        wr(&mut c, 2, 0x1200, 0x55, T0);
        set_cfg32(
            &mut c,
            CONTROL_FAULTS,
            Faults::VANISH | Faults::ARC_HUNG,
            T0,
        );
        assert_eq!(cfg32(&mut c, 0x00), 0xFFFF_FFFF, "vendor/device");
        assert_eq!(
            cfg32(&mut c, 0xF0),
            Faults::VANISH | Faults::ARC_HUNG,
            "control readable"
        );
        assert_eq!(rd(&mut c, 2, 0x1200, T0), 0xFFFF_FFFF);
        let wide = Request::BarRead {
            gpa: gpa(2, 0x1200),
            size: 8,
        };
        assert_eq!(c.handle(&wide, T0), Some(u64::MAX));
        wr(&mut c, 2, 0x1200, 0x66, T0);
        set_cfg32(&mut c, 0x10, 0, T0);

        set_cfg32(&mut c, CONTROL_FAULTS, 0x10, T0);
        assert_eq!(
            cfg32(&mut c, 0xF0),
            0,
            "unknown bits dropped, vanish cleared"
        );
        assert_eq!(cfg32(&mut c, 0x00), 0x401E_1E52, "back on the bus");
        assert_eq!(
            cfg32(&mut c, 0x10),
            0xC000_0000,
            "config write ignored while vanished"
        );
        assert_eq!(
            rd(&mut c, 2, 0x1200, T0),
            0x55,
            "BAR write ignored while vanished"
        );
        assert_eq!(c.take_events().len(), 2, "each fault change logged");
    }
}
