//! The scheduling surface of a node: what the scheduler can see of its cards,
//! checked after a swap before the node goes back into service.
//!
//! On a Tenstorrent stack the cards reach the scheduler through the DRA
//! kubelet plugin's ResourceSlices (driver `tenstorrent.com`), or through a
//! device plugin's `tenstorrent.com/*` extended resources. After a swap the
//! DRA plugin keeps publishing what it read before (the Go operator's docs
//! leave `kubectl rollout restart` of it to a person): the controller
//! restarts the node's plugin pod and waits until the node's slices list as
//! many devices as the agent counted cards, and the node's allocatable shows
//! as many extended resources, before the uncordon. A node where nothing
//! publishes has no surface to check.
//!
//! The DRA plugin reads the cards' topology from the fabric-manager agent,
//! which the deploy gates stood down for the swap, and keeps what it
//! published before when the agent does not answer. So the gates open
//! first, the node still cordoned; the plugin is restarted only once every
//! DaemonSet the gates stood down has a Ready pod on the node again.

use k8s_openapi::api::resource::v1::ResourceSlice;
use ttdrv_api::labels;

use crate::drain::{self, DaemonSets, PodFacts, PodRef};

/// Who publishes the cards, as the controller is configured.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SurfaceConfig {
    /// The DRA kubelet plugin's pods: every `key=value` must match
    /// (`--dra-plugin-selector`; the tt-dra-driver chart's labels by default).
    pub plugin_selector: Vec<(String, String)>,
    /// The DRA driver whose ResourceSlices list the cards (`--dra-driver`).
    pub driver: String,
}

impl Default for SurfaceConfig {
    fn default() -> Self {
        Self {
            plugin_selector: parse_selector(labels::DEFAULT_DRA_PLUGIN_SELECTOR)
                .unwrap_or_default(),
            driver: labels::DEFAULT_DRA_DRIVER.to_string(),
        }
    }
}

/// `key=value[,key=value...]`, the equality-based label selector; the error
/// names the part that is not one.
pub fn parse_selector(s: &str) -> Result<Vec<(String, String)>, String> {
    let mut out = vec![];
    for part in s.split(',').map(str::trim).filter(|p| !p.is_empty()) {
        let (k, v) = part
            .split_once('=')
            .map(|(k, v)| (k.trim(), v.trim().trim_start_matches('=')))
            .filter(|(k, _)| !k.is_empty() && !k.contains('!'))
            .ok_or_else(|| format!("{part:?} is not key=value"))?;
        out.push((k.to_string(), v.to_string()));
    }
    if out.is_empty() {
        return Err(format!(
            "{s:?} selects nothing: expected key=value[,key=value]"
        ));
    }
    Ok(out)
}

/// One of the node's DRA plugin pods.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PublisherPod {
    pub pod: PodRef,
    /// Unix seconds.
    pub created: i64,
    /// Ready since (Unix seconds); None: not Ready.
    pub ready_since: Option<i64>,
    pub deleting: bool,
}

/// A pod on the node of a DaemonSet that follows a configured deploy gate
/// (the telemetry collector, the fabric-manager agent).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct StackPod {
    /// Its DaemonSet, `namespace/name`.
    pub daemon_set: String,
    pub ready: bool,
    pub deleting: bool,
}

/// The node's pods of DaemonSets that a configured gate stands down
/// ([`drain::stood_down`]), sorted by DaemonSet.
pub fn stack_pods(pods: &[&PodFacts], daemon_sets: &DaemonSets, gates: &[String]) -> Vec<StackPod> {
    if gates.is_empty() {
        return vec![];
    }
    let mut out: Vec<StackPod> = pods
        .iter()
        .filter(|p| !p.finished && drain::stood_down(p, daemon_sets, gates))
        .filter_map(|p| {
            Some(StackPod {
                daemon_set: format!("{}/{}", p.pod.namespace, p.daemon_set.as_deref()?),
                ready: p.daemon_run.is_some_and(|(_, ready)| ready.is_some()),
                deleting: p.deleting,
            })
        })
        .collect();
    out.sort_by(|a, b| a.daemon_set.cmp(&b.daemon_set));
    out
}

