//! The `Lock` and `ClusterLock` custom resources.
//!
//! A lock is identified by where it lives, not by what it says: a `Lock` named `x` in namespace
//! `ns` locks every namespaced object named `x` in `ns`; a `ClusterLock` named `x` locks every
//! cluster-scoped object named `x`. The spec only adds context, so it may be empty, and the
//! generated CRD defaults it to `{}` so that `kubectl create` of a bare lock works and every lock
//! read back from the API server has a spec.
//!
//! Field docs become the CRD's descriptions, which is what `kubectl explain lock.spec` shows.

use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::{
    CustomResourceDefinition, JSONSchemaProps,
};
use kube::{CustomResource, CustomResourceExt};
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

/// The API group of the lock resources.
pub const GROUP: &str = "objectlock.dev";
/// The served (and stored) version of the lock resources.
pub const VERSION: &str = "v1alpha1";
/// `apiVersion` of both lock kinds.
pub const API_VERSION: &str = "objectlock.dev/v1alpha1";
/// Plural resource name of [`Lock`].
pub const LOCKS: &str = "locks";
/// Plural resource name of [`ClusterLock`].
pub const CLUSTER_LOCKS: &str = "clusterlocks";

/// Locks the object with the same name in the same namespace: while this Lock exists, UPDATE
/// and DELETE of that object are refused by the kube-object-lock admission webhook. Delete the
/// Lock to unlock.
#[derive(CustomResource, Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[kube(
    group = "objectlock.dev",
    version = "v1alpha1",
    kind = "Lock",
    namespaced,
    shortname = "lk",
    category = "objectlocks",
    derive = "PartialEq",
    doc = "Locks the namespaced object of the same name in the same namespace against UPDATE and DELETE.",
    printcolumn = r#"{"name":"Reason","type":"string","jsonPath":".spec.reason","description":"Why the object is locked"}"#,
    printcolumn = r#"{"name":"Age","type":"date","jsonPath":".metadata.creationTimestamp"}"#
)]
#[serde(rename_all = "camelCase")]
pub struct LockSpec {
    /// Why the object is locked, for whoever is refused: it is shown in the denial message,
    /// e.g. "VM snapshot in progress". Optional: the lock applies with or without it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reason: Option<String>,
}

/// Locks the cluster-scoped object of the same name (a Namespace, a ClusterRole, a
/// PersistentVolume, ...): while this ClusterLock exists, UPDATE and DELETE of that object are
/// refused. Delete the ClusterLock to unlock.
#[derive(CustomResource, Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[kube(
    group = "objectlock.dev",
    version = "v1alpha1",
    kind = "ClusterLock",
    shortname = "clk",
    category = "objectlocks",
    derive = "PartialEq",
    doc = "Locks the cluster-scoped object of the same name against UPDATE and DELETE.",
    printcolumn = r#"{"name":"Reason","type":"string","jsonPath":".spec.reason","description":"Why the object is locked"}"#,
    printcolumn = r#"{"name":"Age","type":"date","jsonPath":".metadata.creationTimestamp"}"#
)]
pub struct ClusterLockSpec {
    /// The same fields as a Lock's spec.
    #[serde(flatten)]
    pub lock: LockSpec,
}

impl From<ClusterLockSpec> for LockSpec {
    fn from(spec: ClusterLockSpec) -> Self {
        spec.lock
    }
}

/// The two CRDs, ready to apply: `spec` is optional and defaults to `{}`.
pub fn crds() -> [CustomResourceDefinition; 2] {
    [
        optional_spec(Lock::crd()),
        optional_spec(ClusterLock::crd()),
    ]
}

/// The two CRDs as one multi-document YAML stream, as `kubectl apply -f -` takes it.
pub fn crds_yaml() -> Result<String, serde_saphyr::ser_error::Error> {
    let mut out = String::new();
    for crd in crds() {
        out.push_str("---\n");
        out.push_str(&serde_saphyr::to_string(&crd)?);
    }
    Ok(out)
}

