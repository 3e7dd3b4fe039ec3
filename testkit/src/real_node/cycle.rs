//! One rollout cycle of the VM-node test (tests/vm_node.rs), read back from
//! its two records: the timeline (host clock; one [`Sample`] per change of the
//! Node, the policy's node record, the installer pods and the workload, each an
//! API snapshot) and the guest's console ([`Console`]: the module reports and
//! the installer pods' log lines, each with the agent's own timestamp, guest
//! clock).
//!
//! [`check`] makes the structural checks of a cordon window (the order of
//! snapshots and of one agent's log lines, never a comparison of durations);
//! the figures printed beside them mix the two clocks and are only reported.

use std::collections::BTreeSet;

/// One API snapshot of the VM node.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Sample {
    /// Host clock, Unix seconds.
    pub t: f64,
    /// Host clock when the reads of the last snapshot that was still this
    /// one began (the watcher keeps a sample only when it changed, and moves
    /// this on): what it shows held at least until then.
    pub seen_until: f64,
    /// The node record's state ("-" when there is none).
    pub state: String,
    pub reason: Option<String>,
    pub cordoned: bool,
    pub go_ahead: bool,
    pub kmd: Option<String>,
    pub prepared: Option<String>,
    pub installer: BTreeSet<String>,
    /// Running workload pods.
    pub workload: BTreeSet<String>,
}

impl Sample {
    /// The snapshot without its time (what the watcher compares).
    pub fn key(&self) -> String {
        let o = |v: &Option<String>| v.clone().unwrap_or_else(|| "-".into());
        let j = |s: &BTreeSet<String>| s.iter().cloned().collect::<Vec<_>>().join(",");
        format!(
            "state={} reason={} cordoned={} go-ahead={} kmd-version={} prepared={} installer={} workload={}",
            self.state,
            o(&self.reason),
            self.cordoned,
            if self.go_ahead { "yes" } else { "no" },
            o(&self.kmd),
            o(&self.prepared),
            j(&self.installer),
            j(&self.workload)
        )
    }

    /// A timeline line: "T key=value ...".
    pub fn line(&self) -> String {
        format!("{:.3} {}", self.t, self.key())
    }

    /// Reads back a [`Sample::line`].
    pub fn parse(line: &str) -> Option<Sample> {
        let mut f = line.split_whitespace();
        let t = f.next()?.parse().ok()?;
        let mut s = Sample {
            t,
            seen_until: t,
            ..Default::default()
        };
        let opt = |v: &str| (v != "-").then(|| v.to_string());
        let set = |v: &str| {
            v.split(',')
                .filter(|p| !p.is_empty())
                .map(str::to_string)
                .collect()
        };
        for kv in f {
            let (k, v) = kv.split_once('=')?;
            match k {
                "state" => s.state = v.into(),
                "reason" => s.reason = opt(v),
                "cordoned" => s.cordoned = v == "true",
                "go-ahead" => s.go_ahead = v == "yes",
                "kmd-version" => s.kmd = opt(v),
                "prepared" => s.prepared = opt(v),
                "installer" => s.installer = set(v),
                "workload" => s.workload = set(v),
                _ => {}
            }
        }
        Some(s)
    }
}

/// First time at or after `t0` a sample satisfies `pred`.
pub fn tl_time(tl: &[Sample], t0: f64, pred: impl Fn(&Sample) -> bool) -> Option<f64> {
    tl.iter().find(|s| s.t >= t0 && pred(s)).map(|s| s.t)
}

/// The last time a sample still failed `pred` before the first one at or
/// after `t0` satisfying it: what the timeline proves of when it began (it
/// began after this, and by [`tl_time`]). None when no earlier sample
/// failed it.
pub fn tl_not_yet(tl: &[Sample], t0: f64, pred: impl Fn(&Sample) -> bool) -> Option<f64> {
    let first = tl.iter().position(|s| s.t >= t0 && pred(s))?;
    tl[..first]
        .iter()
        .rev()
        .find(|s| !pred(s))
        .map(|s| s.seen_until)
}

/// A line an installer pod's agent logged, as the guest relayed it.
#[derive(Debug, Clone, PartialEq)]
pub struct AgentLine {
    pub pod: String,
    /// The agent's own timestamp (guest clock), Unix seconds.
    pub t: f64,
    pub text: String,
}