/// The DaemonSets whose pods a cycle starting now stands down (their pods
/// on the node, not already leaving), sorted, once each: what the cycle
/// waits for again before it restarts the DRA plugin.
pub fn standing(stack: &[StackPod]) -> Vec<String> {
    let mut out: Vec<String> = stack
        .iter()
        .filter(|p| !p.deleting)
        .map(|p| p.daemon_set.clone())
        .collect();
    out.sort();
    out.dedup();
    out
}

/// What the node shows the scheduler now.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Surface {
    /// The DRA driver whose slices count ([`SurfaceConfig::driver`]).
    pub driver: String,
    /// The DRA plugin's selector (`key=value,...`); empty: no plugin is
    /// restarted, and slices count as they are.
    pub plugin_selector: String,
    /// The cards the agent counted with the module it reported
    /// ([`labels::KMD_CARDS`]).
    pub cards: Option<u32>,
    /// The node's DRA plugin pods.
    pub plugin_pods: Vec<PublisherPod>,
    /// Devices in the node's ResourceSlices of the driver; None without any
    /// slice.
    pub dra_devices: Option<u32>,
    /// The node's allocatable `tenstorrent.com/*` extended resources, summed;
    /// None when it shows none.
    pub extended: Option<u32>,
    /// The node's pods of gated DaemonSets ([`stack_pods`]).
    pub stack: Vec<StackPod>,
}

impl Surface {
    /// Something publishes the node's cards: a DRA plugin pod or slice, or
    /// extended resources.
    pub fn published(&self) -> bool {
        !self.plugin_pods.is_empty() || self.dra_devices.is_some() || self.extended.is_some()
    }
}

/// The pod is one of the DRA plugin's ([`SurfaceConfig::plugin_selector`]).
pub fn is_plugin(config: &SurfaceConfig, pod: &PodFacts) -> bool {
    !config.plugin_selector.is_empty()
        && config
            .plugin_selector
            .iter()
            .all(|(k, v)| pod.labels.iter().any(|(pk, pv)| pk == k && pv == v))
}

/// What the check reads of one ResourceSlice of the driver.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SliceFacts {
    pub node: String,
    pub pool: String,
    pub generation: i64,
    pub devices: u32,
}

impl SliceFacts {
    /// None for another driver's slice, or one that names no node.
    pub fn of(slice: &ResourceSlice, driver: &str) -> Option<Self> {
        let spec = &slice.spec;
        if spec.driver != driver {
            return None;
        }
        Some(Self {
            node: spec.node_name.clone()?,
            pool: spec.pool.name.clone(),
            generation: spec.pool.generation,
            devices: u32::try_from(spec.devices.as_ref().map_or(0, Vec::len)).unwrap_or(u32::MAX),
        })
    }
}

/// Devices that one node's `slices` list: per pool, only the slices of its
/// newest generation count (older ones are being replaced). None without
/// any slice.
pub fn slice_devices<'a>(slices: impl IntoIterator<Item = &'a SliceFacts>) -> Option<u32> {
    let all: Vec<&SliceFacts> = slices.into_iter().collect();
    if all.is_empty() {
        return None;
    }
    let newest = |pool: &str| {
        all.iter()
            .filter(|s| s.pool == pool)
            .map(|s| s.generation)
            .max()
            .unwrap_or(0)
    };
    Some(
        all.iter()
            .filter(|s| s.generation == newest(&s.pool))
            .fold(0u32, |n, s| n.saturating_add(s.devices)),
    )
}

/// What the surface check says at one moment.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Verdict {
    /// Nothing publishes the node's cards: nothing to wait for.
    Unpublished,
    /// The node's DRA plugin pods from before the check: delete them (their
    /// DaemonSet starts a fresh one, which reads the new driver).
    Restart(Vec<PodRef>),
    /// Not whole yet, and why (for the message and, at the deadline, the
    /// failure).
    Short(String),
    /// The scheduler sees every card again.
    Whole,
}

