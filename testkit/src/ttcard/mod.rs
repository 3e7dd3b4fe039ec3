//! Emulated Tenstorrent cards (Wormhole 1e52:401e, Blackhole 1e52:b140) for QEMU's
//! `x-pci-proxy-dev`, so that the real, unmodified tt-kmd probes them in a guest.
//!
//! QEMU forwards each proxy device's config-space and BAR accesses over a UNIX socket
//! (the mpqemu protocol, [`protocol`]); this process answers them ([`card`]): config
//! space, BAR sizes, the registers tt-kmd reads, telemetry tables, and the firmware's
//! answers to its messages. The facts behind the model are in `TTCARD.md` of the
//! design notes.
//!
//! ```text
//! ttdrv-ttcard --cards wh,wh,bh [--log FILE] [--wh-bar0-mb 64] [--fault IDX:KIND[=ARG]]... \
//!     -- qemu-system-x86_64 ARGS...
//! ```
//!
//! Each `@TTCARD@` in the QEMU arguments becomes `x-pci-proxy-dev,id=ttN,fd=K` for the
//! next card, N being its ordinal in `--cards`. Guest RAM must be fd-backed
//! (`-machine q35,memory-backend=ram -object memory-backend-memfd,id=ram,size=1G,share=on`)
//! and all BARs are 32-bit, sharing q35's ~1 GiB window: one Blackhole (512 MiB BAR0)
//! plus Wormholes with `--wh-bar0-mb 64` fits. The process exits with QEMU's status
//! (128+signal if it was killed); each card then logs one summary line with its
//! config and MMIO access counts and the firmware messages it answered.
//!
//! # Faults
//!
//! `--fault IDX:KIND[=ARG]` sets a fault on card IDX from the start:
//! - `fw-delay=SECS`: the firmware publishes its telemetry pointers SECS seconds after
//!   the card's first MMIO access (WH: RESET_UNIT+0x1D0/0x1D4 read 0 until then; BH:
//!   ARC scratch 12/13). tt-kmd 2.10.0 adds a Wormhole's `tt_*` attributes later, from
//!   its retry work item; a Blackhole is served without any `tt_*` attribute.
//! - `fw-never-ready`: the WH POST code (SCRATCH0) is not 0xC0DExxxx, the BH boot
//!   status (scratch 2) has bit 0 clear, telemetry is never published, and no firmware
//!   message is answered.
//! - `arc-hung`: reads of the ARC's space return all ones (WH: all of BAR4; BH: the NOC
//!   tile (8,0)); no firmware message is answered.
//! - `vanish`: the card fell off the bus: config and BAR reads return all ones, writes
//!   are ignored. Given at start it also hides the card from QEMU's own probe (every
//!   slot then looks like a 16-byte I/O BAR), so a card that comes back later needs
//!   `vanish` switched on at runtime instead.
//! - `noprobe`: a BAR layout tt-kmd cannot probe: WH has no BAR4 (init_device fails),
//!   BH has a 256 MiB BAR0 (< 0x1FE00000). It takes effect when the BARs are sized
//!   again (boot, or remove + rescan). QEMU sizes its own BAR regions once, when the
//!   proxy device is realized: a noprobe given at start outlives clearing it.
//!
//! # Runtime control from the guest
//!
//! Two config-space dwords the kernel never touches (header type 0, no capabilities),
//! written as root through `/sys/bus/pci/devices/<bdf>/config`:
//! - `0xF0`: the faults, bit 0 vanish, bit 1 arc-hung, bit 2 noprobe, bit 3
//!   fw-never-ready (other bits read back 0).
//! - `0xF4`: writing N re-arms the firmware: the telemetry pointers are withdrawn now
//!   and published again N seconds later (0: at once). Reads return the last N.
//!
//! Both read back their current values and take writes even while the card has
//! vanished. Every change is logged with a timestamp. For example, to make the card at
//! 0000:00:03.0 vanish (0xF0 / 4 = dword 60; only root sees config past 0x40):
//!
//! ```text
//! printf '\001\000\000\000' | dd of=/sys/bus/pci/devices/0000:00:03.0/config bs=4 seek=60 conv=notrunc
//! ```