/// The guest's serial console (hack/vm-node/init): lines "VMNODE <time> ...".
#[derive(Debug, Clone, Default)]
pub struct Console {
    /// The console's text without carriage returns and escape sequences.
    pub text: String,
}

/// Removes carriage returns and escape sequences: CSI (ESC [ params letter)
/// and two-character ones (ESC c, the reset SeaBIOS prints before the kernel).
fn clean(raw: &str) -> String {
    let mut out = String::with_capacity(raw.len());
    let mut chars = raw.chars().peekable();
    while let Some(c) = chars.next() {
        match c {
            '\r' => {}
            '\x1b' if chars.peek() == Some(&'[') => {
                chars.next();
                for c in chars.by_ref() {
                    if c.is_ascii_alphabetic() {
                        break;
                    }
                }
            }
            '\x1b' => {
                chars.next();
            }
            c => out.push(c),
        }
    }
    out
}

fn unix(ts: &str) -> Option<f64> {
    let t: k8s_openapi::jiff::Timestamp = ts.parse().ok()?;
    Some(t.as_microsecond() as f64 / 1e6)
}

impl Console {
    pub fn new(raw: &str) -> Self {
        Self { text: clean(raw) }
    }

    pub fn read(path: &str) -> Self {
        Self::new(&String::from_utf8_lossy(
            &std::fs::read(path).unwrap_or_default(),
        ))
    }

    /// The reports: (guest time, what follows it).
    pub fn reports(&self) -> impl Iterator<Item = (f64, &str)> {
        // (a report may follow what the firmware left on the line)
        self.text.lines().filter_map(|l| {
            let rest = &l[l.find("VMNODE ")? + "VMNODE ".len()..];
            let (t, what) = rest.split_once(' ')?;
            Some((t.parse().ok()?, what))
        })
    }

    /// A report starting with `prefix` ("init ", "containerd up", "module=2.7.0 ").
    pub fn has(&self, prefix: &str) -> bool {
        self.reports().any(|(_, w)| w.starts_with(prefix))
    }

    /// First report at or after `t0` containing `needle`.
    pub fn at(&self, t0: f64, needle: &str) -> Option<f64> {
        self.reports()
            .find(|(t, w)| *t >= t0 && w.contains(needle))
            .map(|(t, _)| t)
    }

    /// The module reports ("module=V refcnt=N dev=...").
    pub fn modules(&self) -> impl Iterator<Item = (f64, &str)> {
        self.reports().filter(|(_, w)| w.starts_with("module="))
    }

    /// The last module report.
    pub fn module_now(&self) -> Option<String> {
        self.modules().last().map(|(_, w)| w.to_string())
    }

    /// First module report at or after `t0` containing `needle`.
    pub fn module_at(&self, t0: f64, needle: &str) -> Option<f64> {
        self.modules()
            .find(|(t, w)| *t >= t0 && format!("{w} ").contains(needle))
            .map(|(t, _)| t)
    }

    /// Every agent line: "agent <namespace>_<pod>_<uid> <RFC 3339 time> <text>".
    pub fn agent_lines(&self) -> Vec<AgentLine> {
        self.reports()
            .filter_map(|(_, w)| {
                let rest = w.strip_prefix("agent ")?;
                let (dir, rest) = rest.split_once(' ')?;
                let (ts, text) = rest.split_once(char::is_whitespace).unwrap_or((rest, ""));
                // the agent's own time, UTC ("...Z"): anything else is no agent line
                let t = unix(ts).filter(|_| ts.ends_with('Z'))?;
                let parts: Vec<&str> = dir.split('_').collect();
                let pod = if parts.len() >= 3 { parts[1] } else { dir };
                Some(AgentLine {
                    pod: pod.to_string(),
                    t,
                    text: text.trim_start().to_string(),
                })
            })
            .collect()
    }

    /// The agent's last summary of an install of `version`, from its
    /// "summary: " on.
    pub fn summary_of(&self, version: &str) -> Option<String> {
        let needle = format!("summary: result=installed version={version} ");
        self.text
            .lines()
            .rev()
            .find_map(|l| l.find(&needle).map(|i| l[i..].to_string()))
    }
}