/// How long a restarted DRA plugin is Ready before its node's slices are
/// read: a plugin publishes just after it starts, not necessarily before its
/// pod turns Ready, and a slice it has not rewritten yet is the old one.
pub const PLUGIN_SETTLE_SECONDS: i64 = 5;

/// The check at `now`, `since` being when it began (the swap validated,
/// the gates opened), `stood_down` the DaemonSets the cycle's gates stood
/// down ([`standing`] at its start).
pub fn check(s: &Surface, stood_down: &[String], since: i64, now: i64) -> Verdict {
    check_with(s, stood_down, since, now, true)
}

/// [`check`]; without `count_required`, a node whose agent reported no
/// card count (no driver policy of ours on it: a firmware flash on a node
/// whose tt-kmd someone else installs) is whole once its restarted plugin
/// has settled, its slices uncounted.
fn check_with(
    s: &Surface,
    stood_down: &[String],
    since: i64,
    now: i64,
    count_required: bool,
) -> Verdict {
    let driver = &s.driver;
    if !s.published() {
        return Verdict::Unpublished;
    }
    let restarts = !s.plugin_selector.is_empty();
    // A plugin restarted before the fabric-manager agent is back reads no
    // topology and keeps its old slices: the stack comes back first.
    let away: Vec<&str> = stood_down
        .iter()
        .filter(|ds| {
            !s.stack
                .iter()
                .any(|p| &p.daemon_set == *ds && p.ready && !p.deleting)
        })
        .map(String::as_str)
        .collect();
    if restarts && !away.is_empty() {
        return Verdict::Short(format!(
            "the deploy gates are open again; waiting for a Ready pod of {} on the node before the DRA plugin is restarted",
            away.join(", ")
        ));
    }
    // Creation times are whole seconds: a pod created in the check's first
    // second may be from before the check (before the swap, even), so it
    // is restarted too, once that second is over, when its replacement can
    // no longer be mistaken for it.
    let stale: Vec<PodRef> = s
        .plugin_pods
        .iter()
        .filter(|p| restarts && p.created <= since && !p.deleting)
        .map(|p| p.pod.clone())
        .collect();
    if !stale.is_empty() {
        if now <= since {
            return Verdict::Short(format!(
                "the DRA plugin ({}) is restarted once the second the check began in is over",
                s.plugin_selector
            ));
        }
        return Verdict::Restart(stale);
    }
    if s.cards.is_none() && count_required {
        return Verdict::Short("the agent has not reported how many cards it serves".into());
    }
    let mut short = vec![];
    let dra = !s.plugin_pods.is_empty() || s.dra_devices.is_some();
    if restarts && dra {
        // The slices of a plugin from before the swap say nothing of the
        // new driver: only a plugin started since, Ready for a moment.
        let settled = s
            .plugin_pods
            .iter()
            .filter(|p| p.created > since && !p.deleting)
            .find_map(|p| p.ready_since);
        match settled {
            None => short.push(format!(
                "no DRA plugin pod ({}) started since the swap is Ready yet",
                s.plugin_selector
            )),
            Some(t) if now - t < PLUGIN_SETTLE_SECONDS => short.push(format!(
                "the restarted DRA plugin is Ready since {}s; its slices are read after {PLUGIN_SETTLE_SECONDS}s",
                now - t
            )),
            Some(_) => {}
        }
    }
    if let (true, Some(cards)) = (dra, s.cards) {
        let listed = s.dra_devices.unwrap_or(0);
        if listed != cards {
            short.push(format!(
                "the node's ResourceSlices of {driver} list {listed} device(s), the agent counted {cards} card(s)"
            ));
        }
    }
    if let (Some(ext), Some(cards)) = (s.extended, s.cards)
        && ext != cards
    {
        short.push(format!(
            "the node's allocatable shows {ext} {}* resource(s), the agent counted {cards} card(s)",
            labels::RESOURCE_PREFIX
        ));
    }
    if short.is_empty() {
        Verdict::Whole
    } else {
        Verdict::Short(short.join("; "))
    }
}

