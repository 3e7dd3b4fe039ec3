//! Text rendering of the views: pure functions from views to `String`.

use crate::eta::{Basis, PerNode, human};
use crate::plan::{PlannedNode, RolloutPlan};
use crate::style::{self, BOLD, DIM, GREEN, Palette, RED, YELLOW, state_style};
use crate::table::Table;
use crate::view::{NodeRow, Outcome, PolicyView, WatchView, outcome};

fn state_cell(n: &NodeRow) -> (String, anstyle::Style) {
    let text = if n.host_managed {
        "Done (host)".to_string()
    } else if n.retry_requested {
        "Failed (retrying)".to_string()
    } else {
        n.state.as_str().to_string()
    };
    (text, state_style(n.state, n.host_managed))
}

fn opt(s: &Option<String>) -> String {
    s.clone().unwrap_or_else(|| "-".into())
}

/// One word for where a policy stands, with its style.
pub fn phase(v: &PolicyView) -> (String, anstyle::Style) {
    match outcome(v) {
        _ if v.paused => ("Paused".into(), YELLOW),
        Outcome::Failed { nodes } => (format!("Halted ({} failed)", nodes.len()), RED),
        Outcome::Complete if v.nodes.is_empty() => ("Idle (no nodes matched)".into(), DIM),
        Outcome::Complete => ("Complete".into(), GREEN),
        Outcome::Running if !v.observed => ("Waiting for the controller".into(), DIM),
        Outcome::Running => ("Rolling out".into(), YELLOW),
    }
}

fn summary_line(v: &PolicyView) -> String {
    let s = &v.summary;
    format!(
        "{} matched: {} done, {} in progress, {} pending, {} failed, {} host-managed",
        s.matched, s.done, s.in_progress, s.pending, s.failed_nodes, s.host_managed
    )
}

/// `status`: one block per policy.
pub fn status(views: &[PolicyView], pal: Palette) -> String {
    if views.is_empty() {
        return "No TenstorrentDriverPolicy found.\n".into();
    }
    let mut out = String::new();
    for (i, v) in views.iter().enumerate() {
        if i > 0 {
            out.push('\n');
        }
        let (ph, st) = phase(v);
        out.push_str(&format!(
            "{}  version {}  {}\n",
            pal.paint(&v.name, BOLD),
            v.version,
            pal.paint(&ph, st)
        ));
        out.push_str(&format!(
            "  paused: {}   conflict: {}   maxUnavailable: {}\n",
            if v.paused { "yes" } else { "no" },
            v.conflict.as_deref().unwrap_or("none"),
            v.max_unavailable
        ));
        out.push_str(&format!("  nodes: {}\n", summary_line(v)));
        let pc = &v.prepared;
        if pc.nodes > pc.at_target {
            out.push_str(&format!(
                "  prepared {}/{}: {} loaded or built ahead into the node's cache{}\n",
                pc.prepared,
                pc.nodes,
                v.version,
                if v.prepare_enabled {
                    ""
                } else {
                    " (build-ahead is off: upgradePolicy.prepare.enabled false)"
                }
            ));
        }
        if let Some(pr) = &v.promotion {
            out.push_str(&format!(
                "  Promotion: after {} (soak {}s): {}: {}\n",
                pr.canary, pr.soak_seconds, pr.state, pr.message
            ));
        }
        for (ty, c) in &v.conditions {
            let show = match ty.as_str() {
                "Progressing" => c.status == "True" && !c.message.is_empty(),
                "Degraded" => c.status == "True",
                _ => false,
            };
            if show {
                out.push_str(&format!("  {ty}: {}\n", c.message));
            }
        }
        if v.nodes.is_empty() {
            continue;
        }
        let mut t = Table::new(&["NODE", "STATE", "VERSION"]);
        for n in &v.nodes {
            t.row(vec![
                (n.name.clone(), anstyle::Style::new()),
                state_cell(n),
                (opt(&n.current_version), anstyle::Style::new()),
            ]);
        }
        out.push_str(&t.render(pal, 2));
        let blocked = blocked_drains(v, pal);
        for line in blocked.lines() {
            out.push_str(&format!("  {line}\n"));
        }
    }
    out
}

