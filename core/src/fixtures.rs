//! Fixtures shared by the tests of this crate and of the controller: the
//! `fleet` policy's desired state, and nodes carrying only what the machine
//! reads (name, labels, cordon, Ready). Not used by shipped code.

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::{Node, NodeCondition, NodeSpec, NodeStatus};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;

use crate::machine::{Desired, DrainProgress, InstallerPod, Observation};

/// What the policy `fleet` asks: 2.8.0, drain on (600 s), upgrade timeout
/// 900 s, rollback on a failed validation (the default), not paused,
/// refused, unmanaged or building ahead.
pub fn desired() -> Desired {
    Desired {
        policy: "fleet".into(),
        version: "2.8.0".into(),
        drain_enabled: true,
        drain_timeout_seconds: 600,
        upgrade_timeout_seconds: 900,
        paused: false,
        refused: false,
        unmanage: false,
        prepare: false,
        parameters: Default::default(),
        min_firmware: None,
        combine_with_firmware: true,
        soak_seconds: 0,
        hold: None,
        validation_pod: None,
        validation_timeout_seconds: 60,
        surface_timeout_seconds: crate::machine::DEFAULT_SURFACE_TIMEOUT_SECONDS,
        rollback: true,
    }
}

/// What the machine's table tests start from: a Ready, uncordoned node at
/// t=1000 with 2.7.0 loaded, a stale installer pod, a finished (empty) drain,
/// a slot, and the target prepared.
pub fn observation() -> Observation {
    Observation {
        now: 1000,
        node: "n1".into(),
        ready: true,
        loaded: Some("2.7.0".into()),
        installer: InstallerPod::Stale { deleting: false },
        drain: Some(DrainProgress::default()),
        slot: true,
        prepared: true,
        ..Observation::default()
    }
}

/// A node `name` with `labels`, cordoned when `unschedulable`, its Ready
/// condition `ready` ("True", "False", "Unknown").
pub fn node(name: &str, ready: &str, unschedulable: bool, labels: &[(&str, &str)]) -> Node {
    let labels: BTreeMap<String, String> = labels
        .iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect();
    Node {
        metadata: ObjectMeta {
            name: Some(name.into()),
            labels: Some(labels),
            ..Default::default()
        },
        spec: Some(NodeSpec {
            unschedulable: Some(unschedulable),
            ..Default::default()
        }),
        status: Some(NodeStatus {
            conditions: Some(vec![NodeCondition {
                type_: "Ready".into(),
                status: ready.into(),
                ..Default::default()
            }]),
            ..Default::default()
        }),
    }
}

/// The metadata of an object `name` in `namespace`, nothing else set.
pub fn meta(name: &str, namespace: &str) -> ObjectMeta {
    ObjectMeta {
        name: Some(name.into()),
        namespace: Some(namespace.into()),
        ..Default::default()
    }
}

/// A ResourceSlice of `driver` on `node` (its pool named after the node, as
/// the tt-dra-driver plugin names it), at pool `generation`, listing
/// `devices` devices `card0`, `card1`, ...
pub fn resource_slice(
    node: &str,
    driver: &str,
    generation: i64,
    devices: u32,
) -> k8s_openapi::api::resource::v1::ResourceSlice {
    use k8s_openapi::api::resource::v1::{Device, ResourcePool, ResourceSlice, ResourceSliceSpec};
    ResourceSlice {
        metadata: ObjectMeta {
            name: Some(format!("{node}-{driver}")),
            ..Default::default()
        },
        spec: ResourceSliceSpec {
            driver: driver.into(),
            node_name: Some(node.into()),
            pool: ResourcePool {
                name: node.into(),
                generation,
                resource_slice_count: 1,
            },
            devices: Some(
                (0..devices)
                    .map(|i| Device {
                        name: format!("card{i}"),
                        ..Default::default()
                    })
                    .collect(),
            ),
            ..Default::default()
        },
    }
}
