//! The installer DaemonSet `ttdrv-<policy>`, rendered as a pure function of the
//! policy and the controller's settings. Golden tests pin the output.

use std::collections::BTreeMap;

use k8s_openapi::api::apps::v1::{DaemonSet, DaemonSetSpec, DaemonSetUpdateStrategy};
use k8s_openapi::api::core::v1::{
    Affinity, ConfigMapVolumeSource, Container, EnvVar, EnvVarSource, ExecAction,
    HostPathVolumeSource, NodeAffinity, NodeSelector, NodeSelectorRequirement, NodeSelectorTerm,
    ObjectFieldSelector, PodSpec, PodTemplateSpec, Probe, ResourceRequirements, SecretVolumeSource,
    SecurityContext, Toleration, Volume, VolumeMount,
};
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{LabelSelector, ObjectMeta};
use kube::Resource;
use sha2::{Digest, Sha256};
use ttdrv_api::labels::{self, env};
use ttdrv_api::{SelectorOperator, TenstorrentDriverPolicy};

/// Controller-wide settings that shape every DaemonSet.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RenderContext {
    pub namespace: String,
    pub default_image: String,
    /// Pull policy of `default_image` (the chart's `driver.image.pullPolicy`).
    pub default_pull_policy: String,
    pub default_source_repository: String,
    pub tt_smi_version: String,
    pub service_account: Option<String>,
    /// Which nodes may be selected (the PCI label requirement), shared with
    /// the controller's selection.
    pub eligibility: ttdrv_core::selection::Eligibility,
    /// The controller's proxy variables, copied into the installer pods.
    pub proxy_env: Vec<(String, String)>,
    /// Version → commit pins (the chart's `driver.sourceCommits`).
    pub source_commits: BTreeMap<String, String>,
    /// ConfigMap whose `keys.asc` the agent checks tag signatures against.
    pub tag_keys_configmap: Option<String>,
}

impl RenderContext {
    /// What the controller renders with none of its flags set, in
    /// `namespace` (the controller itself builds its context from its
    /// configuration: `Context::render_context`).
    pub fn defaults(namespace: &str) -> Self {
        Self {
            namespace: namespace.into(),
            default_image: ttdrv_api::images::DEFAULT_AGENT_IMAGE.into(),
            default_pull_policy: "IfNotPresent".into(),
            default_source_repository: labels::DEFAULT_SOURCE_REPOSITORY.into(),
            tt_smi_version: String::new(),
            service_account: None,
            eligibility: Default::default(),
            proxy_env: vec![],
            source_commits: Default::default(),
            tag_keys_configmap: None,
        }
    }
}

/// Where the installer pod sees the tag-signing keys.
pub const TAG_KEYS_DIR: &str = "/etc/ttdrv/tag-keys";
/// The key of the keys in the ConfigMap (and the file in [`TAG_KEYS_DIR`]).
pub const TAG_KEYS_FILE: &str = "keys.asc";

/// Where the installer pod sees the module-signing Secret
/// (`installer.signingSecret`).
pub const SIGNING_DIR: &str = "/etc/ttdrv/signing";
/// The Secret's keys the agent reads: those of a `kubernetes.io/tls` Secret.
pub const SIGNING_KEY_FILE: &str = "tls.key";
pub const SIGNING_CERT_FILE: &str = "tls.crt";

/// The installer container's memory request: above the peak cgroup charge
/// measured for a clone and `make -j2` of the real tt-kmd 2.10.0 (346 MiB,
/// the headers' page cache included; the stub's is 262 MiB). See
/// docs/security.md.
pub const INSTALLER_MEMORY_REQUEST: &str = "384Mi";
/// The installer container's memory limit: room for the agent's
/// `make -j4` (BUILD_JOBS_MAX) at twice the largest compiler measured on
/// tt-kmd 2.10.0 (99 MiB RSS each) plus the headers' page cache (which is
/// reclaimed first under the limit). See docs/security.md.
pub const INSTALLER_MEMORY_LIMIT: &str = "1Gi";
/// CPU request (the agent idles after its run); no CPU limit: a throttled
/// build only takes longer while the node waits.
pub const INSTALLER_CPU_REQUEST: &str = "100m";

/// Host directories the agent writes, mounted read-write over the read-only
/// host root: (volume name, host path). Everything else of the host is
/// read-only to it (its sysfs, procfs and /dev are mounts of their own and
/// keep their modes).
pub const WRITABLE_HOST_DIRS: [(&str, &str); 4] = [
    ("host-module-cache", "/var/cache/tt-kmd"),
    ("host-local-bin", "/usr/local/bin"),
    ("host-udev-rules", "/etc/udev/rules.d"),
    ("host-opt", "/opt"),
];

pub fn daemonset_name(policy: &str) -> String {
    format!("ttdrv-{policy}")
}

/// The DaemonSet's selector (immutable: never extended) and labels.
pub fn pod_labels(policy: &str) -> BTreeMap<String, String> {
    BTreeMap::from([
        (
            "app.kubernetes.io/name".to_string(),
            "tt-driver-installer".to_string(),
        ),
        (labels::CLAIM.to_string(), policy.to_string()),
    ])
}