fn nodes_table(v: &PolicyView, pal: Palette, indent: usize, mode_col: bool) -> String {
    let mut header: Vec<&str> = if mode_col {
        vec![
            "NODE", "STATE", "CURRENT", "TARGET", "PREPARED", "MODE", "IN STATE", "REASON",
        ]
    } else {
        vec!["NODE", "STATE", "CURRENT", "TARGET", "IN STATE", "REASON"]
    };
    // Shown when a firmware policy manages some node: what a swap waits for
    // (WaitingForFirmware) or follows under a cordon handed over.
    let fw_col = v.nodes.iter().any(|n| n.firmware().is_some());
    if fw_col {
        header.insert(header.len() - 2, "FIRMWARE");
    }
    let mut t = Table::new(&header);
    let plain = anstyle::Style::new();
    for n in &v.nodes {
        let current_style = if n.current_version.as_deref() == Some(n.target_version.as_str()) {
            plain
        } else {
            DIM
        };
        let mut row = vec![
            (n.name.clone(), plain),
            state_cell(n),
            (opt(&n.current_version), current_style),
            (n.target_version.clone(), plain),
        ];
        if mode_col {
            row.push(prepared_cell(n));
            row.push((opt(&n.install_mode), plain));
        }
        if fw_col {
            row.push((n.firmware().unwrap_or_else(|| "-".into()), plain));
        }
        row.push((
            n.seconds_in_state.map(human).unwrap_or_else(|| "-".into()),
            plain,
        ));
        row.push((opt(&n.reason), plain));
        t.row(row);
    }
    t.render(pal, indent)
}

/// `yes` when the target is loaded or built and verified in the node's cache
/// (its swap is a load), else `-`. A host-managed (DKMS) or vacated node
/// builds nothing of ours: `-` even when its module is at the target.
fn prepared_cell(n: &NodeRow) -> (String, anstyle::Style) {
    if n.managed() && n.is_prepared() {
        ("yes".into(), anstyle::Style::new())
    } else {
        ("-".into(), DIM)
    }
}

/// A line per drain a PodDisruptionBudget blocks: the node's message (the
/// pods and budgets) and the time left before the drain times out.
fn blocked_drains(v: &PolicyView, pal: Palette) -> String {
    let mut out = String::new();
    for n in &v.nodes {
        let Some(left) = n.drain_times_out_in else {
            continue;
        };
        out.push_str(&format!(
            "{} {}: {}; the drain times out in {}\n",
            pal.paint("BLOCKED", YELLOW),
            n.name,
            n.message
                .as_deref()
                .unwrap_or("eviction blocked by a PodDisruptionBudget"),
            human(left)
        ));
    }
    out
}

fn failures(v: &PolicyView, pal: Palette) -> String {
    let mut out = blocked_drains(v, pal);
    for n in &v.nodes {
        if let Some(kver) = &n.next_kernel_build_failed {
            out.push_str(&format!(
                "{} {}: tt-kmd {} does not build for its installed kernel {kver}; a reboot into it would find no module\n",
                pal.paint("WARN", YELLOW),
                n.name,
                n.target_version
            ));
        }
    }
    for n in v.nodes.iter().filter(|n| n.state.is_failed()) {
        out.push_str(&format!(
            "{} {}: {}\n",
            pal.paint("FAILED", RED),
            n.name,
            n.message.as_deref().unwrap_or("(no message)")
        ));
    }
    out
}

/// `nodes <cr>`: the per-node table, then the messages of failed nodes.
pub fn nodes(v: &PolicyView, pal: Palette) -> String {
    if v.nodes.is_empty() {
        return format!(
            "Policy {} reports no nodes ({}).\n",
            v.name,
            if v.observed {
                "its selector matches no eligible Tenstorrent node"
            } else {
                "the controller has not reported on it yet"
            }
        );
    }
    let mut out = nodes_table(v, pal, 0, true);
    let f = failures(v, pal);
    if !f.is_empty() {
        out.push('\n');
        out.push_str(&f);
    }
    out
}

