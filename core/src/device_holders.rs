//! Which pods will still hold a node's device once its deploy gates close
//! and its drain runs, named before the node's first cordon: DaemonSet pods
//! whose DaemonSet's template holds the device (privileged or with the
//! host's /dev on Tenstorrent nodes, a hostPath under /dev/tenstorrent, the
//! device-use rules: [`crate::drain::holds_device`]) and follows none of the
//! configured deploy gates (`controller.deployGates`). No drain evicts a
//! DaemonSet pod (it would come straight back), so the agent would refuse
//! the swap with `DeviceBusy`. Pure: the controller says it in the node's
//! message and one Event, `kubectl tt driver plan` prints it; the agent's
//! own holder check stays the hard stop.

use crate::drain::{DaemonSets, PodFacts, PodRef, daemon_set_of};
use ttdrv_api::labels;

/// What a holding DaemonSet lacks to be stood down by the gates.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Lacks {
    /// Its template follows these gate keys, none of them configured (the
    /// fabric manager 0.2.29+ with only the telemetry key configured).
    Unconfigured(Vec<String>),
    /// Its template follows no deploy gate at all.
    NoGate,
}

/// A DaemonSet whose pod on the node will still hold the device.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct UngatedHolder {
    /// The DaemonSet, `namespace/name`.
    pub daemon_set: PodRef,
    /// Its pod on the node.
    pub pod: PodRef,
    pub lacks: Lacks,
}

impl UngatedHolder {
    /// The gate key to add to `controller.deployGates` (for a DaemonSet
    /// with no gate, the key it should follow).
    pub fn key(&self) -> String {
        match &self.lacks {
            Lacks::Unconfigured(keys) => keys
                .iter()
                .find(|k| k.starts_with(labels::DEPLOY_GATE_PREFIX))
                .or(keys.first())
                .cloned()
                .unwrap_or_default(),
            Lacks::NoGate => format!("{}{}", labels::DEPLOY_GATE_PREFIX, self.daemon_set.name),
        }
    }

    /// What a person reads: which DaemonSet, and what to add where.
    pub fn describe(&self) -> String {
        format!(
            "DaemonSet {} holds the device and {}",
            self.daemon_set,
            self.remedy()
        )
    }

    /// The gate it lacks, and what to add where.
    pub fn remedy(&self) -> String {
        let key = self.key();
        match &self.lacks {
            Lacks::Unconfigured(_) => format!(
                "follows the deploy gate {key}, which is not configured: add {key} to controller.deployGates"
            ),
            Lacks::NoGate => format!(
                "has no deploy gate: add `{key} NotIn [\"false\"]` to every term of its \
                 required node affinity, and {key} to controller.deployGates"
            ),
        }
    }
}

/// The DaemonSet pods among `pods` (one node's) that will still hold the
/// device once the configured `gates` close and the drain runs, by pod.
/// Not ours (installer and validation pods, pods of the `exempt`
/// namespaces the drain leaves: the operator's), not finished or going.
/// A pod whose DaemonSet the index does not know is not named.
pub fn ungated_holders(
    pods: &[&PodFacts],
    daemon_sets: &DaemonSets,
    gates: &[String],
    exempt: &[String],
) -> Vec<UngatedHolder> {
    let mut out: Vec<UngatedHolder> = pods
        .iter()
        .filter(|p| !p.installer && p.validation.is_none() && !p.finished && !p.deleting)
        .filter(|p| !exempt.contains(&p.pod.namespace))
        .filter_map(|p| holder(p, daemon_sets, gates))
        .collect();
    out.sort_by(|a, b| a.daemon_set.cmp(&b.daemon_set));
    out
}

fn holder(p: &PodFacts, daemon_sets: &DaemonSets, gates: &[String]) -> Option<UngatedHolder> {
    let ds = daemon_set_of(p, daemon_sets)?;
    if !(ds.holds_device || p.device) {
        return None;
    }
    Some(UngatedHolder {
        daemon_set: p.daemon_set_ref()?,
        pod: p.pod.clone(),
        lacks: lacks(ds, gates)?,
    })
}