/// Labels on the installer pods: the selector's, and the Go operator's
/// `driver.tenstorrent.com/cr` and `app.kubernetes.io/component=driver`
/// (outside the selector, for tools that select Go-era installer pods).
pub fn installer_pod_labels(policy: &str) -> BTreeMap<String, String> {
    let mut l = pod_labels(policy);
    l.insert(labels::GO_CR.to_string(), policy.to_string());
    l.insert(
        labels::COMPONENT.to_string(),
        labels::COMPONENT_DRIVER.to_string(),
    );
    l
}

fn req(key: &str, op: &str, values: &[&str]) -> NodeSelectorRequirement {
    NodeSelectorRequirement {
        key: key.to_string(),
        operator: op.to_string(),
        values: (!values.is_empty()).then(|| values.iter().map(|v| v.to_string()).collect()),
    }
}

/// The policy's selector ∧ Tenstorrent PCI label ∧ no skip label ∧ claimed by this
/// policy (the controller labels the nodes each policy owns, so overlapping
/// policies never both land a pod on one node).
pub fn node_affinity(
    policy: &TenstorrentDriverPolicy,
    eligibility: ttdrv_core::selection::Eligibility,
) -> NodeAffinity {
    let name = policy.metadata.name.clone().unwrap_or_default();
    let mut exprs: Vec<NodeSelectorRequirement> = eligibility
        .requirements()
        .into_iter()
        .map(|(k, op, values)| req(k, op, values))
        .collect();
    exprs.push(req(labels::CLAIM, "In", &[&name]));
    if policy.spec.unmanage {
        // Vacated nodes are left alone: their installer pod goes.
        exprs.push(req(labels::UNMANAGED, "DoesNotExist", &[]));
    }
    if let Some(sel) = policy.spec.selector() {
        for (k, v) in sel.match_labels.iter().flatten() {
            exprs.push(req(k, "In", &[v]));
        }
        for r in sel.match_expressions.iter().flatten() {
            let values: Vec<&str> = r.values.iter().flatten().map(String::as_str).collect();
            let values = match r.operator {
                SelectorOperator::In | SelectorOperator::NotIn => values,
                SelectorOperator::Exists | SelectorOperator::DoesNotExist => vec![],
            };
            exprs.push(req(&r.key, r.operator.as_str(), &values));
        }
    }
    NodeAffinity {
        required_during_scheduling_ignored_during_execution: Some(NodeSelector {
            node_selector_terms: vec![NodeSelectorTerm {
                match_expressions: Some(exprs),
                ..Default::default()
            }],
        }),
        ..Default::default()
    }
}

fn host_path(name: &str, path: &str, kind: Option<&str>) -> Volume {
    Volume {
        name: name.to_string(),
        host_path: Some(HostPathVolumeSource {
            path: path.to_string(),
            type_: kind.map(String::from),
        }),
        ..Default::default()
    }
}

fn mount(name: &str, path: &str, read_only: bool) -> VolumeMount {
    VolumeMount {
        name: name.to_string(),
        mount_path: path.to_string(),
        read_only: read_only.then_some(true),
        mount_propagation: (name == "host").then(|| "HostToContainer".to_string()),
        ..Default::default()
    }
}

fn env_var(name: &str, value: &str) -> EnvVar {
    EnvVar {
        name: name.to_string(),
        value: Some(value.to_string()),
        ..Default::default()
    }
}

/// The installer image the policy names itself, if it does: not an empty
/// one, and not the Go operator's builder (which does not speak to this
/// controller: the controller's own installer image runs instead, with a
/// Warning Event, `GoBuilderImageReplaced`).
pub fn policy_image(policy: &TenstorrentDriverPolicy) -> Option<&str> {
    policy
        .spec
        .installer
        .image
        .as_deref()
        .filter(|i| !i.trim().is_empty() && !ttdrv_api::images::is_go_builder(i))
}

/// The pod template, without the hash annotation.
pub fn pod_template(policy: &TenstorrentDriverPolicy, ctx: &RenderContext) -> PodTemplateSpec {
    let name = policy.metadata.name.clone().unwrap_or_default();
    let signing_secret = signing_secret(policy);
    PodTemplateSpec {
        metadata: Some(ObjectMeta {
            labels: Some(installer_pod_labels(&name)),
            ..Default::default()
        }),
        spec: Some(PodSpec {
            affinity: Some(Affinity {
                node_affinity: Some(node_affinity(policy, ctx.eligibility)),
                ..Default::default()
            }),
            containers: vec![installer_container(policy, ctx, signing_secret)],
            host_pid: Some(true),
            priority_class_name: Some("system-node-critical".into()),
            service_account_name: ctx.service_account.clone(),
            // The installer must run on cordoned and tainted Tenstorrent nodes.
            tolerations: Some(vec![Toleration {
                operator: Some("Exists".into()),
                ..Default::default()
            }]),
            termination_grace_period_seconds: Some(30),
            volumes: Some(installer_volumes(ctx, signing_secret)),
            ..Default::default()
        }),
    }
}

