//! The family collector: the generic machinery under every metric.
//!
//! A [`Family`] is one metric family (name, help, kind, fixed label names) with
//! its live series keyed by the list of their label values; [`Families`] holds
//! every family of the controller, registers each in a private `prometheus`
//! registry, encodes them, and does the bookkeeping that spans families: which
//! policies have had their fixed-label counters created, and removing the
//! series of a node, of a policy, or of every policy when the lease is lost.
//!
//! It knows nothing of particular metrics; those are defined by the groups in
//! the sibling modules. Why we keep our own families rather than the crate's
//! `*Vec` types is explained in the module documentation of [`super`].

use std::collections::{BTreeMap, BTreeSet};
use std::sync::{Arc, Mutex, MutexGuard};

use prometheus::core::{Collector, Desc};
use prometheus::proto;
use prometheus::{Encoder, Registry, TextEncoder};

#[derive(Clone, Copy, Debug)]
enum Kind {
    Gauge,
    Counter,
    Histogram(&'static [f64]),
}

#[derive(Clone, Debug)]
pub(super) enum Value {
    Scalar(f64),
    /// Per-bucket (not cumulative) counts, one per bound, plus the overflow.
    Histogram {
        counts: Vec<u64>,
        sum: f64,
        count: u64,
    },
}

/// One metric family: a name, fixed label names and the live series.
#[derive(Debug)]
pub(super) struct Family {
    desc: Desc,
    labels: &'static [&'static str],
    kind: Kind,
    series: Mutex<BTreeMap<Vec<String>, Value>>,
}