/// The pod whose agent logged the installed summary of `version` (at or after `t0`).
pub fn loader(lines: &[AgentLine], t0: f64, version: &str) -> Option<String> {
    let needle = format!("summary: result=installed version={version} ");
    lines
        .iter()
        .find(|l| l.t >= t0 && l.text.contains(&needle))
        .map(|l| l.pod.clone())
}

/// First agent line of `pod` (any pod when None) at or after `t0` containing `needle`.
pub fn agent_at(lines: &[AgentLine], t0: f64, needle: &str, pod: Option<&str>) -> Option<f64> {
    lines
        .iter()
        .find(|l| l.t >= t0 && pod.is_none_or(|p| l.pod == p) && l.text.contains(needle))
        .map(|l| l.t)
}

/// What the cordon window must hold.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Mode {
    /// Build-ahead: no build inside the window. The node carried
    /// kmd-prepared=VERSION from its cordon to the go-ahead, the pod that
    /// loaded VERSION existed before the cordon and none was created inside
    /// the window, and that pod's log is [cache miss, build] or cache hit,
    /// then waiting for the go-ahead, go-ahead, unload, load, with no build
    /// after it began to wait.
    Ahead,
    /// Prepare off: the pod that loaded VERSION came after the cordon and built it.
    Inside,
}

fn first(log: &[&AgentLine], needles: &[&str], start: usize) -> Option<usize> {
    (start..log.len()).find(|&i| needles.iter().any(|n| log[i].text.contains(n)))
}

/// The checks of the cordon window after the change to `version` at `t0`;
/// on success the figures (one line, key=value).
pub fn check(
    tl: &[Sample],
    lines: &[AgentLine],
    t0: f64,
    version: &str,
    mode: Mode,
) -> Result<String, String> {
    let tl: Vec<&Sample> = tl.iter().filter(|s| s.t >= t0).collect();
    let lines: Vec<AgentLine> = lines.iter().filter(|l| l.t >= t0).cloned().collect();
    let pod = loader(&lines, t0, version)
        .ok_or_else(|| format!("no installer pod logged the installed summary of {version}"))?;
    let log: Vec<&AgentLine> = lines.iter().filter(|l| l.pod == pod).collect();
    let (c, u) = cordon_window(&tl, version)?;
    let window = &tl[c..u];
    let before: BTreeSet<&str> = tl[..c]
        .iter()
        .flat_map(|s| s.installer.iter().map(String::as_str))
        .collect();
    let in_window: BTreeSet<&str> = window
        .iter()
        .flat_map(|s| s.installer.iter().map(String::as_str))
        .collect();
    let steps = Steps::of(&log, &pod)?;
    match mode {
        Mode::Ahead => check_ahead(window, &before, &in_window, &log, &steps, &pod, version)?,
        Mode::Inside => check_inside(&before, &steps, &pod, version)?,
    }
    Ok(figures(&tl, (c, u), t0, &log, &steps, &pod))
}

/// The first sample cordoned and the first uncordoned after it.
fn cordon_window(tl: &[&Sample], version: &str) -> Result<(usize, usize), String> {
    let c = tl
        .iter()
        .position(|s| s.cordoned)
        .ok_or_else(|| format!("the node was never cordoned after the change to {version}"))?;
    let u = (c..tl.len())
        .find(|&i| !tl[i].cordoned)
        .ok_or_else(|| format!("the node was never uncordoned after the change to {version}"))?;
    Ok((c, u))
}

/// Where in the loading pod's log each step of the agent first appears.
#[derive(Clone, Copy)]
struct Steps {
    miss: Option<usize>,
    build: Option<usize>,
    hit: Option<usize>,
    wait: Option<usize>,
    go: Option<usize>,
    unload: usize,
    load: usize,
}

impl Steps {
    fn of(log: &[&AgentLine], pod: &str) -> Result<Self, String> {
        let (Some(unload), Some(load)) = (
            first(log, &["step=\"unload\""], 0),
            first(log, &["step=\"load\""], 0),
        ) else {
            return Err(format!("pod {pod} logged no unload or no load step"));
        };
        Ok(Steps {
            miss: first(log, &["cache miss"], 0),
            build: first(log, &["step=\"build\""], 0),
            hit: first(log, &["cache hit (verified)"], 0),
            wait: first(log, &["waiting for the controller's go-ahead"], 0),
            go: first(log, &["the controller's go-ahead is on the node"], 0),
            unload,
            load,
        })
    }
}

