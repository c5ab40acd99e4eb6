//! Objects the garbage collector is waiting to delete: `kubectl lock` says so, and `kubectl
//! unlock` prompts the collector with an owner reference to an owner that does not exist.
//! Invariant: the prompt only makes the collector do now what its next retry would have done.

use std::collections::BTreeSet;
use std::time::Duration;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::OwnerReference;
use kube::api::{DynamicObject, Patch, PatchParams};
use kube::core::GroupVersion;

use super::error::{detail, status_code};
use super::{Cluster, Target};

/// The finalizer of an owner deleted in the foreground, until its blocking dependents are gone.
const FOREGROUND: &str = "foregroundDeletion";
/// The name of the owner the prompt refers to. The collector tells owners apart by uid, and the
/// uid of the prompt's owner is no object's.
const ABSENT_OWNER: &str = "kube-object-lock-collector-prompt";
/// Tries while a webhook instance that has not yet seen the unlock refuses the prompt.
const PROMPT_RETRIES: u32 = 20;

/// Why the collector is waiting to delete `object` (`its owner Job/x is gone`), if it is, by
/// looking up its owners. An owner whose type or existence cannot be told counts as present:
/// this only ever adds a remark.
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
                // A live owner: the collector has nothing to do with this object.
                return None;
            }
            Ok(_) => gone = gone_now,
            Err(e) if status_code(&e) == Some(404) => gone = gone_now,
            Err(_) => return None,
        }
    }
    gone
}

/// Prompts the collector to look at `target` again: adds an owner reference to an owner that
/// does not exist, to the object as read (its uid and resourceVersion are preconditions; a
/// conflict reads it again). A refusal by a webhook instance that still enforces the lock just
/// deleted is retried for a moment.
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

/// A uid no object has: the object's own uid with its first group rewritten, so the same object
/// always gets the same prompt (a second prompt adds nothing the collector has not seen).
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