/// How long a cycle waits for a whole surface by default
/// (`--scheduling-surface-timeout-seconds`).
pub const DEFAULT_TIMEOUT_SECONDS: i64 = 300;

/// What a cycle does next on its way back into service, whatever its kind
/// (a driver swap, a firmware flash): the same rules for both.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Next {
    /// Nothing to check, or the surface is whole: go on.
    Proceed,
    /// Open the deploy gates, the node still cordoned; the check starts
    /// now. The message.
    OpenGates(String),
    /// Restart these DRA plugin pods; the message.
    Restart(Vec<PodRef>, String),
    /// Not whole yet; the message.
    Wait(String),
    /// Not whole by the deadline; why (for the failure's message).
    Fail(String),
}

/// Where one cycle's check stands: the surface now, the gates, what the
/// cycle stood down, when the check began (None: not yet), and its bound.
#[derive(Clone, Copy, Debug)]
pub struct Progress<'a> {
    pub surface: &'a Surface,
    /// A configured deploy gate label is on the node.
    pub gates_present: bool,
    pub stood_down: &'a [String],
    pub since: Option<i64>,
    pub now: i64,
    pub timeout_seconds: i64,
    /// What the cards now run, for the messages (`tt-kmd 2.8.0`).
    pub what: &'a str,
    /// The agent's card count must be known (a driver cycle: its agent
    /// reports it with the module); a firmware flash checks without it
    /// where no agent of ours runs.
    pub count_required: bool,
}