/// The installer container: the agent's `run`, privileged, with its
/// environment, readiness probe, resources and host mounts.
fn installer_container(
    policy: &TenstorrentDriverPolicy,
    ctx: &RenderContext,
    signing_secret: Option<&str>,
) -> Container {
    let (image, pull_policy) = installer_image(policy, ctx);
    Container {
        name: labels::INSTALLER_CONTAINER.into(),
        image: Some(image),
        image_pull_policy: Some(pull_policy),
        args: Some(vec!["run".into()]),
        env: Some(installer_env(policy, ctx, signing_secret)),
        // The agent says why it gave up in /dev/termination-log (the
        // default path); the controller fails the node with that reason.
        termination_message_policy: Some("FallbackToLogsOnError".into()),
        security_context: Some(SecurityContext {
            privileged: Some(true),
            ..Default::default()
        }),
        readiness_probe: Some(Probe {
            exec: Some(ExecAction {
                command: Some(vec!["ttdrv-agent".into(), "ready".into()]),
            }),
            period_seconds: Some(10),
            timeout_seconds: Some(5),
            ..Default::default()
        }),
        resources: Some(installer_resources()),
        volume_mounts: Some(installer_mounts(ctx, signing_secret)),
        ..Default::default()
    }
}

/// The installer image and its pull policy.
fn installer_image(policy: &TenstorrentDriverPolicy, ctx: &RenderContext) -> (String, String) {
    let own_image = policy_image(policy).map(String::from);
    // A policy's pull policy applies to its own image; for the chart's image it
    // applies only when changed from the default.
    let pull_policy = match (&own_image, policy.spec.installer.image_pull_policy) {
        (None, ttdrv_api::PullPolicy::IfNotPresent) => ctx.default_pull_policy.clone(),
        (_, p) => p.as_str().to_string(),
    };
    let image = own_image.unwrap_or_else(|| ctx.default_image.clone());
    (image, pull_policy)
}

/// The installer container's environment, in this order (the order is part
/// of the template, so of its hash): what every pod gets, the trust settings,
/// the policy's optional settings, the controller's.
fn installer_env(
    policy: &TenstorrentDriverPolicy,
    ctx: &RenderContext,
    signing_secret: Option<&str>,
) -> Vec<EnvVar> {
    let mut envs = base_env(policy, ctx);
    envs.extend(trust_env(policy, ctx, signing_secret));
    envs.extend(spec_option_env(policy));
    envs.extend(controller_env(ctx));
    envs
}

/// The variables every installer pod has.
fn base_env(policy: &TenstorrentDriverPolicy, ctx: &RenderContext) -> Vec<EnvVar> {
    let name = policy.metadata.name.clone().unwrap_or_default();
    let spec = &policy.spec;
    let repo = spec
        .installer
        .source_repository
        .clone()
        .filter(|s| !s.is_empty())
        .unwrap_or_else(|| ctx.default_source_repository.clone());
    vec![
        env_var(env::TT_KMD_VERSION, &spec.version),
        EnvVar {
            name: env::NODE_NAME.to_string(),
            value_from: Some(EnvVarSource {
                field_ref: Some(ObjectFieldSelector {
                    field_path: "spec.nodeName".into(),
                    ..Default::default()
                }),
                ..Default::default()
            }),
            ..Default::default()
        },
        env_var(
            env::FORCE_UNLOAD,
            if spec.upgrade_policy.force_unload {
                "true"
            } else {
                "false"
            },
        ),
        env_var(env::SOURCE_REPOSITORY, &repo),
        env_var(env::HOST_ROOT, "/host"),
        // The go-ahead the agent waits for names the policy.
        env_var(env::POLICY, &name),
    ]
}

/// What the agent checks and signs with: the pinned source commit, the
/// tag-signing keys, the module-signing Secret.
fn trust_env(
    policy: &TenstorrentDriverPolicy,
    ctx: &RenderContext,
    signing_secret: Option<&str>,
) -> Vec<EnvVar> {
    let spec = &policy.spec;
    let mut envs = Vec::new();
    if let Some(commit) = ttdrv_core::trust::source_commit(
        &spec.version,
        spec.installer.source_commit.as_deref(),
        &ctx.source_commits,
    ) {
        envs.push(env_var(env::SOURCE_COMMIT, &commit));
    }
    if ctx.tag_keys_configmap.is_some() {
        envs.push(env_var(
            env::TAG_KEYS,
            &format!("{TAG_KEYS_DIR}/{TAG_KEYS_FILE}"),
        ));
    }
    if let Some(secret) = signing_secret {
        envs.push(env_var(
            env::SIGNING_KEY,
            &format!("{SIGNING_DIR}/{SIGNING_KEY_FILE}"),
        ));
        envs.push(env_var(
            env::SIGNING_CERT,
            &format!("{SIGNING_DIR}/{SIGNING_CERT_FILE}"),
        ));
        envs.push(env_var(
            env::SIGNING_SECRET,
            &format!("{}/{secret}", ctx.namespace),
        ));
    }
    envs
}