/// `[█████░░░░░]`, `width` cells.
pub fn bar(done: usize, total: usize, width: usize) -> String {
    let filled = (done * width)
        .checked_div(total)
        .unwrap_or(width)
        .min(width);
    format!("[{}{}]", "█".repeat(filled), "░".repeat(width - filled))
}

fn per_node_text(p: &PerNode) -> String {
    match p.basis {
        Basis::Observed => format!(
            "{} per node, observed on {} node{}",
            human(p.seconds),
            p.samples,
            if p.samples == 1 { "" } else { "s" }
        ),
        Basis::Status => format!(
            "{} per node, from the status of {} node{}",
            human(p.seconds),
            p.samples,
            if p.samples == 1 { "" } else { "s" }
        ),
        Basis::Model => format!(
            "{} per node (model: what a cordon holds; no cycle observed yet)",
            human(p.seconds)
        ),
    }
}

/// Clock time (UTC) of unix seconds: `12:34:56`.
pub fn clock(unix: i64) -> String {
    k8s_openapi::jiff::Timestamp::from_second(unix)
        .map(|t| t.strftime("%H:%M:%S UTC").to_string())
        .unwrap_or_default()
}

/// One screen of `watch`.
pub fn watch_frame(views: &[WatchView], now: i64, pal: Palette) -> String {
    let mut out = format!(
        "{}  {}\n",
        pal.paint("kubectl tt driver watch", BOLD),
        pal.paint(&clock(now), DIM)
    );
    if views.is_empty() {
        out.push_str("\nNo TenstorrentDriverPolicy found.\n");
    }
    for w in views {
        let v = &w.policy;
        let (ph, st) = phase(v);
        out.push('\n');
        out.push_str(&format!(
            "{} → {}   {}\n",
            pal.paint(&v.name, BOLD),
            v.version,
            pal.paint(&ph, st)
        ));
        let p = &w.progress;
        out.push_str(&format!(
            "{}  {}/{} done · {} in progress · {} pending · {} failed\n",
            pal.paint(
                &bar(p.done, p.total, 30),
                if p.failed > 0 { RED } else { GREEN }
            ),
            p.done,
            p.total,
            p.in_progress,
            p.pending,
            p.failed
        ));
        let e = &w.eta;
        let mut line = Vec::new();
        if let Some(s) = e.elapsed_seconds {
            line.push(format!("elapsed {}", human(s)));
        }
        match (&w.outcome, e.remaining_seconds) {
            (Outcome::Complete, _) => line.push("done".into()),
            (Outcome::Failed { .. }, _) => line.push("ETA -- (halted)".into()),
            (Outcome::Running, Some(r)) if v.paused => {
                line.push(format!("ETA {} once resumed", human(r)))
            }
            (Outcome::Running, Some(r)) => line.push(format!("ETA {}", human(r))),
            (Outcome::Running, None) => {}
        }
        line.push(per_node_text(&e.per_node));
        line.push(format!(
            "{} node{} at a time",
            e.slots,
            if e.slots == 1 { "" } else { "s" }
        ));
        out.push_str(&line.join(" · "));
        out.push('\n');
        if let Some(c) = v.conditions.get("Progressing")
            && c.status == "True"
            && !c.message.is_empty()
        {
            out.push_str(&pal.paint(&c.message, DIM));
            out.push('\n');
        }
        if !v.nodes.is_empty() {
            out.push('\n');
            out.push_str(&nodes_table(v, pal, 0, false));
        }
        let f = failures(v, pal);
        if !f.is_empty() {
            out.push('\n');
            out.push_str(&f);
        }
    }
    out
}

fn list(items: &[String]) -> String {
    if items.is_empty() {
        "-".into()
    } else {
        items.join(", ")
    }
}