pub mod card;
pub mod protocol;

use std::fs::File;
use std::io::{self, Write};
use std::os::fd::{AsRawFd, OwnedFd};
use std::os::unix::net::UnixStream;
use std::os::unix::process::ExitStatusExt;
use std::process::{Command, ExitCode};
use std::sync::{Arc, Mutex};
use std::thread;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use anyhow::{Context, bail};

pub use card::{Card, CardConfig, Faults, Kind, tt_asic_id};

/// The placeholder in QEMU's arguments for the next card's proxy device.
pub const PLACEHOLDER: &str = "@TTCARD@";

#[derive(clap::Parser, Debug)]
#[command(
    about = "Emulated Tenstorrent cards for QEMU's x-pci-proxy-dev",
    after_help = "Each @TTCARD@ in the QEMU arguments becomes the next card's proxy device.\n\
                  Fault kinds: fw-delay=SECS, fw-never-ready, arc-hung, vanish, noprobe."
)]
pub struct Cli {
    /// The cards, in ordinal order: `wh` (Wormhole n300) or `bh` (Blackhole p150a).
    #[arg(long, value_delimiter = ',', default_value = "wh")]
    pub cards: Vec<String>,
    /// Where card summaries and fault changes go (default: stderr).
    #[arg(long)]
    pub log: Option<std::path::PathBuf>,
    /// Wormhole BAR0 size in MiB, a power of two (tt-kmd only maps it for user TLBs).
    #[arg(long, default_value_t = 512)]
    pub wh_bar0_mb: u32,
    /// A fault from the start: IDX:KIND[=ARG] (repeatable).
    #[arg(long = "fault")]
    pub faults: Vec<String>,
    /// The QEMU command line.
    #[arg(last = true, required = true)]
    pub qemu: Vec<String>,
}

/// One `--fault IDX:KIND[=ARG]`.
#[derive(Debug, Clone, PartialEq)]
pub struct FaultSpec {
    pub card: usize,
    /// A [`Faults`] bit, or 0 for `fw-delay`.
    pub bit: u32,
    pub fw_delay: Option<Duration>,
}

impl std::str::FromStr for FaultSpec {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, String> {
        let (idx, kind) = s
            .split_once(':')
            .ok_or(format!("{s:?}: expected IDX:KIND[=ARG]"))?;
        let card = idx
            .parse()
            .map_err(|_| format!("{s:?}: bad card index {idx:?}"))?;
        if let Some(secs) = kind.strip_prefix("fw-delay=") {
            let secs: f64 = secs
                .parse()
                .map_err(|_| format!("{s:?}: bad seconds {secs:?}"))?;
            let delay = Duration::try_from_secs_f64(secs).map_err(|e| format!("{s:?}: {e}"))?;
            return Ok(FaultSpec {
                card,
                bit: 0,
                fw_delay: Some(delay),
            });
        }
        let bit = Faults::bit_named(kind).ok_or(format!("{s:?}: unknown fault {kind:?}"))?;
        Ok(FaultSpec {
            card,
            bit,
            fw_delay: None,
        })
    }
}