/// The policy's optional settings, each only when not the default: a policy
/// that leaves them keeps its template (and so its pods) as it was.
fn spec_option_env(policy: &TenstorrentDriverPolicy) -> Vec<EnvVar> {
    let spec = &policy.spec;
    let mut envs = Vec::new();
    if spec.unmanage {
        // The agent installs nothing, and unloads only with the go-ahead.
        envs.push(env_var(env::UNMANAGE, "true"));
    }
    if !spec.upgrade_policy.prepare.next_kernels {
        envs.push(env_var(env::NEXT_KERNELS, "false"));
    }
    let validation = &spec.upgrade_policy.validation;
    if validation.timeout_seconds != ttdrv_api::v1alpha1::DEFAULT_VALIDATION_TIMEOUT_SECONDS {
        envs.push(env_var(
            env::VALIDATION_TIMEOUT,
            &validation.timeout_seconds.to_string(),
        ));
    }
    let on_failure = spec.upgrade_policy.on_validation_failure;
    if on_failure != ttdrv_api::v1alpha1::OnValidationFailure::default() {
        envs.push(env_var(env::ON_VALIDATION_FAILURE, on_failure.as_str()));
    }
    let parameters = ttdrv_api::module_params::canonical(&spec.parameter_values());
    if !parameters.is_empty() {
        envs.push(env_var(env::MODULE_PARAMETERS, &parameters));
    }
    envs
}

/// The controller's own settings passed on to the agent.
fn controller_env(ctx: &RenderContext) -> Vec<EnvVar> {
    let mut envs = Vec::new();
    // Empty means "the version baked into the installer image".
    if !ctx.tt_smi_version.is_empty() {
        envs.push(env_var(env::TT_SMI_VERSION, &ctx.tt_smi_version));
    }
    // The controller's proxy variables (both cases), as the Go operator copied
    // them: the agent clones tt-kmd through them. They are part of the
    // template, so changing them rolls the installer out like any change.
    for (k, v) in &ctx.proxy_env {
        envs.push(env_var(k, v));
    }
    envs
}

/// The installer container's requests and limit (see the constants).
fn installer_resources() -> ResourceRequirements {
    ResourceRequirements {
        requests: Some(BTreeMap::from([
            ("cpu".to_string(), Quantity(INSTALLER_CPU_REQUEST.into())),
            (
                "memory".to_string(),
                Quantity(INSTALLER_MEMORY_REQUEST.into()),
            ),
        ])),
        limits: Some(BTreeMap::from([(
            "memory".to_string(),
            Quantity(INSTALLER_MEMORY_LIMIT.into()),
        )])),
        ..Default::default()
    }
}

/// The installer's mounts: the host read-only at /host, its writable
/// directories over it, and the keys when configured. Same names as
/// [`installer_volumes`].
fn installer_mounts(ctx: &RenderContext, signing_secret: Option<&str>) -> Vec<VolumeMount> {
    [
        mount("host", "/host", true),
        mount("lib-modules", "/lib/modules", true),
        mount("usr-src", "/usr/src", true),
    ]
    .into_iter()
    .chain(
        WRITABLE_HOST_DIRS
            .iter()
            .map(|(name, path)| mount(name, &format!("/host{path}"), false)),
    )
    .chain(
        ctx.tag_keys_configmap
            .as_ref()
            .map(|_| mount("tag-keys", TAG_KEYS_DIR, true)),
    )
    .chain(signing_secret.map(|_| mount("signing-key", SIGNING_DIR, true)))
    .collect()
}

/// The pod's volumes, one per mount of [`installer_mounts`].
fn installer_volumes(ctx: &RenderContext, signing_secret: Option<&str>) -> Vec<Volume> {
    [
        host_path("host", "/", Some("Directory")),
        host_path("lib-modules", "/lib/modules", Some("Directory")),
        host_path("usr-src", "/usr/src", Some("Directory")),
    ]
    .into_iter()
    .chain(
        WRITABLE_HOST_DIRS
            .iter()
            .map(|(name, path)| host_path(name, path, Some("DirectoryOrCreate"))),
    )
    .chain(ctx.tag_keys_configmap.as_ref().map(|cm| Volume {
        name: "tag-keys".into(),
        config_map: Some(ConfigMapVolumeSource {
            name: cm.clone(),
            ..Default::default()
        }),
        ..Default::default()
    }))
    .chain(signing_secret.map(signing_volume))
    .collect()
}

/// The module-signing Secret's volume.
fn signing_volume(secret: &str) -> Volume {
    Volume {
        name: "signing-key".into(),
        secret: Some(SecretVolumeSource {
            secret_name: Some(secret.to_string()),
            // Optional: a missing Secret would hold the pod in
            // ContainerCreating, its cause only in an Event. This
            // way the agent starts, finds no key and fails the
            // node (BuildFailed) naming the Secret; the kubelet
            // fills the volume in once the Secret exists.
            optional: Some(true),
            // The private key: for root (the agent) only.
            default_mode: Some(0o400),
            ..Default::default()
        }),
        ..Default::default()
    }
}

/// The policy's `installer.signingSecret`, when it names one.
pub fn signing_secret(policy: &TenstorrentDriverPolicy) -> Option<&str> {
    policy
        .spec
        .installer
        .signing_secret
        .as_deref()
        .map(str::trim)
        .filter(|s| !s.is_empty())
}

/// sha256 of the rendered pod template (serde_json output is deterministic).
pub fn template_hash(template: &PodTemplateSpec) -> String {
    let bytes = serde_json::to_vec(template).unwrap_or_default();
    hex::encode(Sha256::digest(&bytes))
}