/// Build-ahead: prepared through the cordon until the go-ahead, the loading
/// pod there before it and none created in it, and the pod's log in order
/// with no build once it began to wait.
fn check_ahead(
    window: &[&Sample],
    before: &BTreeSet<&str>,
    in_window: &BTreeSet<&str>,
    log: &[&AgentLine],
    steps: &Steps,
    pod: &str,
    version: &str,
) -> Result<(), String> {
    // until the go-ahead (the label is not the agent's to keep after that)
    for s in window.iter().take_while(|s| !s.go_ahead) {
        if s.prepared.as_deref() != Some(version) {
            return Err(format!(
                "cordoned at {:.1} while the node's kmd-prepared was {:?}, not {version}",
                s.t, s.prepared
            ));
        }
    }
    if !before.contains(&pod) {
        return Err(format!(
            "the pod that loaded {version} ({pod}) was not on the node before its cordon"
        ));
    }
    let new: Vec<&&str> = in_window.difference(before).collect();
    if !new.is_empty() {
        return Err(format!(
            "installer pod(s) created inside the cordon window: {new:?}"
        ));
    }
    let Steps {
        miss,
        build,
        hit,
        wait,
        go,
        unload,
        load,
    } = *steps;
    let (Some(wait), Some(go)) = (wait, go) else {
        return Err(format!(
            "pod {pod} never waited for the go-ahead (waiting={wait:?} go-ahead={go:?})"
        ));
    };
    let got = match (hit, miss, build) {
        (Some(h), _, _) => h,
        (None, Some(_), Some(b)) => b,
        _ => {
            return Err(format!(
                "pod {pod} neither found {version} in its cache nor built it"
            ));
        }
    };
    if !(got < wait && wait < go && go < unload && unload < load) {
        return Err(format!(
            "pod {pod}'s log out of order: module obtained #{got}, waiting #{wait}, go-ahead #{go}, unload #{unload}, load #{load}"
        ));
    }
    if let Some(late) = first(
        log,
        &["cache miss", "step=\"build\"", "step=\"rebuild\""],
        wait,
    ) {
        let text: String = log[late].text.chars().take(200).collect();
        return Err(format!(
            "pod {pod} built after it began to wait for the go-ahead: {text}"
        ));
    }
    Ok(())
}

/// Prepare off: the loading pod came after the cordon and built the target.
fn check_inside(
    before: &BTreeSet<&str>,
    steps: &Steps,
    pod: &str,
    version: &str,
) -> Result<(), String> {
    if before.contains(&pod) {
        return Err(format!(
            "prepare off, yet the pod that loaded {version} ({pod}) was on the node before its cordon"
        ));
    }
    if steps.miss.is_none() || steps.build.is_none() {
        return Err(format!(
            "prepare off, yet pod {pod} did not build {version}"
        ));
    }
    Ok(())
}

/// The figures of a passing cycle, one line of key=value: the window
/// `(c, u)` (first cordoned and first uncordoned sample) and its parts.
fn figures(
    tl: &[&Sample],
    (c, u): (usize, usize),
    t0: f64,
    log: &[&AgentLine],
    steps: &Steps,
    pod: &str,
) -> String {
    let window = &tl[c..u];
    let (t_cord, t_uncord) = (tl[c].t, tl[u].t);
    let t_upg = tl.iter().find(|s| s.state == "Upgrading").map(|s| s.t);
    let t_done = t_upg.and_then(|up| {
        tl.iter()
            .find(|s| s.t >= up && s.state == "Done")
            .map(|s| s.t)
    });
    let mut fig = vec![
        ("pod", pod.to_string()),
        (
            "source",
            if steps.hit.is_some() {
                "cache"
            } else {
                "build"
            }
            .to_string(),
        ),
        ("out_of_service_s", format!("{:.1}", t_uncord - t_cord)),
        (
            "phase_s",
            t_done.map_or("-".into(), |d| format!("{:.1}", d - t0)),
        ),
        ("cordon_after_change_s", format!("{:.1}", t_cord - t0)),
    ];
    let load = steps.load;
    // the window's parts: the drain (host clock), then the agent's side
    if let Some(t_go) = window.iter().find(|s| s.go_ahead).map(|s| s.t) {
        fig.push(("cordon_to_go_ahead_s", format!("{:.1}", t_go - t_cord)));
        fig.push(("go_ahead_to_load_s", format!("{:.1}", log[load].t - t_go)));
    }
    fig.push((
        "load_to_uncordon_s",
        format!("{:.1}", t_uncord - log[load].t),
    ));
    if let Some(b) = steps.build {
        fig.extend(build_figures(log, b, steps.miss, t_cord));
    }
    fig.iter()
        .map(|(k, v)| format!("{k}={v}"))
        .collect::<Vec<_>>()
        .join(" ")
}