/// The card configurations `cli` asks for.
pub fn card_configs(cli: &Cli) -> anyhow::Result<Vec<CardConfig>> {
    if !cli.wh_bar0_mb.is_power_of_two() || cli.wh_bar0_mb > 1024 {
        bail!(
            "--wh-bar0-mb {}: not a power of two up to 1024",
            cli.wh_bar0_mb
        );
    }
    let mut configs = vec![];
    for (index, name) in (0u32..).zip(&cli.cards) {
        let kind = Kind::parse(name).with_context(|| format!("--cards: unknown card {name:?}"))?;
        let mut c = CardConfig::new(index, kind);
        c.wh_bar0_mb = cli.wh_bar0_mb;
        configs.push(c);
    }
    for f in &cli.faults {
        let spec: FaultSpec = f.parse().map_err(anyhow::Error::msg)?;
        let n = configs.len();
        let c = configs
            .get_mut(spec.card)
            .with_context(|| format!("--fault {f}: there are {n} cards"))?;
        c.faults.0 |= spec.bit;
        c.fw_delay = spec.fw_delay.unwrap_or(c.fw_delay);
    }
    Ok(configs)
}

/// QEMU's arguments with the placeholders replaced by one proxy device per fd, in order.
pub fn substitute(args: &[String], fds: &[i32]) -> anyhow::Result<Vec<String>> {
    let mut next = 0;
    let mut out = vec![];
    for arg in args {
        let mut pieces = arg.split(PLACEHOLDER);
        let mut s = pieces.next().unwrap_or_default().to_string();
        for piece in pieces {
            let fd = fds
                .get(next)
                .with_context(|| format!("more {PLACEHOLDER} than cards"))?;
            s.push_str(&format!("x-pci-proxy-dev,id=tt{next},fd={fd}{piece}"));
            next += 1;
        }
        out.push(s);
    }
    if next != fds.len() {
        bail!(
            "{} cards but {next} {PLACEHOLDER} in the QEMU arguments",
            fds.len()
        );
    }
    Ok(out)
}

/// The shared log: one line per write, flushed at once.
pub struct Log(Mutex<Box<dyn Write + Send>>);

impl Log {
    pub fn new(w: Box<dyn Write + Send>) -> Log {
        Log(Mutex::new(w))
    }

    pub fn line(&self, line: &str) {
        let mut w = self.0.lock().unwrap_or_else(|e| e.into_inner());
        // A lost log line must not stop the card.
        let _ = writeln!(w, "{line}").and_then(|()| w.flush());
    }

    /// A line prefixed with the wall-clock time (seconds since the epoch).
    pub fn event(&self, line: &str) {
        let t = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .unwrap_or_default();
        self.line(&format!(
            "[{}.{:03}] {line}",
            t.as_secs(),
            t.subsec_millis()
        ));
    }
}

/// Serves `card` on `stream` until QEMU closes it; the card's times count from `start`.
pub fn serve(mut stream: UnixStream, card: &mut Card, start: Instant, log: &Log) -> io::Result<()> {
    loop {
        let Some(req) = protocol::read_request(&mut stream)? else {
            return Ok(());
        };
        let reply = card.handle(&req, start.elapsed());
        for e in card.take_events() {
            log.event(&format!("{}: {e}", card.name()));
        }
        if let Some(val) = reply {
            protocol::write_ret(&mut stream, val)?;
        }
    }
}