/// The next step of a cordoned cycle once its work is done (the swap
/// validated, the flash read back): the gates open first, the stack comes
/// back, the DRA plugin restarts, and the node waits until the scheduler
/// sees every card, within the bound.
pub fn next(p: Progress<'_>) -> Next {
    if p.gates_present && p.surface.published() {
        return Next::OpenGates(format!(
            "opening the deploy gates on the still-cordoned node{}, before the DRA plugin republishes the cards of {}",
            if p.stood_down.is_empty() {
                String::new()
            } else {
                format!(" so that {} come(s) back", p.stood_down.join(", "))
            },
            p.what
        ));
    }
    let since = p.since.unwrap_or(p.now);
    match check_with(p.surface, p.stood_down, since, p.now, p.count_required) {
        Verdict::Unpublished | Verdict::Whole => Next::Proceed,
        Verdict::Restart(pods) => {
            let names: Vec<String> = pods.iter().map(ToString::to_string).collect();
            let msg = format!(
                "restarting the DRA plugin ({}) so that it publishes the cards of {}",
                names.join(", "),
                p.what
            );
            Next::Restart(pods, msg)
        }
        Verdict::Short(why) if p.now - since > p.timeout_seconds => Next::Fail(why),
        Verdict::Short(why) => Next::Wait(format!(
            "waiting for the scheduler to see every card: {why}"
        )),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Ready since `created + 1` when `ready`.
    fn pod(name: &str, created: i64, ready: bool) -> PublisherPod {
        PublisherPod {
            pod: PodRef {
                namespace: "tt".into(),
                name: name.into(),
            },
            created,
            ready_since: ready.then_some(created + 1),
            deleting: false,
        }
    }

    fn surface(cards: u32, pods: Vec<PublisherPod>, dra: Option<u32>) -> Surface {
        Surface {
            driver: "tenstorrent.com".into(),
            plugin_selector: "app.kubernetes.io/name=tt-dra-driver".into(),
            cards: Some(cards),
            plugin_pods: pods,
            dra_devices: dra,
            extended: None,
            stack: vec![],
        }
    }

    #[test]
    fn nothing_published_is_nothing_to_check() {
        assert_eq!(
            check(&Surface::default(), &[], 100, 200),
            Verdict::Unpublished
        );
    }

    #[test]
    fn the_plugin_from_before_the_swap_is_restarted_then_waited_for() {
        let old = surface(2, vec![pod("dra-a", 50, true)], Some(2));
        let Verdict::Restart(pods) = check(&old, &[], 100, 200) else {
            panic!("the old plugin's slices are stale even when the count matches")
        };
        assert_eq!(pods[0].name, "dra-a");
        // Deleting: not asked again, and no fresh pod yet.
        let mut deleting = old.clone();
        deleting.plugin_pods[0].deleting = true;
        assert!(
            matches!(check(&deleting, &[], 100, 200), Verdict::Short(m) if m.contains("started since the swap"))
        );
        // Gone, its slice still there (the count right): the old slice
        // says nothing of the new driver.
        let gone = surface(2, vec![], Some(2));
        assert!(
            matches!(check(&gone, &[], 100, 200), Verdict::Short(m) if m.contains("started since the swap"))
        );
        // Ready for less than the settle time: not yet.
        let settling = surface(2, vec![pod("dra-b", 101, true)], Some(2));
        assert!(
            matches!(check(&settling, &[], 100, 104), Verdict::Short(m) if m.contains("Ready since 2s"))
        );
        assert_eq!(
            check(&settling, &[], 100, 102 + PLUGIN_SETTLE_SECONDS),
            Verdict::Whole
        );
        let fresh = surface(2, vec![pod("dra-b", 101, false)], Some(2));
        assert!(matches!(check(&fresh, &[], 100, 200), Verdict::Short(_)));
        let ready = surface(2, vec![pod("dra-b", 101, true)], Some(2));
        assert_eq!(check(&ready, &[], 100, 200), Verdict::Whole);
    }

    #[test]
    fn the_plugin_is_restarted_only_once_the_stood_down_stack_is_back() {
        let fm = |ready: bool, deleting: bool| StackPod {
            daemon_set: "tt/tt-fabric-manager-agent".into(),
            ready,
            deleting,
        };
        let telemetry = StackPod {
            daemon_set: "tt/tt-telemetry".into(),
            ready: true,
            deleting: false,
        };
        let stood_down = standing(&[fm(true, false), telemetry.clone(), fm(true, false)]);
        assert_eq!(
            stood_down,
            ["tt/tt-fabric-manager-agent", "tt/tt-telemetry"],
            "once each, sorted"
        );
        let mut s = surface(2, vec![pod("dra-a", 50, true)], Some(2));
        // The agent's pod not back yet, or back but not Ready, or the old
        // one still leaving: the plugin waits, the message names it.
        for stack in [
            vec![telemetry.clone()],
            vec![telemetry.clone(), fm(false, false)],
            vec![telemetry.clone(), fm(true, true)],
        ] {
            s.stack = stack;
            let v = check(&s, &stood_down, 100, 200);
            assert!(
                matches!(&v, Verdict::Short(m) if m.contains("tt/tt-fabric-manager-agent") && !m.contains("tt/tt-telemetry")),
                "{v:?}"
            );
        }
        s.stack = vec![fm(true, false), telemetry];
        assert!(matches!(
            check(&s, &stood_down, 100, 200),
            Verdict::Restart(_)
        ));
        // What the cycle did not stand down is not waited for.
        s.stack = vec![];
        assert!(matches!(check(&s, &[], 100, 200), Verdict::Restart(_)));
    }

    #[test]
    fn next_opens_the_gates_first_and_counts_only_what_is_known() {
        let mut s = surface(2, vec![pod("dra-b", 101, true)], Some(1));
        let p = |s: &Surface, gates: bool, count_required: bool, now: i64| {
            next(Progress {
                surface: s,
                gates_present: gates,
                stood_down: &[],
                since: Some(100),
                now,
                timeout_seconds: 300,
                what: "firmware 19.8.0.0",
                count_required,
            })
        };
        assert!(
            matches!(p(&s, true, true, 200), Next::OpenGates(m) if m.contains("firmware 19.8.0.0"))
        );
        assert!(matches!(p(&s, false, true, 200), Next::Wait(m) if m.contains("list 1 device(s)")));
        assert!(matches!(p(&s, false, true, 401), Next::Fail(m) if m.contains("list 1 device(s)")));
        // No count from an agent (a flash on a node whose tt-kmd is not
        // ours): the settled plugin is all that can be asked; without
        // `count_required`, that is enough.
        s.cards = None;
        assert!(matches!(p(&s, false, true, 200), Next::Wait(m) if m.contains("how many cards")));
        assert_eq!(p(&s, false, false, 200), Next::Proceed);
        // Nothing published: nothing to open the gates early for.
        assert_eq!(p(&Surface::default(), true, true, 200), Next::Proceed);
    }

    #[test]
    fn one_card_short_is_short_and_says_both_counts() {
        let s = surface(2, vec![pod("dra-b", 101, true)], Some(1));
        let Verdict::Short(m) = check(&s, &[], 100, 200) else {
            panic!("one short")
        };
        assert!(
            m.contains("list 1 device(s)") && m.contains("counted 2 card(s)"),
            "{m}"
        );
        // No slice at all from a Ready plugin: 0 listed.
        let none = surface(2, vec![pod("dra-b", 101, true)], None);
        assert!(matches!(check(&none, &[], 100, 200), Verdict::Short(m) if m.contains("list 0")));
        // Without the agent's count nothing can be whole.
        let mut unknown = surface(2, vec![pod("dra-b", 101, true)], Some(2));
        unknown.cards = None;
        assert!(
            matches!(check(&unknown, &[], 100, 200), Verdict::Short(m) if m.contains("how many cards"))
        );
    }

    #[test]
    fn without_a_selector_nothing_is_restarted_and_slices_count_as_they_are() {
        let mut s = surface(2, vec![pod("dra-a", 50, true)], Some(2));
        s.plugin_selector = String::new();
        assert_eq!(check(&s, &[], 100, 200), Verdict::Whole);
        s.dra_devices = Some(1);
        assert!(matches!(check(&s, &[], 100, 200), Verdict::Short(_)));
    }

    #[test]
    fn extended_resources_must_show_every_card() {
        let mut s = surface(4, vec![], None);
        s.extended = Some(3);
        assert!(matches!(check(&s, &[], 100, 200), Verdict::Short(m) if m.contains("shows 3")));
        s.extended = Some(4);
        assert_eq!(check(&s, &[], 100, 200), Verdict::Whole);
    }

    #[test]
    fn slices_count_the_newest_generation_of_each_pool_on_the_node() {
        let slice = |node: &str, driver: &str, pool: &str, generation: i64, n: u32| {
            let mut s = crate::fixtures::resource_slice(node, driver, generation, n);
            s.spec.pool.name = pool.into();
            s
        };
        let all: Vec<SliceFacts> = [
            slice("n1", "tenstorrent.com", "n1", 1, 4),
            slice("n1", "tenstorrent.com", "n1", 2, 3),
            slice("n1", "gpu.example.com", "n1", 5, 8),
            slice("n2", "tenstorrent.com", "n2", 1, 2),
        ]
        .iter()
        .filter_map(|s| SliceFacts::of(s, "tenstorrent.com"))
        .collect();
        let on = |n: &str| slice_devices(all.iter().filter(|s| s.node == n));
        assert_eq!(on("n1"), Some(3), "the newest generation of n1's pool");
        assert_eq!(on("n2"), Some(2));
        assert_eq!(on("n3"), None);
    }

    #[test]
    fn selectors_parse_or_say_which_part_is_wrong() {
        assert_eq!(
            parse_selector("app.kubernetes.io/name=tt-dra-driver, tier=node").expect("ok"),
            [
                (
                    "app.kubernetes.io/name".to_string(),
                    "tt-dra-driver".to_string()
                ),
                ("tier".to_string(), "node".to_string())
            ]
        );
        assert!(parse_selector("app").expect_err("no =").contains("\"app\""));
        assert!(parse_selector("a!=b").is_err());
        assert!(parse_selector("").is_err());
        assert!(SurfaceConfig::default().plugin_selector.len() == 1);
    }
}