/// `plan <cr>`.
pub fn plan(p: &RolloutPlan, pal: Palette) -> String {
    let mut out = plan_header(p, pal);
    out.push('\n');
    if p.nodes.is_empty() {
        out.push_str("No node needs a cordon/drain/upgrade cycle.\n");
    } else {
        out.push_str(&cycles_table(p, pal));
        for n in &p.nodes {
            out.push('\n');
            out.push_str(&node_drain_details(n, p.drain_enabled, pal));
        }
    }
    out.push_str(&without_drain_section(p, pal));
    out.push_str(&skipped_section(p, pal));
    let stalls = p.nodes.iter().any(|n| n.wave.is_none());
    out.push_str(&estimate_section(p, stalls, pal));
    if let Some(held) = &p.held {
        out.push_str(&format!("\n{} {held}\n", pal.paint("Held now:", BOLD)));
    }
    out.push_str(&build_ahead(p, stalls, pal));
    out
}

/// The plan's first lines: policy, versions, maxUnavailable, drain, paused,
/// and why it is halted.
fn plan_header(p: &RolloutPlan, pal: Palette) -> String {
    let mut out = String::new();
    let versions: std::collections::BTreeSet<String> = p
        .nodes
        .iter()
        .filter_map(|n| n.current_version.clone())
        .collect();
    let from = if versions.is_empty() {
        String::new()
    } else {
        format!("{} → ", versions.into_iter().collect::<Vec<_>>().join(", "))
    };
    out.push_str(&format!(
        "{} {}: {}{}{}  (dry run: nothing was changed)\n",
        pal.paint("Plan for", BOLD),
        pal.paint(&p.policy, BOLD),
        from,
        p.target_version,
        if p.target_version != p.spec_version {
            format!(" (spec.version is {})", p.spec_version)
        } else {
            String::new()
        }
    ));
    out.push_str(&format!(
        "maxUnavailable {} · drain {}{}\n",
        p.max_unavailable,
        if p.drain_enabled {
            "on (pass 1: device users, pass 2: rest of the node)"
        } else {
            "off"
        },
        if p.paused {
            " · policy is PAUSED: nothing starts until it is resumed"
        } else {
            ""
        }
    ));
    if let Some(h) = &p.halted {
        out.push_str(&pal.paint(&format!("! {h}"), RED));
        out.push('\n');
    }
    out
}

/// The table of node cycles in rollout order, one row per node.
fn cycles_table(p: &RolloutPlan, pal: Palette) -> String {
    let mut t = Table::new(&[
        "ORDER", "WAVE", "NODE", "VERSION", "PREPARED", "PASS 1", "PASS 2", "LEFT", "BLOCKERS",
    ]);
    let plain = anstyle::Style::new();
    for n in &p.nodes {
        let mut name = n.name.clone();
        if let Some(s) = n.in_state {
            name.push_str(&format!(" ({})", s.as_str()));
        }
        t.row(vec![
            (n.order.to_string(), plain),
            (
                n.wave.map(|w| w.to_string()).unwrap_or_else(|| "-".into()),
                plain,
            ),
            (name, plain),
            (opt(&n.current_version), plain),
            if n.prepared {
                ("yes".into(), plain)
            } else {
                ("-".into(), DIM)
            },
            (n.evict_device.len().to_string(), plain),
            (n.evict_other.len().to_string(), plain),
            (n.left.len().to_string(), plain),
            (
                n.blockers.len().to_string(),
                if n.blockers.is_empty() { plain } else { RED },
            ),
        ]);
    }
    t.render(pal, 0)
}

