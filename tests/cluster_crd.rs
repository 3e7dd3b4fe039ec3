//! The CRD against the real API server: the spec's examples apply and read back
//! with the documented defaults; invalid objects are refused naming the field.

use kube::Api;
use ttdrv_api::{PullPolicy, TenstorrentDriverPolicy};
use ttdrv_testkit::policy::{create_raw_policy, delete_policies, dynamic_api};
use ttdrv_testkit::{TestEnv, ensure_crd};

/// Creates `spec` (YAML) under a unique name; returns the API server's answer.
async fn create(
    env: &TestEnv,
    suffix: &str,
    spec_yaml: &str,
) -> Result<TenstorrentDriverPolicy, kube::Error> {
    let spec: serde_json::Value = serde_yaml::from_str(spec_yaml).expect("test YAML parses");
    let created = create_raw_policy(env, &env.name(suffix), &spec).await?;
    let typed: Api<TenstorrentDriverPolicy> = Api::all(env.client.clone());
    let name = created.metadata.name.unwrap_or_default();
    typed.get(&name).await
}

#[tokio::test]
#[ignore = "needs the local cluster: run `make test` (or hack/run-cluster-tests.sh)"]
async fn spec_examples_apply_with_documented_defaults() {
    let env = TestEnv::new("crd-examples").await;
    ensure_crd(&env.client).await;

    let promoted = create(
        &env,
        "promoted",
        "version: \"2.8.0\"\nnodeAffinity: {}\npromoteAfter: { policy: canary }",
    )
    .await
    .expect("a CR with promoteAfter applies");
    let after = promoted.spec.promote_after.expect("promoteAfter read back");
    assert_eq!((after.policy.as_str(), after.soak_seconds), ("canary", 0));
    let min = create(&env, "minimum", "version: \"2.8.0\"\nnodeAffinity: {}")
        .await
        .expect("minimum CR applies");
    let s = &min.spec;
    assert_eq!(s.version, "2.8.0");
    assert!(!s.paused);
    assert!(s.upgrade_policy.drain.enable);
    assert!(s.upgrade_policy.drain.full_node);
    assert_eq!(s.upgrade_policy.drain.pod_selector_label, "");
    assert!(!s.upgrade_policy.drain.force);
    assert!(s.upgrade_policy.drain.delete_empty_dir);
    assert_eq!(s.upgrade_policy.drain.timeout_seconds, 600);
    assert!(!s.upgrade_policy.force_unload);
    assert_eq!(
        s.upgrade_policy.max_unavailable,
        k8s_openapi::apimachinery::pkg::util::intstr::IntOrString::Int(1)
    );
    assert_eq!(s.installer.image_pull_policy, PullPolicy::IfNotPresent);
    assert!(s.installer.image.is_none());

    // The raw object as stored must carry the defaults too (not just our serde defaults).
    let raw = dynamic_api(&env)
        .get(&env.name("minimum"))
        .await
        .expect("raw get");
    let spec = &raw.data["spec"];
    assert_eq!(spec["upgradePolicy"]["drain"]["timeoutSeconds"], 600);
    assert_eq!(spec["upgradePolicy"]["maxUnavailable"], 1);
    assert_eq!(spec["installer"]["imagePullPolicy"], "IfNotPresent");
    assert_eq!(spec["paused"], false);

    let prod = create(
        &env,
        "prod",
        "version: \"2.7.0\"\nnodeAffinity: { matchLabels: { tt.tenstorrent.com/pool: prod } }",
    )
    .await
    .expect("pool CR applies");
    assert_eq!(
        prod.spec
            .selector()
            .and_then(|s| s.match_labels.clone())
            .and_then(|m| m.get("tt.tenstorrent.com/pool").cloned()),
        Some("prod".into())
    );
    create(
        &env,
        "canary",
        "version: \"2.8.0\"\nnodeAffinity: { matchLabels: { tt.tenstorrent.com/pool: canary } }",
    )
    .await
    .expect("canary CR applies");
    let canary_img = create(
        &env,
        "img",
        "version: \"2.8.0\"\nnodeAffinity: {}\ninstaller:\n  image: ghcr.io/tenstorrent/tt-k8s-driver-manager-builder:sha-abc1234\n  imagePullPolicy: Always",
    )
    .await
    .expect("installer override applies");
    assert_eq!(
        canary_img.spec.installer.image_pull_policy,
        PullPolicy::Always
    );
    let paused = create(
        &env,
        "paused",
        "version: \"2.8.0\"\nnodeAffinity: {}\npaused: true",
    )
    .await
    .expect("paused applies");
    assert!(paused.spec.paused);
    let alias = create(
        &env,
        "alias",
        "version: \"2.8.0\"\nnodeSelector: { matchLabels: { a: b } }",
    )
    .await
    .expect("deprecated alias applies");
    assert!(alias.spec.uses_deprecated_node_selector());
    let pct = create(
        &env,
        "pct",
        "version: \"2.8.0\"\nnodeAffinity: {}\nupgradePolicy: { maxUnavailable: \"25%\", drain: { podSelectorLabel: \"app in (train, infer),!batch\" } }\ninstaller: { sourceRepository: \"https://git.example.internal/mirror/tt-kmd.git\" }",
    )
    .await
    .expect("percentage, selector and mirror apply");
    assert_eq!(
        pct.spec.upgrade_policy.drain.timeout_seconds, 600,
        "sibling defaults still filled"
    );
    delete_policies(&env).await;
}

