//! `--owner KIND/NAME`: the `ownerReference` that makes the garbage collector delete the lock
//! with that object. Invariant: the owner's uid is read from the API; `controller` and
//! `blockOwnerDeletion` are never set.

use k8s_openapi::apimachinery::pkg::apis::meta::v1::OwnerReference;
use kube::api::DynamicObject;

use super::discovery::{ResourceArg, ResourceType};
use super::error::status_code;
use super::{Cluster, PluginError, Target};
use crate::api::LockOperation;

/// The ownerReference to the object `text` (`KIND/NAME`) names, for the lock of `target`: in
/// the target's namespace, or cluster-scoped; a ClusterLock takes cluster-scoped owners only.
pub(super) async fn resolve(
    cluster: &Cluster,
    text: &str,
    target: &Target,
    operations: &[LockOperation],
) -> Result<OwnerReference, PluginError> {
    let (arg, name) = parse(text)?;
    let resource = cluster
        .resolve(&arg)
        .await
        .map_err(|e| flag_error(text, e))?;
    let namespace = placed(&resource, target).map_err(|why| flag_usage(text, why))?;
    if refuses_own_deletion(&resource, &name, namespace.as_deref(), target, operations) {
        return Err(flag_usage(
            text,
            "that is the locked object itself, and a lock refusing its deletion would never end \
             (lock UPDATE only with --operations UPDATE, or name another owner)"
                .to_owned(),
        ));
    }
    let api = cluster.api(&resource.api_resource(), namespace.as_deref());
    let owner = describe(&resource, &name, namespace.as_deref());
    match api.get(&name).await {
        Ok(object) => reference(&resource, &object).ok_or_else(|| PluginError::Api {
            action: format!("cannot own the lock by {owner}"),
            detail: "the API server returned it without a uid".to_owned(),
        }),
        Err(e) if status_code(&e) == Some(404) => {
            Err(flag_usage(text, format!("{owner} does not exist")))
        }
        Err(e) => Err(cluster.failed(&e, format!("cannot read the owner {owner}"))),
    }
}

/// `KIND/NAME` (a resource as kubectl names it, then the name).
fn parse(text: &str) -> Result<(ResourceArg, String), PluginError> {
    match text.split_once('/') {
        Some((kind, name)) if !kind.is_empty() && !name.is_empty() && !name.contains('/') => {
            Ok((ResourceArg::parse(kind), name.to_owned()))
        }
        _ => Err(flag_usage(
            text,
            "expected KIND/NAME (such as job/backup)".to_owned(),
        )),
    }
}

/// The owner's namespace (`None`: cluster-scoped), or why it cannot own the target's lock.
fn placed(resource: &ResourceType, target: &Target) -> Result<Option<String>, String> {
    match (resource.namespaced, &target.namespace) {
        (false, _) => Ok(None),
        (true, Some(ns)) => Ok(Some(ns.clone())),
        (true, None) => Err(format!(
            "{} are namespaced, and the lock of a cluster-scoped object is a ClusterLock, which \
             only a cluster-scoped object can own (Kubernetes' rule for owners)",
            resource.qualified()
        )),
    }
}

/// Whether the owner is the locked object and the lock refuses deleting it.
fn refuses_own_deletion(
    resource: &ResourceType,
    name: &str,
    namespace: Option<&str>,
    target: &Target,
    operations: &[LockOperation],
) -> bool {
    let same = resource.group == target.resource.group
        && resource.plural == target.resource.plural
        && name == target.name
        && namespace == target.namespace.as_deref();
    same && (operations.is_empty() || operations.contains(&LockOperation::Delete))
}

/// The reference to `object`, of the type `resource`; `None` without a uid.
fn reference(resource: &ResourceType, object: &DynamicObject) -> Option<OwnerReference> {
    let uid = object.metadata.uid.clone().filter(|uid| !uid.is_empty())?;
    Some(OwnerReference {
        api_version: resource.api_resource().api_version,
        kind: resource.kind.clone(),
        name: object.metadata.name.clone().unwrap_or_default(),
        uid,
        controller: None,
        block_owner_deletion: None,
    })
}