/// The whole DaemonSet, owned by the policy (deleted with it).
pub fn render_daemonset(
    policy: &TenstorrentDriverPolicy,
    ctx: &RenderContext,
) -> (DaemonSet, String) {
    let name = policy.metadata.name.clone().unwrap_or_default();
    let mut template = pod_template(policy, ctx);
    let hash = template_hash(&template);
    if let Some(meta) = template.metadata.as_mut() {
        meta.annotations = Some(BTreeMap::from([(
            labels::TEMPLATE_HASH.to_string(),
            hash.clone(),
        )]));
    }
    let ds = DaemonSet {
        metadata: ObjectMeta {
            name: Some(daemonset_name(&name)),
            namespace: Some(ctx.namespace.clone()),
            labels: Some(pod_labels(&name)),
            annotations: Some(BTreeMap::from([(
                labels::TEMPLATE_HASH.to_string(),
                hash.clone(),
            )])),
            owner_references: policy.controller_owner_ref(&()).map(|o| vec![o]),
            ..Default::default()
        },
        spec: Some(DaemonSetSpec {
            selector: LabelSelector {
                match_labels: Some(pod_labels(&name)),
                ..Default::default()
            },
            template,
            // The controller, not the DaemonSet controller, decides when a node's
            // pod is replaced: only after that node is drained.
            update_strategy: Some(DaemonSetUpdateStrategy {
                type_: Some("OnDelete".into()),
                ..Default::default()
            }),
            ..Default::default()
        }),
        ..Default::default()
    };
    (ds, hash)
}

#[cfg(test)]
mod tests {
    use super::*;
    use ttdrv_api::TenstorrentDriverPolicySpec;

    fn ctx() -> RenderContext {
        RenderContext {
            namespace: "tt-k8s-driver-manager-system".into(),
            default_image: "ghcr.io/tenstorrent/tt-driver-agent:0.1.0".into(),
            default_pull_policy: "IfNotPresent".into(),
            default_source_repository: labels::DEFAULT_SOURCE_REPOSITORY.into(),
            tt_smi_version: "3.0.0".into(),
            service_account: Some("tt-k8s-driver-manager-agent".into()),
            eligibility: Default::default(),
            proxy_env: vec![],
            source_commits: Default::default(),
            tag_keys_configmap: None,
        }
    }

    fn policy(yaml: &str) -> TenstorrentDriverPolicy {
        let spec: TenstorrentDriverPolicySpec = serde_yaml::from_str(yaml).expect("spec parses");
        let mut p = TenstorrentDriverPolicy::new("fleet", spec);
        p.metadata.uid = Some("0000-uid".into());
        p
    }