#[tokio::test]
#[ignore = "needs the local cluster: run `make test` (or hack/run-cluster-tests.sh)"]
async fn invalid_objects_are_rejected_naming_the_field() {
    let env = TestEnv::new("crd-invalid").await;
    ensure_crd(&env.client).await;
    let cases: &[(&str, &str, &str)] = &[
        (
            "v-prefix",
            "version: v2.8.0\nnodeAffinity: {}",
            "spec.version",
        ),
        (
            "two-part",
            "version: \"2.8\"\nnodeAffinity: {}",
            "spec.version",
        ),
        ("no-version", "nodeAffinity: {}", "spec.version"),
        ("no-affinity", "version: \"2.8.0\"", "spec.nodeAffinity"),
        (
            "both",
            "version: \"2.8.0\"\nnodeAffinity: {}\nnodeSelector: {}",
            "spec.nodeSelector",
        ),
        (
            "like",
            "version: \"2.8.0\"\nnodeAffinity: { matchExpressions: [ { key: a, operator: Like } ] }",
            "spec.nodeAffinity.matchExpressions[0].operator",
        ),
        (
            "exists-values",
            "version: \"2.8.0\"\nnodeAffinity: { matchExpressions: [ { key: a, operator: Exists, values: [x] } ] }",
            "spec.nodeAffinity.matchExpressions[0].values",
        ),
        (
            "in-empty",
            "version: \"2.8.0\"\nnodeAffinity: { matchExpressions: [ { key: a, operator: In } ] }",
            "spec.nodeAffinity.matchExpressions[0].values",
        ),
        (
            "neg-timeout",
            "version: \"2.8.0\"\nnodeAffinity: {}\nupgradePolicy: { drain: { timeoutSeconds: -1 } }",
            "spec.upgradePolicy.drain.timeoutSeconds",
        ),
        (
            "bad-selector",
            "version: \"2.8.0\"\nnodeAffinity: {}\nupgradePolicy: { drain: { podSelectorLabel: \"app in train\" } }",
            "spec.upgradePolicy.drain.podSelectorLabel",
        ),
        (
            "pull-policy",
            "version: \"2.8.0\"\nnodeAffinity: {}\ninstaller: { imagePullPolicy: Sometimes }",
            "spec.installer.imagePullPolicy",
        ),
        (
            "max-zero",
            "version: \"2.8.0\"\nnodeAffinity: {}\nupgradePolicy: { maxUnavailable: 0 }",
            "spec.upgradePolicy.maxUnavailable",
        ),
        (
            "max-pct",
            "version: \"2.8.0\"\nnodeAffinity: {}\nupgradePolicy: { maxUnavailable: \"150%\" }",
            "spec.upgradePolicy.maxUnavailable",
        ),
        (
            "bad-repo",
            "version: \"2.8.0\"\nnodeAffinity: {}\ninstaller: { sourceRepository: \"not a url\" }",
            "spec.installer.sourceRepository",
        ),
        (
            "promote-bad-name",
            "version: \"2.8.0\"\nnodeAffinity: {}\npromoteAfter: { policy: Canary_1 }",
            "spec.promoteAfter.policy",
        ),
        (
            "promote-neg-soak",
            "version: \"2.8.0\"\nnodeAffinity: {}\npromoteAfter: { policy: canary, soakSeconds: -1 }",
            "spec.promoteAfter.soakSeconds",
        ),
        (
            "promote-long-soak",
            "version: \"2.8.0\"\nnodeAffinity: {}\npromoteAfter: { policy: canary, soakSeconds: 604801 }",
            "spec.promoteAfter.soakSeconds",
        ),
    ];
    // A policy that names itself as its canary (CEL at the root).
    let own = env.name("promote-self");
    let self_spec =
        format!("version: \"2.8.0\"\nnodeAffinity: {{}}\npromoteAfter: {{ policy: {own} }}");
    let cases = cases.iter().copied().chain([(
        "promote-self",
        self_spec.as_str(),
        "spec.promoteAfter.policy",
    )]);
    for (suffix, spec, field) in cases {
        match create(&env, suffix, spec).await {
            Ok(_) => panic!("{suffix}: the API server accepted an invalid object:\n{spec}"),
            Err(kube::Error::Api(status)) => {
                assert_eq!(
                    status.code, 422,
                    "{suffix}: expected 422 Invalid, got {status:?}"
                );
                assert!(
                    status.message.contains(field),
                    "{suffix}: the error must name {field}; got: {}",
                    status.message
                );
            }
            Err(e) => panic!("{suffix}: unexpected error {e}"),
        }
    }
    delete_policies(&env).await;
}
