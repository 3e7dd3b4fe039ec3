//! Metrics of the policy supervisor's reconcile passes: how many, how long,
//! with what result, when the last one succeeded, the controller's errors
//! by stage (counted wherever they happen, the node actor included), and the
//! restarts of its watches.

use super::family::Families;
use super::registry::{Metrics, ReconcileMetrics, now_unix_seconds};

/// Buckets for one reconcile pass: five milliseconds to a minute.
pub const RECONCILE_BUCKETS: &[f64] = &[
    0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0,
];

/// Buckets for the nodes one reconcile pass examines: one to ten thousand.
pub const EXAMINED_BUCKETS: &[f64] = &[
    0.0, 1.0, 2.0, 5.0, 10.0, 20.0, 50.0, 100.0, 200.0, 500.0, 1000.0, 2000.0, 5000.0, 10000.0,
];

/// Every `stage` of `ttdriver_errors_total`: `Error::metric_label`'s values and
/// the stages the actors count themselves. Each is created at 0 for every
/// policy, so a dashboard shows 0 errors rather than "no data".
pub const ERROR_STAGES: &[&str] = &[
    "kube_api",
    "invalid_policy",
    "takeover",
    "mailbox",
    "serialize",
    "write_backoff",
    "refused",
    "evict",
];

/// The kinds the controller watches (src/watch.rs); their restart counters
/// start at 0.
pub const WATCH_KINDS: &[&str] = &[
    "TenstorrentDriverPolicy",
    "Node",
    "DaemonSet",
    "PodDisruptionBudget",
    "Pod",
];

impl ReconcileMetrics {
    /// Creates and registers the families of this group.
    pub(super) fn register(families: &mut Families) -> Self {
        let m = ReconcileMetrics {
            watch_restarts: families.counter(
                "ttdriver_watch_restarts_total",
                "Errors of a watch of the controller's caches, by kind; each restarts the watch with backoff (and re-lists when the resource version is gone).",
                &["kind"],
            ),
            errors: families.counter(
                "ttdriver_errors_total",
                "Errors of the controller, by stage.",
                &["cr", "stage"],
            ),
            last_successful_reconcile: families.gauge(
                "ttdriver_last_successful_reconcile_timestamp_seconds",
                "Unix time of the last reconcile of the policy that ended without error.",
                &["cr"],
            ),
            reconcile_total: families.counter(
                "ttdriver_reconcile_total",
                "Reconcile passes of a policy, by result (ok or error).",
                &["cr", "result"],
            ),
            reconcile_duration: families.histogram(
                "ttdriver_reconcile_duration_seconds",
                "Duration of one reconcile pass of a policy.",
                &["cr"],
                RECONCILE_BUCKETS,
            ),
            nodes_examined: families.histogram(
                "ttdriver_reconcile_nodes_examined",
                "Nodes one reconcile pass of a policy observed (read from the caches into an observation, or a build-ahead candidate), by scope: full (every owned node) or targeted (the nodes a watch event named, those mid-cycle on a tick, those granted a slot).",
                &["cr", "scope"],
                EXAMINED_BUCKETS,
            ),
            api_requests: families.counter(
                "ttdriver_api_requests_total",
                "Requests of this replica to the Kubernetes API, by verb and resource as the audit log names them (a watch counted when opened).",
                &["verb", "resource"],
            ),
        };
        for kind in WATCH_KINDS {
            m.watch_restarts.touch(&[kind]);
        }
        m
    }

    /// Creates the reconcile counters of a newly seen policy at zero, one per
    /// result, and its error counters, one per stage.
    pub(super) fn touch_policy(&self, cr: &str) {
        for result in ["ok", "error"] {
            self.reconcile_total.touch(&[cr, result]);
        }
        for stage in ERROR_STAGES {
            self.errors.touch(&[cr, stage]);
        }
    }
}

impl Metrics {
    /// `ttdriver_reconcile_total{cr,result}` and `ttdriver_reconcile_duration_seconds{cr}`.
    pub fn observe_reconcile(&self, cr: &str, seconds: f64, ok: bool) {
        self.ensure_cr(cr);
        self.reconcile
            .reconcile_total
            .add(&[cr, if ok { "ok" } else { "error" }], 1.0);
        if seconds >= 0.0 {
            self.reconcile.reconcile_duration.observe(&[cr], seconds);
        }
    }

    /// `ttdriver_reconcile_nodes_examined{cr,scope}`: one pass examined `nodes`.
    pub fn observe_nodes_examined(&self, cr: &str, full: bool, nodes: usize) {
        self.ensure_cr(cr);
        let scope = if full { "full" } else { "targeted" };
        self.reconcile
            .nodes_examined
            .observe(&[cr, scope], nodes as f64);
    }

    /// `ttdriver_api_requests_total{verb,resource}`.
    pub fn inc_api_request(&self, verb: &str, resource: &str) {
        self.reconcile.api_requests.add(&[verb, resource], 1.0);
    }

    /// `ttdriver_last_successful_reconcile_timestamp_seconds{cr}` = now.
    pub fn set_last_successful_reconcile(&self, cr: &str) {
        self.ensure_cr(cr);
        self.reconcile
            .last_successful_reconcile
            .set(&[cr], now_unix_seconds());
    }

    /// `ttdriver_errors_total{cr,stage}`.
    pub fn inc_error(&self, cr: &str, stage: &str) {
        self.ensure_cr(cr);
        self.reconcile.errors.add(&[cr, stage], 1.0);
    }

    /// `ttdriver_watch_restarts_total{kind}`: a watch failed and restarts.
    pub fn inc_watch_restart(&self, kind: &str) {
        self.reconcile.watch_restarts.add(&[kind], 1.0);
    }
}

#[cfg(test)]
mod zero_series {
    use super::super::Metrics;
    use super::super::actors::ACTOR_KINDS;
    use super::super::text_parser::{parse, value};
    use super::{ERROR_STAGES, WATCH_KINDS};

    /// A dashboard panel of errors, restarts or full mailboxes shows 0 for a
    /// controller that never had one, not "no data".
    #[test]
    fn error_restart_and_mailbox_counters_start_at_zero() {
        let m = Metrics::new("test");
        m.observe_reconcile("p", 0.01, true);
        let (_, body) = m.encode();
        let samples = parse(&String::from_utf8(body).expect("utf-8")).0;
        for stage in ERROR_STAGES {
            let v = value(
                &samples,
                "ttdriver_errors_total",
                &[("cr", "p"), ("stage", stage)],
            );
            assert_eq!(v, Some(0.0), "ttdriver_errors_total{{stage={stage}}}");
        }
        for kind in WATCH_KINDS {
            let v = value(&samples, "ttdriver_watch_restarts_total", &[("kind", kind)]);
            assert_eq!(v, Some(0.0), "ttdriver_watch_restarts_total{{kind={kind}}}");
        }
        m.inc_watch_restart("Node");
        let (_, body) = m.encode();
        let samples = parse(&String::from_utf8(body).expect("utf-8")).0;
        let v = value(
            &samples,
            "ttdriver_watch_restarts_total",
            &[("kind", "Node")],
        );
        assert_eq!(v, Some(1.0));
        for actor in ACTOR_KINDS {
            for family in [
                "ttdriver_actor_restarts_total",
                "ttdriver_actor_mailbox_full_total",
            ] {
                assert_eq!(
                    value(&samples, family, &[("actor", actor)]),
                    Some(0.0),
                    "{family}{{actor={actor}}}"
                );
            }
        }
    }
}
