//! `--owner KIND/NAME`: the `ownerReference` by which the garbage collector deletes the lock with
//! that object; its uid read from the API, never `controller` nor `blockOwnerDeletion`.

use k8s_openapi::apimachinery::pkg::apis::meta::v1::OwnerReference;

use super::discovery::ResourceType;
use super::error::status_code;
use super::{Cluster, PluginError, Target, parse_target};
use crate::api::LockOperation;

pub(super) async fn resolve(
    cluster: &Cluster,
    text: &str,
    target: &Target,
    operations: &[LockOperation],
) -> Result<OwnerReference, PluginError> {
    let usage = |why: String| PluginError::Message(format!("--owner {text}: {why}"));
    let (arg, name) = parse_target(&[text.to_owned()])
        .map_err(|_| usage("expected KIND/NAME (such as job/backup)".to_owned()))?;
    let resource = cluster.resolve(&arg).await.map_err(|e| match e {
        PluginError::Resource(why) => usage(why),
        other => other,
    })?;
    let owner = placed(resource, name, target).map_err(usage)?;
    if refuses_own_deletion(&owner, target, operations) {
        return Err(usage(
            "that is the locked object itself, and a lock refusing its deletion would never end \
             (lock UPDATE only with --operations UPDATE, or name another owner)"
                .to_owned(),
        ));
    }
    let api = cluster.api(&owner.resource.api_resource(), owner.namespace.as_deref());
    match api.get(&owner.name).await {
        Ok(object) => match object.metadata.uid.filter(|uid| !uid.is_empty()) {
            Some(uid) => Ok(OwnerReference {
                api_version: owner.resource.api_resource().api_version,
                kind: owner.resource.kind.clone(),
                name: owner.name,
                uid,
                controller: None,
                block_owner_deletion: None,
            }),
            None => Err(PluginError::Message(format!(
                "cannot own the lock by {owner}: the API server returned it without a uid"
            ))),
        },
        Err(e) if status_code(&e) == Some(404) => Err(usage(format!("{owner} does not exist"))),
        Err(e) => Err(cluster.failed(&e, format!("cannot read the owner {owner}"))),
    }
}

/// The owner, in the target's namespace or cluster-scoped (only, for a ClusterLock).
fn placed(resource: ResourceType, name: String, target: &Target) -> Result<Target, String> {
    let namespace = match (resource.namespaced, &target.namespace) {
        (false, _) => None,
        (true, Some(ns)) => Some(ns.clone()),
        (true, None) => {
            return Err(format!(
                "{} are namespaced, and the lock of a cluster-scoped object is a ClusterLock, \
                 which only a cluster-scoped object can own (Kubernetes' rule for owners)",
                resource.qualified()
            ));
        }
    };
    Ok(Target {
        resource,
        name,
        namespace,
    })
}

fn refuses_own_deletion(owner: &Target, target: &Target, operations: &[LockOperation]) -> bool {
    let same = owner.resource.group == target.resource.group
        && owner.resource.plural == target.resource.plural
        && owner.name == target.name
        && owner.namespace == target.namespace;
    same && (operations.is_empty() || operations.contains(&LockOperation::Delete))
}

pub(super) fn short(reference: &OwnerReference) -> String {
    format!("{}/{}", reference.kind, reference.name)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn target(group: &str, plural: &str, name: &str, namespace: Option<&str>) -> Target {
        Target {
            resource: ResourceType {
                group: group.into(),
                version: "v1".into(),
                preferred: true,
                plural: plural.into(),
                singular: String::new(),
                kind: String::new(),
                short_names: vec![],
                namespaced: namespace.is_some(),
            },
            name: name.into(),
            namespace: namespace.map(str::to_owned),
        }
    }

    #[test]
    fn where_an_owner_may_be() {
        let placed = |owner: Target, target: &Target| {
            placed(owner.resource, owner.name, target).map(|t| t.namespace)
        };
        let (web, cluster_web) = (
            target("apps", "deployments", "web", Some("prod")),
            target("apps", "deployments", "web", None),
        );
        let job = || target("batch", "jobs", "backup", Some("x"));
        let ns = || target("", "namespaces", "prod", None);
        assert_eq!(placed(job(), &web), Ok(Some("prod".into())));
        assert_eq!(placed(ns(), &web), Ok(None));
        assert_eq!(placed(ns(), &cluster_web), Ok(None));
        let err = placed(job(), &cluster_web).expect_err("refused");
        assert!(
            err.starts_with("jobs.batch are namespaced") && err.contains("ClusterLock"),
            "{err}"
        );

        let own = |owner: &Target, ops: &[LockOperation]| refuses_own_deletion(owner, &web, ops);
        assert!(own(&web, &[]));
        assert!(own(&web, &[LockOperation::Delete]));
        assert!(
            !own(&web, &[LockOperation::Update]),
            "UPDATE only: ends with it"
        );
        assert!(!own(&target("batch", "jobs", "web", Some("prod")), &[]));
        assert!(!own(
            &target("apps", "deployments", "api", Some("prod")),
            &[]
        ));
    }
}