/// Runs the cards and QEMU; QEMU's exit code.
pub fn run(cli: &Cli) -> anyhow::Result<i32> {
    let configs = card_configs(cli)?;
    let mut ours = vec![];
    let mut qemu_ends: Vec<OwnedFd> = vec![];
    for _ in &configs {
        let (card_end, qemu_end) = UnixStream::pair().context("socketpair")?;
        ours.push(card_end);
        // dup() gives an fd without FD_CLOEXEC, so QEMU inherits it.
        qemu_ends.push(rustix::io::dup(&qemu_end).context("dup")?);
    }
    let fds: Vec<i32> = qemu_ends.iter().map(|fd| fd.as_raw_fd()).collect();
    let args = substitute(&cli.qemu, &fds)?;
    let (program, rest) = args.split_first().context("no QEMU command")?;
    let log = Arc::new(Log::new(match &cli.log {
        Some(p) => Box::new(File::create(p).with_context(|| format!("creating {}", p.display()))?),
        None => Box::new(io::stderr()),
    }));

    let start = Instant::now();
    let mut threads = vec![];
    for (config, stream) in configs.into_iter().zip(ours) {
        let delay = config.fw_delay.as_secs_f64();
        let mut card = Card::new(config.clone());
        log.event(&format!(
            "{}: faults {}, fw-delay {delay}s",
            card.name(),
            config.faults
        ));
        let log = Arc::clone(&log);
        threads.push(thread::spawn(move || {
            if let Err(e) = serve(stream, &mut card, start, &log) {
                log.event(&format!("{}: socket: {e}", card.name()));
            }
            log.line(&card.summary());
        }));
    }
    let spawned = Command::new(program).args(rest).spawn();
    // Our copies go, so a card sees EOF when QEMU exits (or never started).
    drop(qemu_ends);
    let status = spawned
        .with_context(|| format!("starting {program}"))?
        .wait()
        .context("waiting for QEMU")?;
    // The summaries, written once each card has seen EOF.
    let deadline = Instant::now() + Duration::from_secs(5);
    while threads.iter().any(|t| !t.is_finished()) && Instant::now() < deadline {
        thread::sleep(Duration::from_millis(20));
    }
    Ok(match (status.code(), status.signal()) {
        (Some(code), _) => code,
        (None, Some(sig)) => 128 + sig,
        (None, None) => 1,
    })
}

/// The binary's `main`.
pub fn main(cli: Cli) -> ExitCode {
    match run(&cli) {
        Ok(code) => ExitCode::from(u8::try_from(code).unwrap_or(1)),
        Err(e) => {
            eprintln!("ttdrv-ttcard: {e:#}");
            ExitCode::from(2)
        }
    }
}

#[cfg(test)]
mod tests {
    use std::io::{IoSlice, Read};
    use std::mem::MaybeUninit;

    use rustix::net::{SendAncillaryBuffer, SendAncillaryMessage, SendFlags};

    use super::protocol::{Request, encode_request, read_ret};
    use super::*;

    /// Sends `req` as QEMU does, SYNC_SYSMEM carrying an fd (a guest RAM memfd there).
    fn send(qemu: &UnixStream, req: &Request, fd: Option<&UnixStream>) {
        let msg = encode_request(req);
        let mut space = [MaybeUninit::uninit(); rustix::cmsg_space!(ScmRights(1))];
        let mut control = SendAncillaryBuffer::new(&mut space);
        let fds;
        if let Some(fd) = fd {
            fds = [std::os::fd::AsFd::as_fd(fd)];
            assert!(control.push(SendAncillaryMessage::ScmRights(&fds)));
        }
        let n = rustix::net::sendmsg(
            qemu,
            &[IoSlice::new(&msg)],
            &mut control,
            SendFlags::empty(),
        )
        .expect("sendmsg");
        assert_eq!(n, msg.len());
    }

    fn ask(qemu: &mut UnixStream, req: Request) -> u64 {
        send(qemu, &req, None);
        read_ret(qemu).expect("RET")
    }