/// One node's paragraph: its notes, then what each pass evicts, what stays
/// and what blocks.
fn node_drain_details(n: &PlannedNode, drain_enabled: bool, pal: Palette) -> String {
    let mut out = String::new();
    let quiet = n.evict_device.is_empty()
        && n.evict_other.is_empty()
        && n.left.is_empty()
        && n.blockers.is_empty()
        && n.ungated_holders.is_empty()
        && n.dra_plugin.is_empty();
    let mut notes: Vec<String> = vec![];
    if n.already_unavailable {
        notes.push(match &n.unavailable_because {
            Some(why) => {
                format!("already out of service, {why}: starts first, stays cordoned")
            }
            None => "already unavailable: starts first, stays cordoned".into(),
        });
    }
    if n.has_device_pods {
        notes.push("device users: goes after nodes without".into());
    }
    if quiet {
        notes.insert(0, "nothing to evict".into());
    }
    out.push_str(&format!(
        "{}{}\n",
        pal.paint(&n.name, BOLD),
        if notes.is_empty() {
            String::new()
        } else {
            format!("  ({})", notes.join("; "))
        }
    ));
    if quiet {
        return out;
    }
    if drain_enabled {
        out.push_str(&format!("  pass 1 evicts: {}\n", list(&n.evict_device)));
        out.push_str(&format!("  pass 2 evicts: {}\n", list(&n.evict_other)));
    }
    for l in &n.left {
        out.push_str(&format!("  left in place: {} ({})\n", l.pod, l.why));
    }
    for b in &n.blockers {
        out.push_str(&format!("  {} {b}\n", pal.paint("BLOCKER:", RED)));
    }
    for h in &n.ungated_holders {
        out.push_str(&format!(
            "  {} pod {}: {}\n",
            pal.paint("UNGATED:", RED),
            h.pod,
            h.message
        ));
    }
    if !n.dra_plugin.is_empty() {
        out.push_str(&format!(
            "  after the swap: restarts the DRA plugin ({}) and waits until its ResourceSlices list every card\n",
            n.dra_plugin.join(", ")
        ));
    }
    out
}

/// Owned nodes that need no cordon or drain (empty when there are none).
fn without_drain_section(p: &RolloutPlan, pal: Palette) -> String {
    if p.without_drain.is_empty() {
        return String::new();
    }
    let mut out = String::from("\nNo cordon or drain:\n");
    let mut t = Table::new(&["NODE", "WHY", "DETAIL"]);
    for n in &p.without_drain {
        t.plain_row(vec![n.name.clone(), n.kind.clone(), n.detail.clone()]);
    }
    out.push_str(&t.render(pal, 2));
    out
}

/// Nodes the policy selects but leaves alone (empty when there are none);
/// of the ordinary nodes without a device, only the first few.
fn skipped_section(p: &RolloutPlan, pal: Palette) -> String {
    if p.skipped.is_empty() {
        return String::new();
    }
    let mut out = String::from("\nSkipped:\n");
    let mut t = Table::new(&["NODE", "WHY", "DETAIL"]);
    // A selector such as `{}` matches every ordinary node: list a few.
    const SHOWN: usize = 10;
    let ordinary = p
        .skipped
        .iter()
        .filter(|n| n.kind == "NotTenstorrent")
        .count();
    let mut seen = 0;
    for n in &p.skipped {
        if n.kind == "NotTenstorrent" {
            seen += 1;
            if ordinary > SHOWN && seen > SHOWN {
                continue;
            }
        }
        t.row(vec![
            (n.name.clone(), anstyle::Style::new()),
            (n.kind.clone(), style::DIM),
            (n.detail.clone(), anstyle::Style::new()),
        ]);
    }
    out.push_str(&t.render(pal, 2));
    if ordinary > SHOWN {
        out.push_str(&format!(
            "  … and {} more nodes without a Tenstorrent device (-o json lists them)\n",
            ordinary - SHOWN
        ));
    }
    out
}

/// The estimated duration and how it was reached, with the soak it counts.
fn estimate_section(p: &RolloutPlan, stalls: bool, pal: Palette) -> String {
    let e = &p.estimate;
    let mut out = String::new();
    if stalls && e.waves == 0 {
        out.push_str("\nEstimated duration: none: the rollout would stall before its first node\n");
    } else if e.waves == 0 {
        out.push_str(&format!(
            "\nEstimated duration: {} ({})\n",
            pal.paint(&human(e.seconds), BOLD),
            per_node_text(&e.per_node),
        ));
    } else if e.per_node.basis == Basis::Model {
        // Nothing observed: the estimate is the model's line marked
        // "← applies" below, so the plan shows one figure, not two.
        out.push_str(&format!(
            "\nEstimated duration{}: {} = the model below, build-ahead {} (no node cycle observed yet)\n",
            if stalls {
                " until the rollout stalls"
            } else {
                ""
            },
            pal.paint(&human(e.seconds), BOLD),
            if p.build_ahead.enabled { "on" } else { "off" },
        ));
    } else {
        out.push_str(&format!(
            "\nEstimated duration{}: {} = {} wave{} of at most {} node{} × {}\n",
            if stalls {
                " until the rollout stalls"
            } else {
                ""
            },
            pal.paint(&human(e.seconds), BOLD),
            e.waves,
            if e.waves == 1 { "" } else { "s" },
            e.slots,
            if e.slots == 1 { "" } else { "s" },
            per_node_text(&e.per_node),
        ));
        out.push_str(
            "  (observed cycles include the builds as they happened; the model below is for comparison)\n",
        );
    }
    if e.soak_seconds > 0 {
        out.push_str(&format!(
            "  including {} of soak (upgradePolicy.soakSeconds after each wave but the last)\n",
            human(e.soak_seconds)
        ));
    }
    out
}