/// What the DaemonSet lacks to be stood down by the configured `gates`
/// (`None`: it follows one of them).
fn lacks(ds: &crate::drain::DaemonSetFacts, gates: &[String]) -> Option<Lacks> {
    if ds.gate_keys.iter().any(|k| gates.contains(k)) {
        None
    } else if ds.gate_keys.is_empty() {
        Some(Lacks::NoGate)
    } else {
        Some(Lacks::Unconfigured(ds.gate_keys.to_vec()))
    }
}

/// One line naming every ungated holder, for a node's status message.
pub fn summary(holders: &[UngatedHolder]) -> Option<String> {
    (!holders.is_empty()).then(|| {
        format!(
            "warning: after the gates close and the drain, {} will still hold the device \
             and the agent will refuse the swap (DeviceBusy): {}",
            if holders.len() == 1 {
                "1 DaemonSet pod".to_string()
            } else {
                format!("{} DaemonSet pods", holders.len())
            },
            holders
                .iter()
                .map(UngatedHolder::describe)
                .collect::<Vec<_>>()
                .join("; ")
        )
    })
}

/// What a `DeviceBusy` refusal's holders (the agent's words: `in pod ns/name`
/// or `in pod uid U`) are, when they are DaemonSet pods of the node: each
/// DaemonSet, and the gate it lacks (or that it follows a gate and should
/// have left). `None` when no holder is a known DaemonSet's pod. The
/// refusal is the proof that the pod holds the device: its DaemonSet is
/// named whether or not its template looked like a holder's (a privileged
/// DaemonSet that selects nodes by hostname only, say).
pub fn explain_busy(
    message: &str,
    pods: &[&PodFacts],
    daemon_sets: &DaemonSets,
    gates: &[String],
) -> Option<String> {
    let named = |p: &&&PodFacts| {
        message.contains(&format!("in pod {}", p.pod))
            || (!p.uid.is_empty() && message.contains(&format!("in pod uid {}", p.uid)))
    };
    let mut notes: Vec<String> = vec![];
    for p in pods.iter().filter(named) {
        let (Some(r), Some(ds)) = (p.daemon_set_ref(), daemon_set_of(p, daemon_sets)) else {
            continue;
        };
        let note = match lacks(ds, gates) {
            Some(lacks) => {
                let h = UngatedHolder {
                    daemon_set: r.clone(),
                    pod: p.pod.clone(),
                    lacks,
                };
                format!("pod {} is of DaemonSet {r}: it {}", p.pod, h.remedy())
            }
            None => format!(
                "pod {} is of DaemonSet {r}, which follows the deploy gate {} (not yet gone from the node?)",
                p.pod,
                ds.gate_keys
                    .iter()
                    .filter(|k| gates.contains(k))
                    .cloned()
                    .collect::<Vec<_>>()
                    .join(", ")
            ),
        };
        if !notes.contains(&note) {
            notes.push(note);
        }
    }
    (!notes.is_empty()).then(|| notes.join("; "))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::drain::{self, DaemonSetFacts};
    use k8s_openapi::api::apps::v1::{DaemonSet, DaemonSetSpec};
    use k8s_openapi::api::core::v1::{
        Affinity, Container, HostPathVolumeSource, NodeAffinity, NodeSelector,
        NodeSelectorRequirement, NodeSelectorTerm, Pod, PodSpec, PodTemplateSpec, SecurityContext,
        Volume,
    };
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::{ObjectMeta, OwnerReference};

    const TELEMETRY: &str = "tenstorrent.com/deploy.tt-telemetry";
    const FABRIC: &str = "tenstorrent.com/deploy.tt-fabric-manager";

    fn not_false(key: &str) -> NodeSelectorRequirement {
        NodeSelectorRequirement {
            key: key.into(),
            operator: "NotIn".into(),
            values: Some(vec!["false".into()]),
        }
    }

    /// A DaemonSet template: privileged or not, a hostPath, and its
    /// required node-affinity terms (each a list of gate keys).
    fn ds(privileged: bool, host_path: Option<&str>, terms: &[&[&str]]) -> DaemonSet {
        let affinity = (!terms.is_empty()).then(|| Affinity {
            node_affinity: Some(NodeAffinity {
                required_during_scheduling_ignored_during_execution: Some(NodeSelector {
                    node_selector_terms: terms
                        .iter()
                        .map(|keys| NodeSelectorTerm {
                            match_expressions: Some(keys.iter().map(|k| not_false(k)).collect()),
                            ..Default::default()
                        })
                        .collect(),
                }),
                ..Default::default()
            }),
            ..Default::default()
        });
        DaemonSet {
            spec: Some(DaemonSetSpec {
                template: PodTemplateSpec {
                    spec: Some(PodSpec {
                        affinity,
                        // On Tenstorrent nodes only, as the stack's charts.
                        node_selector: Some(
                            [(labels::TT_PCI_PRESENT.to_string(), "true".to_string())].into(),
                        ),
                        containers: vec![Container {
                            name: "c".into(),
                            security_context: privileged.then(|| SecurityContext {
                                privileged: Some(true),
                                ..Default::default()
                            }),
                            ..Default::default()
                        }],
                        volumes: host_path.map(|p| {
                            vec![Volume {
                                name: "dev".into(),
                                host_path: Some(HostPathVolumeSource {
                                    path: p.into(),
                                    type_: None,
                                }),
                                ..Default::default()
                            }]
                        }),
                        ..Default::default()
                    }),
                    ..Default::default()
                },
                ..Default::default()
            }),
            ..Default::default()
        }
    }

    /// A pod of DaemonSet `owner` in namespace `ns`, as the DaemonSet
    /// controller makes it: its affinity names its node only.
    fn pod(ns: &str, name: &str, owner: Option<&str>, labels: &[(&str, &str)]) -> PodFacts {
        let mut f = PodFacts::of(&Pod {
            metadata: ObjectMeta {
                namespace: Some(ns.into()),
                name: Some(name.into()),
                uid: Some(format!("uid-{name}")),
                labels: Some(
                    labels
                        .iter()
                        .map(|(k, v)| (k.to_string(), v.to_string()))
                        .collect(),
                ),
                owner_references: owner.map(|o| {
                    vec![OwnerReference {
                        kind: "DaemonSet".into(),
                        name: o.into(),
                        controller: Some(true),
                        ..Default::default()
                    }]
                }),
                ..Default::default()
            },
            spec: Some(PodSpec::default()),
            status: None,
        });
        f.pod.namespace = ns.into();
        f
    }

    fn index(entries: &[(&str, &str, DaemonSet)]) -> DaemonSets {
        entries
            .iter()
            .map(|(ns, name, d)| {
                (
                    PodRef {
                        namespace: ns.to_string(),
                        name: name.to_string(),
                    },
                    DaemonSetFacts::of(d),
                )
            })
            .collect()
    }

    #[test]
    fn template_facts_read_gates_in_every_term_and_device_holding() {
        // The telemetry chart: the gate in both arms of its OR.
        let f = DaemonSetFacts::of(&ds(true, None, &[&[TELEMETRY], &[TELEMETRY, "x"]]));
        assert_eq!(f.gate_keys.as_ref(), [TELEMETRY.to_string()]);
        assert!(f.holds_device, "privileged");
        // A key in one term only does not stand the pod down.
        let f = DaemonSetFacts::of(&ds(false, Some("/dev/"), &[&[TELEMETRY], &["other"]]));
        assert!(f.gate_keys.is_empty(), "{f:?}");
        assert!(f.holds_device, "hostPath /dev");
        let f = DaemonSetFacts::of(&ds(false, Some("/dev/tenstorrent/0"), &[]));
        assert!(f.holds_device && f.gate_keys.is_empty());
        // Privileged on every node (kube-proxy, a CNI): not taken for a
        // holder; under /dev/tenstorrent it is, wherever it runs.
        let fleet_wide = |mut d: DaemonSet| {
            if let Some(s) = d.spec.as_mut().and_then(|s| s.template.spec.as_mut()) {
                s.node_selector = None;
            }
            DaemonSetFacts::of(&d)
        };
        assert!(!fleet_wide(ds(true, None, &[])).holds_device);
        assert!(!fleet_wide(ds(false, Some("/dev"), &[])).holds_device);
        assert!(fleet_wide(ds(false, Some("/dev/tenstorrent"), &[])).holds_device);
        // A Tenstorrent deploy gate says where it runs as well.
        assert!(fleet_wide(ds(true, None, &[&[TELEMETRY]])).holds_device);
        let f = DaemonSetFacts::of(&ds(false, Some("/var/log"), &[&[FABRIC]]));
        assert!(!f.holds_device);
        assert_eq!(f.gate_keys.as_ref(), [FABRIC.to_string()]);
        // In operator but not "false": not a gate.
        let mut d = ds(false, None, &[]);
        d.spec
            .as_mut()
            .and_then(|s| s.template.spec.as_mut())
            .map(|s| {
                s.affinity = ds(false, None, &[&[FABRIC]]).spec?.template.spec?.affinity;
                s.affinity
                    .as_mut()?
                    .node_affinity
                    .as_mut()?
                    .required_during_scheduling_ignored_during_execution
                    .as_mut()?
                    .node_selector_terms[0]
                    .match_expressions
                    .as_mut()?[0]
                    .values = Some(vec!["true".into()]);
                Some(())
            });
        assert!(DaemonSetFacts::of(&d).gate_keys.is_empty());
    }

    fn stack() -> (Vec<PodFacts>, DaemonSets) {
        let pods = vec![
            pod("tt", "telemetry-a", Some("telemetry"), &[]),
            pod("tt", "fabric-a", Some("fabric-agent"), &[]),
            pod("mon", "exporter-a", Some("exporter"), &[]),
            pod("kube-system", "proxy-a", Some("kube-proxy"), &[]),
            pod("ml", "train", None, &[]),
            pod("tt-system", "ours-a", Some("helper"), &[]),
            pod(
                "tt-system",
                "installer-a",
                Some("ttdrv-fleet"),
                &[(labels::CLAIM, "fleet")],
            ),
            pod("tt", "unknown-a", Some("not-in-index"), &[]),
        ];
        let daemon_sets = index(&[
            (
                "tt",
                "telemetry",
                ds(true, None, &[&[TELEMETRY], &[TELEMETRY]]),
            ),
            ("tt", "fabric-agent", ds(true, None, &[&[FABRIC]])),
            ("mon", "exporter", ds(false, Some("/dev"), &[])),
            ("kube-system", "kube-proxy", ds(true, None, &[])),
            ("tt-system", "helper", ds(true, None, &[])),
            ("tt-system", "ttdrv-fleet", ds(true, None, &[])),
        ]);
        (pods, daemon_sets)
    }

    #[test]
    fn names_each_ungated_holder_and_the_gate_it_lacks() {
        let (pods, daemon_sets) = stack();
        let refs: Vec<&PodFacts> = pods.iter().collect();
        let exempt = ["tt-system".to_string()];
        let gates = [TELEMETRY.to_string()];
        let holders = ungated_holders(&refs, &daemon_sets, &gates, &exempt);
        let named: Vec<(String, String)> = holders
            .iter()
            .map(|h| (h.daemon_set.to_string(), h.key()))
            .collect();
        assert_eq!(
            named,
            [
                (
                    "kube-system/kube-proxy".to_string(),
                    "tenstorrent.com/deploy.kube-proxy".to_string()
                ),
                (
                    "mon/exporter".to_string(),
                    "tenstorrent.com/deploy.exporter".to_string()
                ),
                ("tt/fabric-agent".to_string(), FABRIC.to_string()),
            ]
        );
        let fabric = &holders[2];
        assert_eq!(fabric.pod.to_string(), "tt/fabric-a");
        assert_eq!(
            fabric.describe(),
            "DaemonSet tt/fabric-agent holds the device and follows the deploy gate \
             tenstorrent.com/deploy.tt-fabric-manager, which is not configured: add \
             tenstorrent.com/deploy.tt-fabric-manager to controller.deployGates"
        );
        assert!(
            holders[1].describe().contains(
                "has no deploy gate: add `tenstorrent.com/deploy.exporter NotIn [\"false\"]`"
            ),
            "{}",
            holders[1].describe()
        );
        // Both keys configured: only the ungated ones are left.
        let both = [TELEMETRY.to_string(), FABRIC.to_string()];
        let holders = ungated_holders(&refs, &daemon_sets, &both, &exempt);
        assert!(
            holders.iter().all(|h| h.lacks == Lacks::NoGate),
            "{holders:?}"
        );
        assert_eq!(holders.len(), 2);
        let line = summary(&holders).expect("two holders");
        assert!(line.contains("2 DaemonSet pods"), "{line}");
        assert_eq!(summary(&[]), None);
    }

    #[test]
    fn the_drain_blockers_read_the_daemon_sets_template() {
        let (pods, daemon_sets) = stack();
        let refs: Vec<&PodFacts> = pods.iter().collect();
        let plan = drain::plan_drain(
            refs.iter().copied(),
            &ttdrv_api::DrainPolicy::default(),
            &ttdrv_api::PodSelector::default(),
            &["tt-system".to_string()],
            &[],
        );
        let left = |gates: &[String]| -> Vec<String> {
            drain::blockers(
                &plan,
                &refs,
                &[],
                &ttdrv_api::DrainPolicy::default(),
                &daemon_sets,
                gates,
            )
            .iter()
            .filter_map(|b| match b {
                drain::Blocker::DeviceUserLeft { pod } => Some(pod.to_string()),
                _ => None,
            })
            .collect()
        };
        assert_eq!(
            left(&[TELEMETRY.to_string()]),
            ["kube-system/proxy-a", "mon/exporter-a", "tt/fabric-a"]
        );
        assert_eq!(
            left(&[TELEMETRY.to_string(), FABRIC.to_string()]),
            ["kube-system/proxy-a", "mon/exporter-a"]
        );
        // A gate the template follows counts only when configured.
        assert_eq!(left(&[]).len(), 4);
    }

    #[test]
    fn a_busy_refusal_names_the_daemon_set_and_its_missing_gate() {
        let (pods, daemon_sets) = stack();
        let refs: Vec<&PodFacts> = pods.iter().collect();
        let gates = [TELEMETRY.to_string()];
        let msg =
            "DeviceBusy: pid 7 (fm-agent) in pod tt/fabric-a; pid 9 (python) in pod uid uid-train";
        let note = explain_busy(msg, &refs, &daemon_sets, &gates).expect("a DaemonSet's pod");
        assert_eq!(
            note,
            "pod tt/fabric-a is of DaemonSet tt/fabric-agent: it follows the deploy gate \
             tenstorrent.com/deploy.tt-fabric-manager, which is not configured: add \
             tenstorrent.com/deploy.tt-fabric-manager to controller.deployGates"
        );
        // By UID, and a gated DaemonSet's pod said as such.
        let msg = "pid 3 (collector) in pod uid uid-telemetry-a";
        let note = explain_busy(msg, &refs, &daemon_sets, &gates).expect("by uid");
        assert!(
            note.contains("DaemonSet tt/telemetry, which follows the deploy gate tenstorrent.com/deploy.tt-telemetry"),
            "{note}"
        );
        // A privileged DaemonSet that selects its node by hostname only is
        // not taken for a holder before the cordon, but the agent found its
        // pod holding the device: it is named, with the gate it lacks
        // (found by the VM node test: it was said to follow "the deploy
        // gate " of none).
        let mut by_host = ds(true, None, &[]);
        if let Some(spec) = by_host.spec.as_mut().and_then(|s| s.template.spec.as_mut()) {
            spec.node_selector = Some([("kubernetes.io/hostname".into(), "n1".into())].into());
        }
        let legacy_ds = index(&[("tt", "fabric-legacy", by_host)]);
        assert!(
            !legacy_ds.values().any(|d| d.holds_device),
            "not a holder by its template"
        );
        let legacy = pod("tt", "fabric-legacy-x", Some("fabric-legacy"), &[]);
        let note = explain_busy(
            "pid 4 (map-hold) in pod tt/fabric-legacy-x",
            &[&legacy],
            &legacy_ds,
            &gates,
        )
        .expect("named by the refusal");
        assert!(
            note.starts_with(
                "pod tt/fabric-legacy-x is of DaemonSet tt/fabric-legacy: it has no deploy gate"
            ),
            "{note}"
        );
        // A bare pod: nothing to add.
        assert_eq!(
            explain_busy(
                "pid 9 (python) in pod ml/train",
                &refs,
                &daemon_sets,
                &gates
            ),
            None
        );
    }
}
