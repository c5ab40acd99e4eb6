//! Objects the garbage collector is waiting to delete: `kubectl lock` says so; `kubectl unlock`
//! prompts the collector (an owner reference to an absent owner) to do now what it would later.

use std::collections::BTreeSet;
use std::time::Duration;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::OwnerReference;
use kube::api::{DynamicObject, Patch, PatchParams};
use kube::core::GroupVersion;

use super::error::{detail, status_code};
use super::{Cluster, Target};

const FOREGROUND: &str = "foregroundDeletion";
const ABSENT_OWNER: &str = "kube-object-lock-collector-prompt";
const PROMPT_RETRIES: u32 = 20;

/// Why the collector is waiting to delete `object` (`its owner Job/x is gone`), if it is; an
/// owner whose type or existence cannot be told counts as present.
pub(super) async fn waiting(
    cluster: &Cluster,
    target: &Target,
    object: &DynamicObject,
) -> Option<String> {
    let owners = object
        .metadata
        .owner_references
        .as_deref()
        .unwrap_or_default();
    if owners.is_empty() {
        return None;
    }
    let groups: BTreeSet<String> = (owners.iter())
        .filter_map(|o| o.api_version.parse::<GroupVersion>().ok())
        .map(|gv| gv.group)
        .collect();
    let discovered = cluster.discover(Some(&groups), true).await.ok()?;
    let mut gone = None;
    for owner in owners {
        let resource = discovered
            .types
            .iter()
            .find(|t| t.api_resource().api_version == owner.api_version && t.kind == owner.kind)?;
        let namespace = resource
            .namespaced
            .then_some(target.namespace.as_deref())
            .flatten();
        let api = cluster.api(&resource.api_resource(), namespace);
        let gone_now = Some(format!("its owner {} {} is gone", owner.kind, owner.name));
        match api.get(&owner.name).await {
            Ok(found) if found.metadata.uid.as_deref() == Some(owner.uid.as_str()) => {
                let finalizers = found.metadata.finalizers.unwrap_or_default();
                if found.metadata.deletion_timestamp.is_some()
                    && finalizers.iter().any(|f| f == FOREGROUND)
                {
                    return Some(format!(
                        "its owner {} {} is being deleted in the foreground",
                        owner.kind, owner.name
                    ));
                }
                return None;
            }
            Ok(_) => gone = gone_now,
            Err(e) if status_code(&e) == Some(404) => gone = gone_now,
            Err(_) => return None,
        }
    }
    gone
}

/// Adds an owner reference to an absent owner to the object as read (uid and resourceVersion
/// preconditions); retries a conflict, and a refusal by an instance still enforcing the lock.
pub(super) async fn prompt(
    cluster: &Cluster,
    target: &Target,
    object: &DynamicObject,
) -> Result<(), String> {
    let api = cluster.api(&target.resource.api_resource(), target.namespace.as_deref());
    let uid = object.metadata.uid.clone().unwrap_or_default();
    let mut object = object.clone();
    let mut last = String::new();
    for _ in 0..PROMPT_RETRIES {
        let mut owners = object.metadata.owner_references.clone().unwrap_or_default();
        let Some(first) = owners.first().cloned() else {
            return Ok(());
        };
        owners.push(OwnerReference {
            api_version: first.api_version,
            kind: first.kind,
            name: ABSENT_OWNER.to_owned(),
            uid: absent_uid(&uid),
            ..OwnerReference::default()
        });
        let patch = serde_json::json!({"metadata": {
            "uid": uid,
            "resourceVersion": object.metadata.resource_version,
            "ownerReferences": owners,
        }});
        match api
            .patch(&target.name, &PatchParams::default(), &Patch::Merge(&patch))
            .await
        {
            Ok(_) => return Ok(()),
            // Gone already: the collector was quicker.
            Err(e) if status_code(&e) == Some(404) => return Ok(()),
            Err(e) if status_code(&e) == Some(409) => {
                last = detail(&e);
                object = match api.get(&target.name).await {
                    Ok(again) if again.metadata.uid.as_deref() == Some(uid.as_str()) => again,
                    Ok(_) => return Ok(()),
                    Err(e) if status_code(&e) == Some(404) => return Ok(()),
                    Err(e) => return Err(detail(&e)),
                };
            }
            Err(e) if status_code(&e) == Some(403) => {
                last = detail(&e);
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
            Err(e) => return Err(detail(&e)),
        }
    }
    Err(last)
}

/// A uid no object has, the same for the same object (a second prompt adds nothing).
fn absent_uid(uid: &str) -> String {
    match uid.split_once('-') {
        Some((_, rest)) => format!("00000000-{rest}"),
        None => format!("00000000-{uid}"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_absent_owner_is_not_the_object_and_is_stable() {
        let uid = "6f1c2a3b-1111-2222-3333-444455556666";
        assert_eq!(absent_uid(uid), "00000000-1111-2222-3333-444455556666");
        assert_ne!(absent_uid(uid), uid);
        assert_eq!(absent_uid(uid), absent_uid(uid));
    }
}