fn plural(n: usize, one: &str, many: &str) -> String {
    format!("{n} {}", if n == 1 { one } else { many })
}

/// The build-ahead part of `plan`: what is prepared, and the duration with and
/// without build-ahead under the stated model.
fn build_ahead(p: &RolloutPlan, stalls: bool, pal: Palette) -> String {
    let b = &p.build_ahead;
    let mut out = format!(
        "\nBuild ahead: {}",
        if b.enabled {
            format!(
                "on (upgradePolicy.prepare, {} at once)",
                plural(b.max_concurrent, "node", "nodes")
            )
        } else {
            "off (upgradePolicy.prepare.enabled: false): each build happens inside its node's cordon"
                .into()
        }
    );
    if !p.nodes.is_empty() {
        out.push_str(&format!(
            " · prepared for {}: {} of {}",
            p.target_version,
            b.prepared,
            plural(p.nodes.len(), "node", "nodes"),
        ));
    }
    out.push('\n');
    if b.preparing_version.as_deref() != Some(p.target_version.as_str()) && !p.nodes.is_empty() {
        out.push_str(&format!(
            "  ({} is not the version the controller acts on ({}): nothing is built ahead for it)\n",
            p.target_version,
            b.preparing_version.as_deref().unwrap_or("none yet")
        ));
    }
    let waves = p.estimate.waves;
    if waves == 0 {
        return out;
    }
    let c = &b.costs;
    let x = &b.prediction;
    // The model's line is the estimate only when no cycle was observed;
    // otherwise it marks the policy's setting, for comparison.
    let observed = p.estimate.per_node.basis != Basis::Model;
    let h = |s: i64| human(s);
    out.push_str(&format!(
        "{}{} (per node: build {}, load {}, pod replacement {}, drain {}):\n",
        if observed {
            "Model, for comparison"
        } else {
            "Model"
        },
        if stalls {
            " until the rollout stalls"
        } else {
            ""
        },
        h(c.build),
        h(c.load),
        h(c.pod_replacement),
        h(c.drain),
    ));
    let n_waves = plural(waves, "wave", "waves");
    let cycle = format!("{} drain + {} load", h(c.drain), h(c.load));
    let with = if x.build_bound {
        format!(
            "{n_waves} × ({cycle}) + {} waiting for builds ({} at once, {} each with the pod replacement)",
            h(x.with_build_ahead - waves as i64 * (c.drain + c.load)),
            b.max_concurrent,
            h(c.pod_replacement + c.build),
        )
    } else if x.first_build > 0 {
        format!(
            "{} first build (with the pod replacement) + {n_waves} × ({cycle})",
            h(x.first_build)
        )
    } else {
        format!("{n_waves} × ({cycle}), the first wave prepared")
    };
    let without = if x.prepared_waves == 0 {
        format!(
            "{n_waves} × ({} drain + {} pod replacement + {} build + {} load)",
            h(c.drain),
            h(c.pod_replacement),
            h(c.build),
            h(c.load)
        )
    } else {
        format!(
            "{n_waves} × ({} drain + {} pod replacement + {} load) + {} × {} build ({} prepared)",
            h(c.drain),
            h(c.pod_replacement),
            h(c.load),
            waves - x.prepared_waves,
            h(c.build),
            plural(x.prepared_waves, "wave", "waves")
        )
    };
    let applies = |on: bool| {
        if on != b.enabled {
            String::new()
        } else if observed {
            format!("  {}", pal.paint("← this policy's setting", BOLD))
        } else if b.enabled {
            format!("  {}", pal.paint("← applies", BOLD))
        } else {
            format!("  {}", pal.paint("← applies (build-ahead is off)", BOLD))
        }
    };
    let (w, wo) = (h(x.with_build_ahead), h(x.without_build_ahead));
    let width = w.len().max(wo.len());
    out.push_str(&format!(
        "  with build-ahead     {w:>width$} = {with}{}\n",
        applies(true)
    ));
    out.push_str(&format!(
        "  without build-ahead  {wo:>width$} = {without}{}\n",
        applies(false)
    ));
    out.push_str(&format!(
        "  Model: waves of at most {} one after another. Without build-ahead, a cordon holds\n  \
         the drain, the installer pod's replacement, the build and the load. With it, the pods\n  \
         are replaced and the builds run before the cordons, {} at once; a wave is cordoned\n  \
         once its nodes are prepared and holds the drain and a load from the cache. Prepared\n  \
         nodes skip the build either way. Figures: --build-seconds, --load-seconds,\n  \
         --pod-seconds, --drain-seconds.\n",
        plural(p.max_unavailable, "node", "nodes"),
        b.max_concurrent
    ));
    out
}