    #[test]
    fn wire_protocol_over_a_socketpair() {
        let (mut qemu, ours) = UnixStream::pair().expect("socketpair");
        let server = thread::spawn(move || {
            let mut card = Card::new(CardConfig::new(0, Kind::Wormhole));
            let log = Log::new(Box::new(io::sink()));
            serve(ours, &mut card, Instant::now(), &log).expect("served to EOF");
            card
        });
        let (memfd, _keep) = UnixStream::pair().expect("an fd to pass");
        send(&qemu, &Request::SyncSysmem, Some(&memfd));
        send(&qemu, &Request::SetIrqfd, None);
        qemu.set_read_timeout(Some(Duration::from_millis(200)))
            .expect("timeout");
        let mut byte = [0u8; 1];
        let silent = qemu
            .read(&mut byte)
            .expect_err("no reply to SYNC_SYSMEM or SET_IRQFD");
        assert!(matches!(
            silent.kind(),
            io::ErrorKind::WouldBlock | io::ErrorKind::TimedOut
        ));
        qemu.set_read_timeout(None).expect("blocking");

        assert_eq!(
            ask(&mut qemu, Request::CfgRead { addr: 0, len: 4 }),
            0x401E_1E52
        );
        assert_eq!(ask(&mut qemu, Request::CfgRead { addr: 2, len: 2 }), 0x401E);
        let bar4 = Request::CfgWrite {
            addr: 0x20,
            val: 0xE200_0000,
            len: 4,
        };
        assert_eq!(ask(&mut qemu, bar4), 0);
        assert_eq!(
            ask(&mut qemu, Request::CfgRead { addr: 0x20, len: 4 }),
            0xE200_0000
        );
        let scratch5 = 0xE200_0000 + 0x1F3_0074;
        let msg = Request::BarWrite {
            gpa: scratch5,
            val: 0xAAB7,
            size: 4,
        };
        assert_eq!(ask(&mut qemu, msg), 0);
        assert_eq!(
            ask(
                &mut qemu,
                Request::BarRead {
                    gpa: scratch5,
                    size: 4
                }
            ),
            0xB7
        );
        assert_eq!(ask(&mut qemu, Request::DeviceReset), 0);
        drop(qemu);

        let card = server.join().expect("server thread");
        assert_eq!((card.cfg_accesses, card.mmio_accesses), (4, 2));
        assert_eq!(
            card.summary(),
            "card0 (wh 401e): 4 config accesses, 2 MMIO accesses, firmware messages: 0xb7"
        );
    }

    #[test]
    fn placeholders_become_proxy_devices_in_order() {
        let args: Vec<String> = ["qemu", "-device", "@TTCARD@", "-device", "@TTCARD@,addr=5"]
            .map(String::from)
            .into();
        let out = substitute(&args, &[7, 9]).expect("two cards, two placeholders");
        assert_eq!(out[2], "x-pci-proxy-dev,id=tt0,fd=7");
        assert_eq!(out[4], "x-pci-proxy-dev,id=tt1,fd=9,addr=5");
        assert!(
            substitute(&args, &[7]).is_err(),
            "more placeholders than cards"
        );
        assert!(
            substitute(&args, &[7, 8, 9]).is_err(),
            "a card without a device"
        );
    }

    #[test]
    fn fault_specs_set_the_initial_state() {
        let cli = <Cli as clap::Parser>::try_parse_from([
            "ttdrv-ttcard",
            "--cards",
            "wh,bh",
            "--wh-bar0-mb",
            "64",
            "--fault",
            "0:vanish",
            "--fault",
            "1:fw-delay=2.5",
            "--fault",
            "1:noprobe",
            "--",
            "qemu",
        ])
        .expect("valid command line");
        let c = card_configs(&cli).expect("valid faults");
        assert_eq!(
            (c[0].kind, c[0].wh_bar0_mb, c[0].faults),
            (Kind::Wormhole, 64, Faults(Faults::VANISH))
        );
        assert_eq!(
            (c[1].faults, c[1].fw_delay),
            (Faults(Faults::NOPROBE), Duration::from_millis(2500))
        );
        for bad in ["2:vanish", "0:melt", "x:vanish", "0:fw-delay=soon"] {
            let cli = Cli {
                faults: vec![bad.into()],
                ..cli_with_cards("wh,bh")
            };
            assert!(card_configs(&cli).is_err(), "{bad}");
        }
        assert!(
            card_configs(&Cli {
                wh_bar0_mb: 48,
                ..cli_with_cards("wh")
            })
            .is_err()
        );
    }

    fn cli_with_cards(cards: &str) -> Cli {
        <Cli as clap::Parser>::try_parse_from(["ttdrv-ttcard", "--cards", cards, "--", "qemu"])
            .expect("valid command line")
    }
}