impl Family {
    fn new(name: &str, help: &str, labels: &'static [&'static str], kind: Kind) -> Arc<Self> {
        let desc = Desc::new(
            name.to_string(),
            help.to_string(),
            labels.iter().map(|l| l.to_string()).collect(),
            Default::default(),
        )
        .unwrap_or_else(|e| panic!("metric {name}: invalid descriptor: {e}"));
        Arc::new(Family {
            desc,
            labels,
            kind,
            series: Mutex::new(BTreeMap::new()),
        })
    }

    pub(super) fn lock(&self) -> MutexGuard<'_, BTreeMap<Vec<String>, Value>> {
        // A panic while holding the lock leaves the map consistent (every update
        // is a single insert or remove), so a poisoned lock is still usable.
        self.series.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn key(&self, values: &[&str]) -> Option<Vec<String>> {
        if values.len() != self.labels.len() {
            debug_assert!(
                false,
                "{}: {} label values for {:?}",
                self.desc.fq_name,
                values.len(),
                self.labels
            );
            tracing::warn!(metric = %self.desc.fq_name, ?values, "wrong number of label values; sample dropped");
            return None;
        }
        Some(values.iter().map(|v| v.to_string()).collect())
    }

    fn zero(&self) -> Value {
        match self.kind {
            Kind::Gauge | Kind::Counter => Value::Scalar(0.0),
            Kind::Histogram(bounds) => Value::Histogram {
                counts: vec![0; bounds.len() + 1],
                sum: 0.0,
                count: 0,
            },
        }
    }

    /// Sets several series of the family under one lock, so a scrape never sees
    /// half of the update (e.g. two node states at 1).
    pub(super) fn set_many(&self, series: &[(&[&str], f64)]) {
        let keyed: Option<Vec<(Vec<String>, f64)>> = series
            .iter()
            .map(|(values, v)| self.key(values).map(|k| (k, *v)))
            .collect();
        let Some(keyed) = keyed else { return };
        let mut map = self.lock();
        for (k, v) in keyed {
            map.insert(k, Value::Scalar(v));
        }
    }

    pub(super) fn set(&self, values: &[&str], v: f64) {
        if let Some(k) = self.key(values) {
            self.lock().insert(k, Value::Scalar(v));
        }
    }

    pub(super) fn add(&self, values: &[&str], v: f64) {
        let Some(k) = self.key(values) else { return };
        let zero = self.zero();
        if let Value::Scalar(x) = self.lock().entry(k).or_insert(zero) {
            *x += v;
        }
    }

    /// Creates the series at zero if it does not exist yet, so that counters
    /// are visible (and `rate()` sees their first increment) before anything
    /// happened.
    pub(super) fn touch(&self, values: &[&str]) {
        let Some(k) = self.key(values) else { return };
        let zero = self.zero();
        self.lock().entry(k).or_insert(zero);
    }

    pub(super) fn observe(&self, values: &[&str], v: f64) {
        let Kind::Histogram(bounds) = self.kind else {
            return;
        };
        if !v.is_finite() {
            return;
        }
        let Some(k) = self.key(values) else { return };
        let zero = self.zero();
        if let Value::Histogram { counts, sum, count } = self.lock().entry(k).or_insert(zero) {
            let i = bounds.iter().position(|b| v <= *b).unwrap_or(bounds.len());
            if let Some(c) = counts.get_mut(i) {
                *c += 1;
            }
            *sum += v;
            *count += 1;
        }
    }

    fn label_index(&self, name: &str) -> Option<usize> {
        self.labels.iter().position(|l| *l == name)
    }

    /// Removes every series whose labels match all of `(name, value)`. A family
    /// lacking one of the labels is left alone.
    fn remove_matching(&self, matchers: &[(&str, &str)]) {
        let idx: Option<Vec<(usize, &str)>> = matchers
            .iter()
            .map(|(n, v)| self.label_index(n).map(|i| (i, *v)))
            .collect();
        let Some(idx) = idx else { return };
        self.lock().retain(|k, _| {
            !idx.iter()
                .all(|(i, v)| k.get(*i).map(String::as_str) == Some(*v))
        });
    }

    fn retain(&self, keep: impl Fn(&[String]) -> bool) {
        self.lock().retain(|k, _| keep(k));
    }

    pub(super) fn replace(&self, series: BTreeMap<Vec<String>, Value>) {
        *self.lock() = series;
    }

    fn to_proto(&self) -> proto::MetricFamily {
        let series = self.lock();
        let mut metrics = Vec::with_capacity(series.len());
        for (key, value) in series.iter() {
            let mut m = proto::Metric::default();
            m.set_label(
                self.labels
                    .iter()
                    .zip(key)
                    .map(|(n, v)| {
                        let mut lp = proto::LabelPair::default();
                        lp.set_name(n.to_string());
                        lp.set_value(v.clone());
                        lp
                    })
                    .collect(),
            );
            match (self.kind, value) {
                (Kind::Gauge, Value::Scalar(v)) => {
                    let mut g = proto::Gauge::default();
                    g.set_value(*v);
                    m.set_gauge(g);
                }
                (Kind::Counter, Value::Scalar(v)) => {
                    let mut c = proto::Counter::default();
                    c.set_value(*v);
                    m.set_counter(c);
                }
                (Kind::Histogram(bounds), Value::Histogram { counts, sum, count }) => {
                    let mut h = proto::Histogram::default();
                    let mut cumulative = 0;
                    let mut buckets = Vec::with_capacity(bounds.len());
                    for (b, c) in bounds.iter().zip(counts) {
                        cumulative += c;
                        let mut bucket = proto::Bucket::default();
                        bucket.set_upper_bound(*b);
                        bucket.set_cumulative_count(cumulative);
                        buckets.push(bucket);
                    }
                    h.set_bucket(buckets);
                    h.set_sample_sum(*sum);
                    h.set_sample_count(*count);
                    m.set_histogram(h);
                }
                _ => continue,
            }
            metrics.push(m);
        }
        let mut mf = proto::MetricFamily::default();
        mf.set_name(self.desc.fq_name.clone());
        mf.set_help(self.desc.help.clone());
        mf.set_field_type(match self.kind {
            Kind::Gauge => proto::MetricType::GAUGE,
            Kind::Counter => proto::MetricType::COUNTER,
            Kind::Histogram(_) => proto::MetricType::HISTOGRAM,
        });
        mf.set_metric(metrics);
        mf
    }
}

/// Registers one family in the registry; the registry and the metric groups share it.
struct FamilyCollector(Arc<Family>);

