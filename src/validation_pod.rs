//! The user's validation pod (`upgradePolicy.validation.podTemplateName`):
//! after a swap validated on the host, a pod of the user's PodTemplate runs
//! on the node, still cordoned, and must succeed before the node goes back
//! into service. The machine decides ([`ttdrv_core::machine`]); this makes
//! the pod.

use k8s_openapi::api::core::v1::{Pod, PodTemplate, Toleration};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::OwnerReference;
use kube::Resource;
use kube::api::{Api, PostParams};
use sha2::{Digest, Sha256};
use ttdrv_api::{TenstorrentDriverPolicy, labels};

use crate::{Error, Result};

/// The pod's name: one per policy, node and cycle.
pub fn pod_name(policy: &str, node: &str, cycle: i64) -> String {
    let digest = Sha256::digest(format!("{policy}/{node}/{cycle}").as_bytes());
    let hex: String = digest.iter().take(5).map(|b| format!("{b:02x}")).collect();
    format!("ttdrv-validate-{hex}")
}

/// The pod to run: the template's spec, bound to `node` (the scheduler is
/// not asked: the node is cordoned), never restarted, tolerating every
/// taint (a cordon's among them), labelled with its cycle and owned by the
/// policy (deleted with it).
pub fn render(
    template: &PodTemplate,
    policy: &TenstorrentDriverPolicy,
    node: &str,
    cycle: i64,
    namespace: &str,
) -> std::result::Result<Pod, String> {
    let policy_name = policy.metadata.name.clone().unwrap_or_default();
    let t = template
        .template
        .as_ref()
        .ok_or("the PodTemplate has no template")?;
    let mut spec = t.spec.clone().ok_or("the PodTemplate has no pod spec")?;
    spec.node_name = Some(node.to_string());
    spec.restart_policy = Some("Never".into());
    spec.tolerations
        .get_or_insert_with(Vec::new)
        .push(Toleration {
            operator: Some("Exists".into()),
            ..Default::default()
        });
    let mut meta = t.metadata.clone().unwrap_or_default();
    meta.name = Some(pod_name(&policy_name, node, cycle));
    meta.namespace = Some(namespace.to_string());
    meta.generate_name = None;
    let l = meta.labels.get_or_insert_with(Default::default);
    l.insert(labels::VALIDATION_CYCLE.into(), cycle.to_string());
    l.insert(labels::VALIDATION_POLICY.into(), policy_name.clone());
    if let Some(uid) = policy.metadata.uid.clone() {
        meta.owner_references = Some(vec![OwnerReference {
            api_version: TenstorrentDriverPolicy::api_version(&()).into_owned(),
            kind: TenstorrentDriverPolicy::kind(&()).into_owned(),
            name: policy_name,
            uid,
            ..Default::default()
        }]);
    }
    Ok(Pod {
        metadata: meta,
        spec: Some(spec),
        status: None,
    })
}

/// Whether the policy's validation can run at all, found before any node is
/// cordoned for it: a template that is missing, unreadable or makes no pod
/// refuses the policy instead of failing each node after its swap.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum TemplateCheck {
    Usable,
    /// Why no validation pod can be made from it: the refusal's message.
    Unusable(String),
    /// The API server did not answer (a transient error): not a reason to
    /// refuse, checked again next pass.
    Unknown(String),
}

/// How long a check holds before the template is read again: a template
/// created or fixed is picked up within it, and a busy rollout's passes
/// cost one read per policy in that time, not one each.
pub const CHECK_HOLDS: std::time::Duration = std::time::Duration::from_secs(10);

/// What a read of PodTemplate `template` in `namespace` says (`got`: the
/// template, or the API server's answer).
pub fn judge(
    template: &str,
    namespace: &str,
    got: std::result::Result<&PodTemplate, &kube::Error>,
    policy: &TenstorrentDriverPolicy,
) -> TemplateCheck {
    let field = "spec.upgradePolicy.validation.podTemplateName";
    match got {
        Ok(t) => match render(t, policy, "check", 0, namespace) {
            Ok(_) => TemplateCheck::Usable,
            Err(why) => TemplateCheck::Unusable(format!(
                "{field}: PodTemplate {namespace}/{template}: {why}"
            )),
        },
        Err(kube::Error::Api(e)) if e.code == 404 => TemplateCheck::Unusable(format!(
            "{field}: PodTemplate {namespace}/{template} does not exist (create it in the \
             controller's namespace, or remove upgradePolicy.validation): no node is cordoned \
             for a validation that cannot run"
        )),
        Err(kube::Error::Api(e)) if e.code == 403 => TemplateCheck::Unusable(format!(
            "{field}: the controller may not read PodTemplate {namespace}/{template} ({}): \
             grant it get on podtemplates in {namespace} (the chart's Role does)",
            e.message
        )),
        Err(e) => {
            TemplateCheck::Unknown(format!("reading PodTemplate {namespace}/{template}: {e}"))
        }
    }
}

/// Reads PodTemplate `template` and judges it ([`judge`]).
pub async fn check(
    client: kube::Client,
    template: &str,
    namespace: &str,
    policy: &TenstorrentDriverPolicy,
) -> TemplateCheck {
    let templates: Api<PodTemplate> = Api::namespaced(client, namespace);
    let got = templates.get(template).await;
    judge(template, namespace, got.as_ref(), policy)
}