/// `jobs.batch "backup" in namespace "prod"`.
fn describe(resource: &ResourceType, name: &str, namespace: Option<&str>) -> String {
    match namespace {
        Some(ns) => format!("{} \"{name}\" in namespace \"{ns}\"", resource.qualified()),
        None => format!("{} \"{name}\"", resource.qualified()),
    }
}

/// `Job/backup`, as `kubectl lock` and `kubectl lock list` show an owner.
pub(super) fn short(reference: &OwnerReference) -> String {
    format!("{}/{}", reference.kind, reference.name)
}

fn flag_usage(text: &str, why: String) -> PluginError {
    PluginError::Usage(format!("--owner {text}: {why}"))
}

/// A resolution error, with the flag it came from.
fn flag_error(text: &str, error: PluginError) -> PluginError {
    match error {
        e @ (PluginError::UnknownResource { .. } | PluginError::Ambiguous { .. }) => {
            flag_usage(text, e.to_string())
        }
        other => other,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn resource(group: &str, plural: &str, kind: &str, namespaced: bool) -> ResourceType {
        ResourceType {
            group: group.into(),
            version: "v1".into(),
            preferred: true,
            plural: plural.into(),
            singular: String::new(),
            kind: kind.into(),
            short_names: vec![],
            namespaced,
        }
    }

    fn target(namespace: Option<&str>) -> Target {
        let namespaced = namespace.is_some();
        Target {
            resource: resource("apps", "deployments", "Deployment", namespaced),
            name: "web".into(),
            namespace: namespace.map(str::to_owned),
        }
    }

    #[test]
    fn owners_are_kind_slash_name() {
        let (arg, name) = parse("job.batch/backup").expect("valid");
        assert_eq!((arg.text.as_str(), name.as_str()), ("job.batch", "backup"));
        for bad in ["job", "job/", "/backup", "job/a/b", ""] {
            let err = parse(bad).expect_err("refused").to_string();
            assert!(
                err.starts_with(&format!("--owner {bad}: expected KIND/NAME")),
                "{err}"
            );
        }
    }

    #[test]
    fn a_cluster_lock_takes_cluster_scoped_owners_only() {
        let job = resource("batch", "jobs", "Job", true);
        let ns = resource("", "namespaces", "Namespace", false);
        assert_eq!(placed(&job, &target(Some("prod"))), Ok(Some("prod".into())));
        assert_eq!(placed(&ns, &target(Some("prod"))), Ok(None));
        assert_eq!(placed(&ns, &target(None)), Ok(None));
        let err = placed(&job, &target(None)).expect_err("refused");
        assert!(
            err.starts_with("jobs.batch are namespaced") && err.contains("ClusterLock"),
            "{err}"
        );
    }

    #[test]
    fn the_locked_object_cannot_own_a_lock_refusing_its_deletion() {
        let deployments = resource("apps", "deployments", "Deployment", true);
        let t = target(Some("prod"));
        let own = |ops: &[LockOperation]| {
            refuses_own_deletion(&deployments, "web", Some("prod"), &t, ops)
        };
        assert!(own(&[]));
        assert!(own(&[LockOperation::Delete]));
        assert!(!own(&[LockOperation::Update]), "UPDATE only: ends with it");
        let jobs = resource("batch", "jobs", "Job", true);
        assert!(!refuses_own_deletion(&jobs, "web", Some("prod"), &t, &[]));
        assert!(!refuses_own_deletion(
            &deployments,
            "api",
            Some("prod"),
            &t,
            &[]
        ));
    }

    #[test]
    fn the_reference_names_the_object_and_its_uid() {
        let job = resource("batch", "jobs", "Job", true);
        let object: DynamicObject = serde_json::from_value(json!({
            "apiVersion": "batch/v1", "kind": "Job",
            "metadata": {"name": "backup", "namespace": "prod", "uid": "u-1"},
        }))
        .expect("an object");
        let reference = reference(&job, &object).expect("has a uid");
        assert_eq!(
            serde_json::to_value(&reference).expect("json"),
            json!({"apiVersion": "batch/v1", "kind": "Job", "name": "backup", "uid": "u-1"})
        );
        assert_eq!(short(&reference), "Job/backup");
        let mut no_uid = object.clone();
        no_uid.metadata.uid = None;
        assert_eq!(super::reference(&job, &no_uid), None);
    }
}