/// The build's figures: its duration as the agent logged it, and when it
/// started and ended against the cordon.
fn build_figures(
    log: &[&AgentLine],
    b: usize,
    miss: Option<usize>,
    t_cord: f64,
) -> [(&'static str, String); 3] {
    let ms = log[b].text.split_once("duration_ms=").and_then(|(_, r)| {
        r.split(|c: char| !c.is_ascii_digit())
            .next()?
            .parse::<u64>()
            .ok()
    });
    [
        (
            "build_s",
            ms.map_or("-".into(), |ms| format!("{:.1}", ms as f64 / 1000.0)),
        ),
        // guest clock against host clock: a figure, not an assertion
        (
            "build_start_vs_cordon_s",
            miss.map_or("-".into(), |m| format!("{:+.1}", log[m].t - t_cord)),
        ),
        (
            "build_end_vs_cordon_s",
            format!("{:+.1}", log[b].t - t_cord),
        ),
    ]
}

fn rel(t0: f64, t: f64) -> String {
    format!("{:+7.1}s", t - t0)
}

/// What happened after the policy moved to `version` at `t0`, in the order it
/// happened (API rows: host clock; agent and console rows: the guest's clock,
/// within about a second of it). `workload`: the rows about the workload too.
pub fn cycle_table(
    title: &str,
    tl: &[Sample],
    con: &Console,
    t0: f64,
    version: &str,
    workload: bool,
) -> String {
    let lines = con.agent_lines();
    let pod = loader(&lines, t0, version).unwrap_or_default();
    let p = Some(pod.as_str());
    let a = |needle: &str| agent_at(&lines, t0, needle, p);
    let t = |pred: &dyn Fn(&Sample) -> bool| tl_time(tl, t0, pred);
    let v = version.to_string();
    let t_cord = t(&|s| s.cordoned);
    let t_load = con.module_at(t0, &format!("module={v} "));
    let t_upg = t(&|s| s.state == "Upgrading");
    let mut rows: Vec<(Option<f64>, String)> = vec![
        (
            t(&|s| s.installer.contains(&pod)),
            format!("installer pod {pod} in the API"),
        ),
        (
            t(&|s| s.reason.as_deref() == Some("Preparing")),
            "record Pending (Preparing: building ahead)".into(),
        ),
        (
            a("ttdrv-agent starting"),
            "agent: started (its first log line)".into(),
        ),
        (
            a("cache hit (verified)"),
            "agent: cache hit (verified)".into(),
        ),
        (a("cache miss"), "agent: build started (cache miss)".into()),
        (a("step=\"build\""), "agent: build done".into()),
        (
            t(&|s| s.prepared.as_deref() == Some(version)),
            format!("Node label kmd-prepared={v}"),
        ),
        (
            a("waiting for the controller"),
            "agent: waiting for the go-ahead".into(),
        ),
        (t_cord, "node cordoned (controller)".into()),
        (t(&|s| s.state == "Draining"), "record Draining".into()),
        (t(&|s| s.go_ahead), "go-ahead on the Node".into()),
        (t_upg, "record Upgrading".into()),
        (a("go-ahead is on the node"), "agent: go-ahead seen".into()),
        (a("step=\"unload\""), "agent: old module unloaded".into()),
        (
            a("step=\"load\""),
            "agent: new module loaded (finit_module)".into(),
        ),
        (t_load, format!("guest console: {v} loaded")),
        (
            a(&format!("summary: result=installed version={v}")),
            "agent: summary (installed)".into(),
        ),
        (
            t(&|s| s.kmd.as_deref() == Some(version)),
            format!("Node label kmd-version={v}"),
        ),
        (
            t_cord.and_then(|c| tl_time(tl, c, |s| !s.cordoned)),
            "node uncordoned".into(),
        ),
        (
            t_upg.and_then(|u| tl_time(tl, u, |s| s.state == "Done")),
            "record Done".into(),
        ),
    ];
    // without a workload these rows say nothing
    if workload {
        rows.push((
            t(&|s| s.workload.is_empty()),
            "workload pod object gone (evicted)".into(),
        ));
        rows.push((
            con.module_at(t0, "refcnt=0"),
            "device released in the guest (refcnt 0)".into(),
        ));
        rows.push((
            t_load.and_then(|l| con.module_at(l, &format!("module={v} refcnt=1"))),
            "workload holds the device again (refcnt 1, guest)".into(),
        ));
    }
    let mut seen: Vec<(f64, &str)> = rows
        .iter()
        .filter_map(|(w, what)| w.map(|w| (w, what.as_str())))
        .collect();
    seen.sort_by(|a, b| a.0.total_cmp(&b.0));
    let mut out = format!("[test-vm-node] {title} (times after the policy change, in order)\n");
    for (w, what) in seen {
        out.push_str(&format!("[test-vm-node]   {what:<58} {}\n", rel(t0, w)));
    }
    let unseen: Vec<String> = rows
        .iter()
        .filter(|(w, _)| w.is_none())
        .map(|(_, what)| format!("[{what}]"))
        .collect();
    if !unseen.is_empty() {
        out.push_str(&format!(
            "[test-vm-node]   not seen: {}\n",
            unseen.join(" ")
        ));
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    // A recorded build-ahead cycle, shortened: 2.7.0 -> 2.8.0 at t=100.
    const TIMELINE: &str = "\
100.000 state=Done reason=- cordoned=false go-ahead=no kmd-version=2.7.0 prepared=- installer=inst-a workload=hold-1
101.000 state=Pending reason=Preparing cordoned=false go-ahead=no kmd-version=2.7.0 prepared=- installer=inst-b workload=hold-1
130.000 state=Pending reason=Preparing cordoned=false go-ahead=no kmd-version=2.7.0 prepared=2.8.0 installer=inst-b workload=hold-1
131.000 state=Draining reason=- cordoned=true go-ahead=no kmd-version=2.7.0 prepared=2.8.0 installer=inst-b workload=hold-1
133.000 state=Draining reason=- cordoned=true go-ahead=no kmd-version=2.7.0 prepared=2.8.0 installer=inst-b workload=
134.000 state=Upgrading reason=- cordoned=true go-ahead=yes kmd-version=2.7.0 prepared=2.8.0 installer=inst-b workload=
140.000 state=Upgrading reason=- cordoned=true go-ahead=yes kmd-version=2.8.0 prepared=- installer=inst-b workload=
141.000 state=Done reason=- cordoned=false go-ahead=no kmd-version=2.8.0 prepared=- installer=inst-b workload=hold-2
";

    fn console(build_late: bool) -> String {
        // agent time S (seconds after the epoch), relayed by the guest 0.5 s later
        let a = |s: u32, text: &str| {
            format!(
                "VMNODE {}.5 agent ns_inst-b_uid 1970-01-01T00:{:02}:{:02}.000Z  {text}\r\n",
                s,
                s / 60,
                s % 60
            )
        };
        let mut c = String::from("\x1bc\x1b[?7l\x1b[2JVMNODE 98.0 init kernel=6.1\n");
        c += "VMNODE 99.0 module=2.7.0 refcnt=1 dev=0,\n";
        c += &a(102, "ttdrv-agent starting");
        c += &a(103, "cache miss");
        c += &a(128, "step=\"build\" duration_ms=25000");
        c += &a(129, "waiting for the controller's go-ahead");
        if build_late {
            c += &a(130, "step=\"rebuild\"");
        }
        c += &a(134, "the controller's go-ahead is on the node");
        c += &a(135, "step=\"unload\"");
        c += &a(136, "step=\"load\"");
        c += &a(
            137,
            "summary: result=installed version=2.8.0 previous=2.7.0 source=build",
        );
        c += "VMNODE 136.5 module=2.8.0 refcnt=0 dev=0,\n\x1b[0mVMNODE 142.0 module=2.8.0 refcnt=1 dev=0,\n";
        c
    }

    fn tl() -> Vec<Sample> {
        TIMELINE.lines().filter_map(Sample::parse).collect()
    }

    #[test]
    fn what_the_timeline_proves_of_a_change() {
        let mut tl = tl();
        // The go-ahead: first seen at 134, still absent at 133's snapshot.
        assert_eq!(tl_time(&tl, 100.0, |s| s.go_ahead), Some(134.0));
        assert_eq!(tl_not_yet(&tl, 100.0, |s| s.go_ahead), Some(133.0));
        // Unchanged snapshots moved 133's sample on: absent until 133.8.
        tl[4].seen_until = 133.8;
        assert_eq!(tl_not_yet(&tl, 100.0, |s| s.go_ahead), Some(133.8));
        // Never seen absent before it held: nothing proven.
        assert_eq!(tl_not_yet(&tl, 100.0, |s| s.state == "Done"), None);
        assert_eq!(
            tl_not_yet(&tl, 100.0, |s| s.kmd.as_deref() == Some("9.9.9")),
            None
        );
    }

    #[test]
    fn samples_round_trip() {
        for s in tl() {
            assert_eq!(Sample::parse(&s.line()), Some(s.clone()));
        }
    }

    #[test]
    fn console_reads_reports_and_agent_lines() {
        let con = Console::new(&console(false));
        assert_eq!(
            con.module_now().as_deref(),
            Some("module=2.8.0 refcnt=1 dev=0,")
        );
        let lines = con.agent_lines();
        assert_eq!(lines.len(), 8);
        assert_eq!(lines[0].pod, "inst-b");
        assert_eq!(lines[0].t, 102.0);
        assert_eq!(loader(&lines, 100.0, "2.8.0").as_deref(), Some("inst-b"));
        assert!(
            con.summary_of("2.8.0")
                .is_some_and(|s| s.contains("previous=2.7.0 source=build"))
        );
        assert_eq!(con.module_at(100.0, "module=2.8.0 refcnt=1"), Some(142.0));
    }

    #[test]
    fn build_ahead_window_passes_and_reports_figures() {
        let con = Console::new(&console(false));
        let fig = check(&tl(), &con.agent_lines(), 100.0, "2.8.0", Mode::Ahead);
        let fig = fig.unwrap_or_else(|e| panic!("{e}"));
        assert!(fig.contains("source=build out_of_service_s=10.0"), "{fig}");
        assert!(fig.contains("build_s=25.0"), "{fig}");
        // the build lies outside the window: that is what Inside refuses
        assert!(check(&tl(), &con.agent_lines(), 100.0, "2.8.0", Mode::Inside).is_err());
        let table = cycle_table("t", &tl(), &con, 100.0, "2.8.0", true);
        // a cache-cold build: the only row not seen is the cache hit
        assert!(
            table.ends_with("not seen: [agent: cache hit (verified)]\n"),
            "{table}"
        );
        assert!(table.contains("record Done"), "{table}");
    }

    #[test]
    fn build_inside_the_window_fails_build_ahead() {
        let con = Console::new(&console(true));
        let e = check(&tl(), &con.agent_lines(), 100.0, "2.8.0", Mode::Ahead);
        assert!(e.is_err_and(|e| e.contains("built after it began to wait")));
        // a pod created inside the window
        let mut tl = tl();
        tl[4].installer.insert("inst-c".into());
        let con = Console::new(&console(false));
        let e = check(&tl, &con.agent_lines(), 100.0, "2.8.0", Mode::Ahead);
        assert!(e.is_err_and(|e| e.contains("created inside the cordon window")));
        // not prepared at the cordon
        let mut tl = self::tl();
        tl[3].prepared = None;
        let e = check(&tl, &con.agent_lines(), 100.0, "2.8.0", Mode::Ahead);
        assert!(e.is_err_and(|e| e.contains("kmd-prepared")));
    }
}