/// Creates the cycle's validation pod from PodTemplate `template` in
/// `namespace` (an existing one is left as it is).
pub async fn run(
    client: kube::Client,
    template: &str,
    policy: &TenstorrentDriverPolicy,
    node: &str,
    cycle: i64,
    namespace: &str,
) -> Result<String> {
    let templates: Api<PodTemplate> = Api::namespaced(client.clone(), namespace);
    let t = templates.get(template).await.map_err(Error::kube(format!(
        "reading PodTemplate {namespace}/{template}"
    )))?;
    let pod =
        render(&t, policy, node, cycle, namespace).map_err(|message| Error::InvalidPolicy {
            policy: policy.metadata.name.clone().unwrap_or_default(),
            message: format!("upgradePolicy.validation.podTemplateName {template}: {message}"),
        })?;
    let name = pod.metadata.name.clone().unwrap_or_default();
    let pods: Api<Pod> = Api::namespaced(client, namespace);
    match pods.create(&PostParams::default(), &pod).await {
        Ok(_) => Ok(name),
        Err(kube::Error::Api(e)) if e.code == 409 => Ok(name),
        Err(e) => Err(Error::kube(format!(
            "creating validation pod {namespace}/{name}"
        ))(e)),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::api::core::v1::{Container, PodSpec, PodTemplateSpec};

    fn api_error(code: u16) -> kube::Error {
        let status: kube::core::Status = serde_json::from_value(serde_json::json!({
            "status": "Failure", "code": code, "message": "podtemplates \"burn\" is forbidden",
            "reason": if code == 404 { "NotFound" } else { "Forbidden" },
        }))
        .expect("status");
        kube::Error::Api(status.into())
    }

    #[test]
    fn a_template_that_cannot_make_a_pod_refuses_the_policy_naming_the_field() {
        let policy = TenstorrentDriverPolicy::new(
            "fleet",
            serde_yaml::from_str("version: \"2.8.0\"").expect("spec parses"),
        );
        let missing = judge("burn", "tt", Err(&api_error(404)), &policy);
        let TemplateCheck::Unusable(why) = missing else {
            panic!("a missing template refuses: {missing:?}")
        };
        assert!(
            why.starts_with(
                "spec.upgradePolicy.validation.podTemplateName: PodTemplate tt/burn does not exist"
            ),
            "{why}"
        );
        assert!(matches!(
            judge("burn", "tt", Err(&api_error(403)), &policy),
            TemplateCheck::Unusable(w) if w.contains("may not read")
        ));
        let empty = PodTemplate::default();
        assert!(matches!(
            judge("burn", "tt", Ok(&empty), &policy),
            TemplateCheck::Unusable(w) if w.contains("has no template")
        ));
        let usable = PodTemplate {
            template: Some(PodTemplateSpec {
                metadata: None,
                spec: Some(PodSpec::default()),
            }),
            ..Default::default()
        };
        assert_eq!(
            judge("burn", "tt", Ok(&usable), &policy),
            TemplateCheck::Usable
        );
        // The API server not answering is no reason to refuse.
        let down = kube::Error::Service(Box::new(std::io::Error::other("connection refused")));
        assert!(matches!(
            judge("burn", "tt", Err(&down), &policy),
            TemplateCheck::Unknown(_)
        ));
    }

    #[test]
    fn the_pod_is_bound_to_the_node_labelled_with_its_cycle_and_never_restarted() {
        let template = PodTemplate {
            template: Some(PodTemplateSpec {
                metadata: None,
                spec: Some(PodSpec {
                    containers: vec![Container {
                        name: "check".into(),
                        image: Some("ml/burn-in:1".into()),
                        ..Default::default()
                    }],
                    restart_policy: Some("Always".into()),
                    ..Default::default()
                }),
            }),
            ..Default::default()
        };
        let spec: ttdrv_api::TenstorrentDriverPolicySpec =
            serde_yaml::from_str("version: \"2.8.0\"").expect("spec parses");
        let mut policy = TenstorrentDriverPolicy::new("fleet", spec);
        policy.metadata.uid = Some("u-1".into());
        let pod = render(&template, &policy, "n1", 1234, "ops").expect("renders");
        let spec = pod.spec.as_ref().expect("spec");
        assert_eq!(spec.node_name.as_deref(), Some("n1"));
        assert_eq!(spec.restart_policy.as_deref(), Some("Never"));
        assert!(
            spec.tolerations
                .iter()
                .flatten()
                .any(|t| t.operator.as_deref() == Some("Exists") && t.key.is_none()),
            "tolerates the cordon"
        );
        let l = pod.metadata.labels.clone().unwrap_or_default();
        assert_eq!(
            l.get(labels::VALIDATION_CYCLE).map(String::as_str),
            Some("1234")
        );
        assert_eq!(
            l.get(labels::VALIDATION_POLICY).map(String::as_str),
            Some("fleet")
        );
        assert_eq!(pod.metadata.namespace.as_deref(), Some("ops"));
        assert_eq!(pod.metadata.name, Some(pod_name("fleet", "n1", 1234)));
        assert_ne!(pod_name("fleet", "n1", 1234), pod_name("fleet", "n1", 1235));
        let owner = &pod.metadata.owner_references.clone().unwrap_or_default()[0];
        assert_eq!(
            (owner.kind.as_str(), owner.uid.as_str()),
            ("TenstorrentDriverPolicy", "u-1")
        );
        // The ownership of a drained pod's facts: ours, by its labels.
        let facts = ttdrv_core::drain::PodFacts::of(&pod);
        assert_eq!(facts.validation.map(|v| v.cycle), Some(1234));
        assert!(render(&PodTemplate::default(), &policy, "n1", 1, "ops").is_err());
    }
}
