//! Soak (`upgradePolicy.soakSeconds`): after a node is upgraded, the next
//! one starts only once it has served that long, and trouble on it during
//! that time halts the rollout. Pure: records and observations in, decisions out.

use ttdrv_api::NodeState;

use crate::machine::observation::{InstallerPod, Observation};
use crate::reason;
use crate::record::NodeRecord;

/// The node whose soak holds back the next start, and until when (Unix
/// seconds): of the nodes upgraded to `version`, the one upgraded last,
/// while `soak` seconds have not passed. None without a soak.
pub fn soaking<'a>(
    records: impl IntoIterator<Item = (&'a String, &'a NodeRecord)>,
    version: &str,
    soak: i64,
    now: i64,
) -> Option<(String, i64)> {
    if soak <= 0 {
        return None;
    }
    records
        .into_iter()
        .filter(|(_, r)| {
            r.state == NodeState::Done
                && r.reason.as_deref() == Some(reason::UPGRADED)
                && r.target == version
        })
        .map(|(n, r)| (n.clone(), r.since.saturating_add(soak)))
        .filter(|(_, until)| *until > now)
        .max_by_key(|(n, until)| (*until, std::cmp::Reverse(n.clone())))
}

/// Why the rollout waits for a soak, for the Pending nodes and the status.
pub fn waiting(node: &str, until: i64, soak: i64, now: i64) -> String {
    format!(
        "soaking: {node} was upgraded {}s ago; the next node starts in {}s (upgradePolicy.soakSeconds: {soak})",
        soak - (until - now),
        until - now
    )
}

/// What is wrong with a node during its soak, if anything: NotReady, its
/// installer no longer Ready (the agent's probe reads the loaded module), or
/// pods using its devices crash-looping.
pub fn trouble(obs: &Observation) -> Option<String> {
    let mut out = Vec::new();
    if !obs.ready {
        out.push("the node went NotReady".to_string());
    }
    if obs.installer == (InstallerPod::Current { ready: false }) {
        out.push(format!(
            "its installer is no longer Ready (the module it reports is not loaded){}",
            obs.installer_problem
                .as_deref()
                .map(|p| format!(": {p}"))
                .unwrap_or_default()
        ));
    }
    if !obs.device_pods_crash_looping.is_empty() {
        out.push(format!(
            "pods using its devices crash-loop: {}",
            obs.device_pods_crash_looping.join(", ")
        ));
    }
    (!out.is_empty()).then(|| out.join("; "))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::fixtures::observation;
    use crate::machine::InstallerPod;

    fn done(target: &str, since: i64, why: &str) -> NodeRecord {
        let mut r = NodeRecord::new("fleet", target, since);
        r.state = NodeState::Done;
        r.reason = Some(why.into());
        r
    }

    #[test]
    fn the_last_upgraded_node_soaks() {
        let recs: Vec<(String, NodeRecord)> = vec![
            ("a".into(), done("2.8.0", 1000, reason::UPGRADED)),
            ("b".into(), done("2.8.0", 1100, reason::UPGRADED)),
            ("c".into(), done("2.8.0", 1200, reason::UP_TO_DATE)),
            ("d".into(), done("2.7.0", 1300, reason::UPGRADED)),
        ];
        let it = || recs.iter().map(|(n, r)| (n, r));
        assert_eq!(soaking(it(), "2.8.0", 300, 1150), Some(("b".into(), 1400)));
        assert_eq!(soaking(it(), "2.8.0", 300, 1399), Some(("b".into(), 1400)));
        assert_eq!(soaking(it(), "2.8.0", 300, 1400), None, "over");
        assert_eq!(soaking(it(), "2.8.0", 0, 1150), None, "no soak");
        let w = waiting("b", 1400, 300, 1150);
        assert!(
            w.contains("b was upgraded 50s ago") && w.contains("starts in 250s"),
            "{w}"
        );
    }

    #[test]
    fn trouble_is_named() {
        assert_eq!(trouble(&observation()), None);
        let o = Observation {
            ready: false,
            installer: InstallerPod::Current { ready: false },
            device_pods_crash_looping: vec!["ml/train-0".into()],
            ..observation()
        };
        let t = trouble(&o).expect("trouble");
        for part in ["NotReady", "installer", "ml/train-0"] {
            assert!(t.contains(part), "{part}: {t}");
        }
    }
}