#[cfg(test)]
mod prepared_tests {
    use super::*;
    use ttdrv_api::NodeState;

    fn row(host_managed: bool, state: NodeState) -> NodeRow {
        NodeRow {
            name: "n1".into(),
            state,
            host_managed,
            current_version: Some("2.8.0".into()),
            target_version: "2.8.0".into(),
            install_mode: None,
            prepared_version: None,
            next_kernel_build_failed: None,
            since: None,
            seconds_in_state: None,
            retry_requested: false,
            cycle_started: None,
            reason: None,
            message: None,
            drain_times_out_in: None,
            firmware_version: None,
            firmware_state: None,
        }
    }

    /// `status` and `nodes` name a blocked drain's pod and budget, and the
    /// time left before it times out (from the node's Draining since and the
    /// policy's drain.timeoutSeconds).
    #[test]
    fn status_shows_a_blocked_drain_and_its_time_left() {
        let msg = "eviction blocked: PodDisruptionBudget ml/web refuses to evict ml/web-0";
        let p: ttdrv_api::TenstorrentDriverPolicy = serde_json::from_value(serde_json::json!({
            "apiVersion": "tenstorrent.com/v1alpha1",
            "kind": "TenstorrentDriverPolicy",
            "metadata": { "name": "fleet" },
            "spec": { "version": "2.8.0", "upgradePolicy": { "drain": { "timeoutSeconds": 600 } } },
            "status": { "nodes": [
                { "name": "n1", "state": "Draining", "reason": "EvictionBlocked", "message": msg,
                  "lastTransitionTime": "2026-01-01T00:00:00Z" },
                { "name": "n2", "state": "Draining", "reason": "Drain",
                  "lastTransitionTime": "2026-01-01T00:00:00Z" },
            ] }
        }))
        .expect("a policy");
        // 10 s after n1 entered Draining.
        let now = 1_767_225_610;
        let v = crate::view::policy_view(&p, &[], now);
        assert_eq!(v.nodes[0].drain_times_out_in, Some(590));
        assert_eq!(v.nodes[1].drain_times_out_in, None, "not blocked");
        let want = format!("BLOCKED n1: {msg}; the drain times out in {}", human(590));
        let out = status(std::slice::from_ref(&v), Palette::PLAIN);
        assert!(out.contains(&want), "{out}");
        assert!(!out.contains("BLOCKED n2"), "{out}");
        let out = nodes(&v, Palette::PLAIN);
        assert!(out.contains(&want), "{out}");
    }

    /// A DKMS-managed node at the target built nothing of ours: not `yes`.
    #[test]
    fn prepared_is_yes_only_on_nodes_we_install() {
        assert_eq!(prepared_cell(&row(false, NodeState::Done)).0, "yes");
        assert_eq!(prepared_cell(&row(true, NodeState::Done)).0, "-");
        assert_eq!(prepared_cell(&row(false, NodeState::Unmanaged)).0, "-");
    }
}