/// The derive makes `spec` required; a lock locks by existing, so it must not be.
fn optional_spec(mut crd: CustomResourceDefinition) -> CustomResourceDefinition {
    for version in &mut crd.spec.versions {
        let Some(root) = version
            .schema
            .as_mut()
            .and_then(|s| s.open_api_v3_schema.as_mut())
        else {
            continue;
        };
        if let Some(required) = root.required.as_mut() {
            required.retain(|field| field != "spec");
            if required.is_empty() {
                root.required = None;
            }
        }
        if let Some(spec) = root.properties.as_mut().and_then(|p| p.get_mut("spec")) {
            *spec = JSONSchemaProps {
                default: Some(
                    k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::JSON(
                        serde_json::json!({}),
                    ),
                ),
                ..spec.clone()
            };
        }
    }
    crd
}

#[cfg(test)]
mod tests {
    use super::*;

    fn schema(crd: &CustomResourceDefinition) -> &JSONSchemaProps {
        crd.spec.versions[0]
            .schema
            .as_ref()
            .and_then(|s| s.open_api_v3_schema.as_ref())
            .expect("derived CRDs carry a schema")
    }

    #[test]
    fn spec_is_optional_and_defaults_to_empty() {
        for crd in crds() {
            let root = schema(&crd);
            assert!(
                !root.required.iter().flatten().any(|field| field == "spec"),
                "{} requires spec",
                crd.spec.names.kind
            );
            let spec = &root.properties.as_ref().expect("properties")["spec"];
            assert_eq!(
                spec.default.as_ref().map(|d| &d.0),
                Some(&serde_json::json!({}))
            );
        }
    }

    #[test]
    fn names_scope_and_columns() {
        let [lock, cluster] = crds();
        assert_eq!(lock.metadata.name.as_deref(), Some("locks.objectlock.dev"));
        assert_eq!(lock.spec.scope, "Namespaced");
        assert_eq!(lock.spec.names.short_names, Some(vec!["lk".to_owned()]));
        assert_eq!(
            cluster.metadata.name.as_deref(),
            Some("clusterlocks.objectlock.dev")
        );
        assert_eq!(cluster.spec.scope, "Cluster");
        assert_eq!(cluster.spec.names.short_names, Some(vec!["clk".to_owned()]));
        for crd in [&lock, &cluster] {
            assert_eq!(
                crd.spec.names.categories,
                Some(vec!["objectlocks".to_owned()])
            );
            let columns: Vec<_> = crd.spec.versions[0]
                .additional_printer_columns
                .iter()
                .flatten()
                .map(|c| c.name.as_str())
                .collect();
            assert_eq!(columns, ["Reason", "Age"]);
        }
    }

    #[test]
    fn every_spec_field_is_described() {
        for crd in crds() {
            let spec = &schema(&crd).properties.as_ref().expect("properties")["spec"];
            let fields = spec.properties.as_ref().expect("spec has fields");
            assert!(!fields.is_empty());
            for (name, field) in fields {
                assert!(
                    field.description.as_deref().is_some_and(|d| d.len() > 20),
                    "{}: spec.{name} has no description",
                    crd.spec.names.kind
                );
            }
        }
    }

    #[test]
    fn cluster_lock_spec_reads_like_a_lock_spec() {
        let spec: ClusterLockSpec =
            serde_json::from_value(serde_json::json!({"reason": "migration"})).expect("parses");
        assert_eq!(LockSpec::from(spec).reason.as_deref(), Some("migration"));
    }

    #[test]
    fn yaml_has_both_documents() {
        let yaml = crds_yaml().expect("serializes");
        assert_eq!(yaml.matches("kind: CustomResourceDefinition").count(), 2);
        assert!(yaml.contains("name: locks.objectlock.dev"));
        assert!(yaml.contains("name: clusterlocks.objectlock.dev"));
    }
}