impl Collector for FamilyCollector {
    fn desc(&self) -> Vec<&Desc> {
        vec![&self.0.desc]
    }

    fn collect(&self) -> Vec<proto::MetricFamily> {
        vec![self.0.to_proto()]
    }
}

/// Every family of the controller and the registry that exposes them.
pub(super) struct Families {
    registry: Registry,
    all: Vec<Arc<Family>>,
    /// Policies whose fixed-label counters have been created at zero.
    known_crs: Mutex<BTreeSet<String>>,
}

impl Families {
    pub(super) fn new() -> Self {
        Families {
            registry: Registry::new(),
            all: Vec::new(),
            known_crs: Mutex::new(BTreeSet::new()),
        }
    }

    /// Creates and registers a gauge family.
    pub(super) fn gauge(
        &mut self,
        name: &str,
        help: &str,
        labels: &'static [&'static str],
    ) -> Arc<Family> {
        self.register(Family::new(name, help, labels, Kind::Gauge))
    }

    /// Creates and registers a counter family.
    pub(super) fn counter(
        &mut self,
        name: &str,
        help: &str,
        labels: &'static [&'static str],
    ) -> Arc<Family> {
        self.register(Family::new(name, help, labels, Kind::Counter))
    }

    /// Creates and registers a histogram family with the given bucket bounds.
    pub(super) fn histogram(
        &mut self,
        name: &str,
        help: &str,
        labels: &'static [&'static str],
        buckets: &'static [f64],
    ) -> Arc<Family> {
        self.register(Family::new(name, help, labels, Kind::Histogram(buckets)))
    }

    /// Panics only if the registry refuses the family (an invalid or duplicate
    /// definition: a bug caught by the unit tests), never because of input.
    fn register(&mut self, family: Arc<Family>) -> Arc<Family> {
        let name = family.desc.fq_name.clone();
        self.registry
            .register(Box::new(FamilyCollector(family.clone())))
            .unwrap_or_else(|e| panic!("registering metric {name}: {e}"));
        self.all.push(family.clone());
        family
    }

    /// Registers a collector that is not one of our families (the
    /// `prometheus` crate's process collector). Panics as [`Self::register`].
    pub(super) fn register_collector(&mut self, name: &str, c: Box<dyn Collector>) {
        self.registry
            .register(c)
            .unwrap_or_else(|e| panic!("registering metrics {name}: {e}"));
    }

    /// The text exposition of every family with at least one series.
    pub(super) fn encode(&self) -> Vec<u8> {
        let mut buf = Vec::new();
        if let Err(e) = TextEncoder::new().encode(&self.registry.gather(), &mut buf) {
            // Only reachable through an inconsistent family, which the unit tests rule out.
            tracing::error!(error = %e, "encoding metrics failed");
        }
        buf
    }

    fn known_crs(&self) -> MutexGuard<'_, BTreeSet<String>> {
        self.known_crs.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// True the first time `cr` is seen (or seen again after being forgotten):
    /// the caller then creates the policy's fixed-label counters at zero.
    pub(super) fn first_sight(&self, cr: &str) -> bool {
        let mut known = self.known_crs();
        if known.contains(cr) {
            return false;
        }
        known.insert(cr.to_string());
        true
    }

    /// Removes, in every family, each series whose labels match all of
    /// `(name, value)`; a family lacking one of the labels is left alone.
    pub(super) fn remove_matching(&self, matchers: &[(&str, &str)]) {
        for f in &self.all {
            f.remove_matching(matchers);
        }
    }

    /// Forgets that `cr` was seen, so its counters start again at zero if it comes back.
    pub(super) fn forget_cr(&self, cr: &str) {
        self.known_crs().remove(cr);
    }

    /// What losing the lease drops: every series of every family that has a
    /// `cr` label, then every series of each family in `also`, and the record
    /// of which policies were seen.
    pub(super) fn drop_policy_series(&self, also: &[&Family]) {
        for f in &self.all {
            if f.label_index("cr").is_some() {
                f.retain(|_| false);
            }
        }
        for f in also {
            f.retain(|_| false);
        }
        self.known_crs().clear();
    }
}