    /// Golden file: `UPDATE_GOLDEN=1 cargo test` rewrites it.
    #[test]
    fn golden_minimum_policy() {
        let (ds, _) = render_daemonset(&policy("version: \"2.8.0\"\nnodeAffinity: {}"), &ctx());
        let got = serde_yaml::to_string(&ds).expect("yaml");
        let path = concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/tests/golden/daemonset-minimum.yaml"
        );
        if std::env::var_os("UPDATE_GOLDEN").is_some() {
            std::fs::write(path, &got).expect("write golden");
        }
        let want =
            std::fs::read_to_string(path).expect("golden file exists (UPDATE_GOLDEN=1 to create)");
        assert_eq!(got, want, "rendered DaemonSet differs from {path}");
    }

    #[test]
    fn affinity_composes_selector_pci_skip_and_claim() {
        let p = policy(
            "version: \"2.8.0\"\nnodeAffinity:\n  matchLabels: {tt.tenstorrent.com/pool: prod}\n  matchExpressions:\n  - {key: zone, operator: NotIn, values: [b]}\n",
        );
        let aff = node_affinity(&p, Default::default());
        let terms = aff
            .required_during_scheduling_ignored_during_execution
            .expect("required")
            .node_selector_terms;
        assert_eq!(terms.len(), 1, "one term: all requirements ANDed");
        let exprs: Vec<(String, String, Vec<String>)> = terms[0]
            .match_expressions
            .clone()
            .unwrap_or_default()
            .into_iter()
            .map(|r| (r.key, r.operator, r.values.unwrap_or_default()))
            .collect();
        let s = |a: &str| a.to_string();
        assert_eq!(
            exprs,
            vec![
                (s(labels::TT_PCI_PRESENT), s("In"), vec![s("true")]),
                (s(labels::SKIP), s("DoesNotExist"), vec![]),
                (s(labels::CLAIM), s("In"), vec![s("fleet")]),
                (s("tt.tenstorrent.com/pool"), s("In"), vec![s("prod")]),
                (s("zone"), s("NotIn"), vec![s("b")]),
            ]
        );
    }

    #[test]
    fn hash_is_stable_and_tracks_every_input() {
        let base = policy("version: \"2.8.0\"\nnodeAffinity: {}");
        let (_, h1) = render_daemonset(&base, &ctx());
        let (_, h2) = render_daemonset(&base, &ctx());
        assert_eq!(h1, h2, "rendering twice gives the same hash");
        for other in [
            "version: \"2.9.0\"\nnodeAffinity: {}",
            "version: \"2.8.0\"\nnodeAffinity: {}\ninstaller: {image: x/y:z}",
            "version: \"2.8.0\"\nnodeAffinity: {}\ninstaller: {imagePullPolicy: Always}",
            "version: \"2.8.0\"\nnodeAffinity: {}\nupgradePolicy: {forceUnload: true}",
            "version: \"2.8.0\"\nnodeAffinity: {}\ninstaller: {sourceRepository: \"https://mirror/tt-kmd.git\"}",
            "version: \"2.8.0\"\nnodeAffinity: {}\ninstaller: {sourceCommit: \"0123456789abcdef0123456789abcdef01234567\"}",
            "version: \"2.8.0\"\nnodeAffinity: {}\ninstaller: {signingSecret: module-signing}",
        ] {
            let (_, h) = render_daemonset(&policy(other), &ctx());
            assert_ne!(h, h1, "hash must change for {other}");
        }
        // Drain settings do not touch the pod: no pod restarts for them.
        let (_, h) = render_daemonset(
            &policy(
                "version: \"2.8.0\"\nnodeAffinity: {}\nupgradePolicy: {drain: {timeoutSeconds: 5}}",
            ),
            &ctx(),
        );
        assert_eq!(h, h1);
    }

    fn container(p: &TenstorrentDriverPolicy, ctx: &RenderContext) -> (Container, PodSpec) {
        let (ds, _) = render_daemonset(p, ctx);
        let pod = ds.spec.expect("spec").template.spec.expect("pod spec");
        (pod.containers[0].clone(), pod)
    }

    /// The value of env var `name` of the installer container `p` renders.
    fn template_env(p: &TenstorrentDriverPolicy, name: &str) -> Option<String> {
        env_of(&container(p, &ctx()).0, name)
    }

    fn env_of(c: &Container, name: &str) -> Option<String> {
        c.env
            .iter()
            .flatten()
            .find(|e| e.name == name)
            .and_then(|e| e.value.clone())
    }

    #[test]
    fn source_commit_comes_from_the_policy_else_the_table() {
        let a = "a".repeat(40);
        let mut ctx = ctx();
        ctx.source_commits = BTreeMap::from([("2.8.0".to_string(), a.clone())]);
        let (c, _) = container(&policy("version: \"2.8.0\"\nnodeAffinity: {}"), &ctx);
        assert_eq!(env_of(&c, env::SOURCE_COMMIT), Some(a));
        let own = "B".repeat(40);
        let (c, _) = container(
            &policy(&format!(
                "version: \"2.8.0\"\nnodeAffinity: {{}}\ninstaller: {{sourceCommit: \"{own}\"}}"
            )),
            &ctx,
        );
        assert_eq!(env_of(&c, env::SOURCE_COMMIT), Some("b".repeat(40)));
        let (c, _) = container(&policy("version: \"2.7.0\"\nnodeAffinity: {}"), &ctx);
        assert_eq!(env_of(&c, env::SOURCE_COMMIT), None, "unpinned version");
    }

    fn volume<'a>(pod: &'a PodSpec, name: &str) -> Option<&'a Volume> {
        pod.volumes.iter().flatten().find(|v| v.name == name)
    }

    fn mount<'a>(c: &'a Container, name: &str) -> &'a VolumeMount {
        let mounts = c.volume_mounts.iter().flatten();
        let found = mounts.clone().find(|m| m.name == name);
        found.unwrap_or_else(|| panic!("no mount {name}: {:?}", mounts.collect::<Vec<_>>()))
    }

    #[test]
    fn tag_keys_are_mounted_from_the_configmap_when_configured() {
        let p = policy("version: \"2.8.0\"\nnodeAffinity: {}");
        let (c, pod) = container(&p, &ctx());
        assert_eq!(env_of(&c, env::TAG_KEYS), None);
        assert!(pod.volumes.iter().flatten().all(|v| v.config_map.is_none()));
        let mut with = ctx();
        with.tag_keys_configmap = Some("ttdm-tag-keys".into());
        let (c, pod) = container(&p, &with);
        assert_eq!(
            env_of(&c, env::TAG_KEYS).as_deref(),
            Some("/etc/ttdrv/tag-keys/keys.asc")
        );
        let v = volume(&pod, "tag-keys")
            .and_then(|v| v.config_map.as_ref())
            .expect("configMap volume");
        assert_eq!(v.name, "ttdm-tag-keys");
        let m = mount(&c, "tag-keys");
        assert_eq!(
            (m.mount_path.as_str(), m.read_only),
            (TAG_KEYS_DIR, Some(true))
        );
        let (_, h1) = render_daemonset(&p, &ctx());
        let (_, h2) = render_daemonset(&p, &with);
        assert_ne!(h1, h2, "configuring keys rolls the installer out");
    }

    #[test]
    fn the_signing_secret_is_mounted_and_named_only_when_set() {
        let signing = [env::SIGNING_KEY, env::SIGNING_CERT, env::SIGNING_SECRET];
        for unset in [
            "version: \"2.8.0\"\nnodeAffinity: {}",
            "version: \"2.8.0\"\nnodeAffinity: {}\ninstaller: {signingSecret: \"\"}",
        ] {
            let p = policy(unset);
            let (c, pod) = container(&p, &ctx());
            for e in signing {
                assert_eq!(env_of(&c, e), None, "{e} for {unset}");
            }
            assert!(pod.volumes.iter().flatten().all(|v| v.secret.is_none()));
            assert!(
                c.volume_mounts
                    .iter()
                    .flatten()
                    .all(|m| m.mount_path != SIGNING_DIR)
            );
            // Nothing rendered: existing installers keep their template hash.
            let (_, h) = render_daemonset(&p, &ctx());
            let (_, plain) =
                render_daemonset(&policy("version: \"2.8.0\"\nnodeAffinity: {}"), &ctx());
            assert_eq!(h, plain, "{unset}");
        }
        let p = policy(
            "version: \"2.8.0\"\nnodeAffinity: {}\ninstaller: {signingSecret: module-signing}",
        );
        let (c, pod) = container(&p, &ctx());
        assert_eq!(
            env_of(&c, env::SIGNING_KEY).as_deref(),
            Some("/etc/ttdrv/signing/tls.key")
        );
        assert_eq!(
            env_of(&c, env::SIGNING_CERT).as_deref(),
            Some("/etc/ttdrv/signing/tls.crt")
        );
        assert_eq!(
            env_of(&c, env::SIGNING_SECRET).as_deref(),
            Some("tt-k8s-driver-manager-system/module-signing"),
            "the Secret is looked up in the operator's namespace"
        );
        let v = volume(&pod, "signing-key")
            .and_then(|v| v.secret.as_ref())
            .expect("secret volume");
        assert_eq!(v.secret_name.as_deref(), Some("module-signing"));
        assert_eq!(
            v.optional,
            Some(true),
            "a missing Secret must not stall the pod"
        );
        assert_eq!(v.default_mode, Some(0o400));
        let m = mount(&c, "signing-key");
        assert_eq!(
            (m.mount_path.as_str(), m.read_only),
            (SIGNING_DIR, Some(true))
        );
    }

    #[test]
    fn installer_has_resources_and_writes_only_its_host_directories() {
        let (c, pod) = container(&policy("version: \"2.8.0\"\nnodeAffinity: {}"), &ctx());
        let r = c.resources.expect("resources");
        let get = |m: &Option<BTreeMap<String, Quantity>>, k: &str| {
            m.as_ref().and_then(|m| m.get(k)).map(|q| q.0.clone())
        };
        assert_eq!(
            get(&r.requests, "memory").as_deref(),
            Some(INSTALLER_MEMORY_REQUEST)
        );
        assert_eq!(
            get(&r.limits, "memory").as_deref(),
            Some(INSTALLER_MEMORY_LIMIT)
        );
        assert_eq!(
            get(&r.requests, "cpu").as_deref(),
            Some(INSTALLER_CPU_REQUEST)
        );
        let mounts = c.volume_mounts.expect("mounts");
        let writable: Vec<&str> = mounts
            .iter()
            .filter(|m| m.read_only != Some(true))
            .map(|m| m.mount_path.as_str())
            .collect();
        assert_eq!(
            writable,
            [
                "/host/var/cache/tt-kmd",
                "/host/usr/local/bin",
                "/host/etc/udev/rules.d",
                "/host/opt"
            ],
            "the host root itself is read-only"
        );
        let volumes = pod.volumes.expect("volumes");
        for m in mounts.iter().filter(|m| m.read_only != Some(true)) {
            let v = volumes
                .iter()
                .find(|v| v.name == m.name)
                .and_then(|v| v.host_path.as_ref())
                .expect("a hostPath volume per mount");
            assert_eq!(m.mount_path, format!("/host{}", v.path), "{}", m.name);
            assert_eq!(v.type_.as_deref(), Some("DirectoryOrCreate"), "{}", m.name);
        }
    }

    #[test]
    fn daemonset_shape() {
        let (ds, hash) = render_daemonset(&policy("version: \"2.8.0\"\nnodeAffinity: {}"), &ctx());
        assert_eq!(ds.metadata.name.as_deref(), Some("ttdrv-fleet"));
        let spec = ds.spec.expect("spec");
        assert_eq!(
            spec.update_strategy.and_then(|u| u.type_).as_deref(),
            Some("OnDelete")
        );
        // The Go operator's labels on the pods, outside the (immutable) selector.
        let pod_labels = spec
            .template
            .metadata
            .as_ref()
            .and_then(|m| m.labels.clone())
            .unwrap_or_default();
        assert_eq!(
            pod_labels.get(labels::GO_CR).map(String::as_str),
            Some("fleet")
        );
        assert_eq!(
            pod_labels.get(labels::COMPONENT).map(String::as_str),
            Some("driver")
        );
        let selector = spec.selector.match_labels.clone().unwrap_or_default();
        assert!(!selector.contains_key(labels::GO_CR) && !selector.contains_key(labels::COMPONENT));
        assert!(
            selector.iter().all(|(k, v)| pod_labels.get(k) == Some(v)),
            "the selector selects the pods"
        );
        let pod = spec.template.spec.expect("pod spec");
        assert_eq!(
            pod.priority_class_name.as_deref(),
            Some("system-node-critical")
        );
        let c = &pod.containers[0];
        assert_eq!(
            c.security_context.as_ref().and_then(|s| s.privileged),
            Some(true)
        );
        assert_eq!(
            c.readiness_probe.as_ref().and_then(|p| p.period_seconds),
            Some(10)
        );
        let envs: BTreeMap<_, _> = c
            .env
            .iter()
            .flatten()
            .map(|e| (e.name.clone(), e.value.clone()))
            .collect();
        assert_eq!(
            envs.get(env::TT_KMD_VERSION),
            Some(&Some("2.8.0".to_string()))
        );
        assert_eq!(
            envs.get(env::FORCE_UNLOAD),
            Some(&Some("false".to_string()))
        );
        let ann = spec
            .template
            .metadata
            .and_then(|m| m.annotations)
            .unwrap_or_default();
        assert_eq!(ann.get(labels::TEMPLATE_HASH), Some(&hash));
        assert_eq!(hash.len(), 64);
        assert_eq!(
            ds.metadata
                .owner_references
                .map(|o| o[0].kind.clone())
                .as_deref(),
            Some("TenstorrentDriverPolicy")
        );
    }

    #[test]
    fn proxy_variables_reach_the_installer() {
        let mut c = ctx();
        c.proxy_env = vec![
            ("HTTPS_PROXY".into(), "http://proxy:3128".into()),
            ("no_proxy".into(), ".svc".into()),
        ];
        let p = policy("version: \"2.8.0\"\nnodeAffinity: {}");
        let (ds, hash) = render_daemonset(&p, &c);
        let envs: BTreeMap<String, String> = ds
            .spec
            .expect("spec")
            .template
            .spec
            .expect("pod spec")
            .containers[0]
            .env
            .clone()
            .unwrap_or_default()
            .into_iter()
            .filter_map(|e| e.value.map(|v| (e.name, v)))
            .collect();
        assert_eq!(
            envs.get("HTTPS_PROXY").map(String::as_str),
            Some("http://proxy:3128")
        );
        assert_eq!(envs.get("no_proxy").map(String::as_str), Some(".svc"));
        assert!(!envs.contains_key("HTTP_PROXY"));
        let (_, plain) = render_daemonset(&p, &ctx());
        assert_ne!(hash, plain, "the proxy is part of the template");
    }

    #[test]
    fn without_nfd_the_affinity_drops_the_pci_label() {
        let p = policy("version: \"2.8.0\"\nnodeAffinity: {matchLabels: {pool: a}}");
        let keys = |e: ttdrv_core::selection::Eligibility| -> Vec<String> {
            node_affinity(&p, e)
                .required_during_scheduling_ignored_during_execution
                .expect("required")
                .node_selector_terms[0]
                .match_expressions
                .clone()
                .expect("expressions")
                .into_iter()
                .map(|r| r.key)
                .collect()
        };
        let strict = keys(Default::default());
        assert!(strict.iter().any(|k| k == labels::TT_PCI_PRESENT));
        let lax = keys(ttdrv_core::selection::Eligibility {
            require_tenstorrent_label: false,
        });
        assert!(!lax.iter().any(|k| k == labels::TT_PCI_PRESENT));
        assert!(lax.iter().any(|k| k == labels::SKIP));
        assert!(lax.iter().any(|k| k == "pool"));
    }

    #[test]
    fn an_unmanaged_policy_unloads_only_and_skips_vacated_nodes() {
        let managed = policy("version: \"2.8.0\"\nnodeAffinity: {}\n");
        let p = policy("version: \"2.8.0\"\nnodeAffinity: {}\nunmanage: true\n");
        let has_unmanaged_rule = |p: &TenstorrentDriverPolicy| {
            node_affinity(p, Default::default())
                .required_during_scheduling_ignored_during_execution
                .into_iter()
                .flat_map(|s| s.node_selector_terms)
                .flat_map(|t| t.match_expressions.unwrap_or_default())
                .any(|r| r.key == labels::UNMANAGED && r.operator == "DoesNotExist")
        };
        assert!(has_unmanaged_rule(&p));
        assert!(
            !has_unmanaged_rule(&managed),
            "a managed policy's template (and hash) is unchanged"
        );
        let env_of = |p: &TenstorrentDriverPolicy| template_env(p, env::UNMANAGE);
        assert_eq!(env_of(&p).as_deref(), Some("true"));
        assert_eq!(env_of(&managed), None);
    }

    #[test]
    fn the_next_kernel_preflight_is_turned_off_by_env_and_on_leaves_the_template() {
        let env_of = |p: &TenstorrentDriverPolicy| template_env(p, env::NEXT_KERNELS);
        let on = policy("version: \"2.8.0\"\nnodeAffinity: {}\n");
        let off = policy(
            "version: \"2.8.0\"\nnodeAffinity: {}\nupgradePolicy: {prepare: {nextKernels: false}}\n",
        );
        assert_eq!(env_of(&on), None);
        assert_eq!(env_of(&off).as_deref(), Some("false"));
    }

    #[test]
    fn module_parameters_are_in_the_template_only_when_set() {
        let env_of = |p: &TenstorrentDriverPolicy| template_env(p, env::MODULE_PARAMETERS);
        let none = policy("version: \"2.8.0\"\nnodeAffinity: {}\n");
        let empty = policy("version: \"2.8.0\"\nnodeAffinity: {}\nmoduleParameters: {}\n");
        let set = policy(
            "version: \"2.8.0\"\nnodeAffinity: {}\nmoduleParameters: {powerPolicy: false, maxDevices: 4}\n",
        );
        assert_eq!(env_of(&none), None);
        assert_eq!(env_of(&empty), None);
        assert_eq!(
            template_hash(&pod_template(&none, &ctx())),
            template_hash(&pod_template(&empty, &ctx())),
            "an empty moduleParameters keeps the template"
        );
        assert_eq!(
            env_of(&set).as_deref(),
            Some("max_devices=4 power_policy=N")
        );
    }
}
