//! A CRD's deletion deletes its objects without admission, so it is refused while a live Enforce
//! lock covering DELETE names its resource (its group exactly; a lock on every group does not
//! count, see docs/design/admission.md).

use std::sync::Arc;

use super::{Outcome, Verdict, by_policy, names};
use crate::admission::request::{AdmissionRequest, Operation};
use crate::api::{self, LockMode, LockOperation, LockSpec};
use crate::locks::{LockRef, LockSet};
use crate::settings::OnLookupError;
use k8s_openapi::jiff::Timestamp;

pub const CRD_GROUP: &str = "apiextensions.k8s.io";
pub const CRD_RESOURCE: &str = "customresourcedefinitions";
/// How many Locks a refusal names.
const NAMED: usize = 5;

/// For the DELETE of a CustomResourceDefinition, the `(group, plural)` of the objects it
/// deletes, read from its name (`plural.group`, as the API server requires); `None` otherwise.
pub fn deleted_resource<'a>(req: &'a AdmissionRequest<'_>) -> Option<(&'a str, &'a str)> {
    let crd = req.operation == Operation::Delete
        && req.resource.group == CRD_GROUP
        && req.resource.resource == CRD_RESOURCE
        && req.subresource().is_none();
    let (plural, group) = req.object_name().filter(|_| crd)?.split_once('.')?;
    Some((group, plural))
}

/// Whether a lock's `resources` name `plural` (or every resource) of `group`, by name.
pub fn names_resource_of(spec: &LockSpec, group: &str, plural: &str) -> bool {
    (spec.resources.iter().flatten()).any(|rule| {
        rule.api_groups.iter().any(|g| g == group)
            && rule.resources.iter().any(|r| r == plural || r == "*")
    })
}

/// The verdict on a CRD DELETE, given `verdict` (that of the CRD itself: a ClusterLock of its
/// name) and every lock set, `None` when they are not at hand (then `policy` decides).
pub fn crd_deletion(
    req: &AdmissionRequest,
    verdict: Verdict,
    sets: Option<&[Arc<LockSet>]>,
    policy: OnLookupError,
    now: Timestamp,
) -> Verdict {
    let Some((group, plural)) = deleted_resource(req) else {
        return verdict;
    };
    if !verdict.allowed() {
        return verdict;
    }
    let crd = req.object_name().unwrap_or_default();
    let Some(sets) = sets else {
        let what = format!("{CRD_RESOURCE}.{CRD_GROUP} \"{}\"", api::escape(crd));
        return by_policy(
            req,
            policy,
            format!(
                "deleting {what} deletes its objects, which Locks in any namespace may lock, but the locks of every namespace are not at hand yet; the deletion is refused until they are (on_lookup_error=deny)"
            ),
            format!(
                "the locks on the objects of {what} could not be read; allowed (on_lookup_error=allow)"
            ),
            "locks of every namespace not at hand".to_owned(),
        );
    };
    let mut enforcing: Vec<&LockRef> = Vec::new();
    let mut warning: Vec<&LockRef> = Vec::new();
    for lock in sets.iter().flat_map(|set| set.iter()) {
        let spec = &lock.spec;
        if !spec.operations().contains(&LockOperation::Delete)
            || spec.is_expired(now)
            || !names_resource_of(spec, group, plural)
        {
            continue;
        }
        match spec.mode.unwrap_or_default() {
            LockMode::Enforce => enforcing.push(lock),
            LockMode::Warn => warning.push(lock),
        }
    }
    enforcing.sort_by_key(|l| l.key());
    warning.sort_by_key(|l| l.key());
    if enforcing.is_empty() {
        return match warning.is_empty() {
            true => verdict,
            false => verdict
                .warn(format!(
                    "deleting {CRD_RESOURCE}.{CRD_GROUP} \"{}\" deletes objects Warn-mode locks name: {}",
                    api::escape(crd),
                    names(&warning)
                ))
                .annotate("crd-warn-locks", names(&warning)),
        };
    }
    let listed = &enforcing[..enforcing.len().min(NAMED)];
    let more = match enforcing.len() - listed.len() {
        0 => String::new(),
        n => format!(" and {n} more"),
    };
    let count = enforcing.len();
    let (plural_locks, verb) = match count {
        1 => ("lock", "protects"),
        _ => ("locks", "protect"),
    };
    let unlock = super::join(listed.iter().map(|l| l.unlock_command()), "; ");
    let message = format!(
        "deleting {CRD_RESOURCE}.{CRD_GROUP} \"{crd}\" would delete every {plural}.{group} object, with no admission for them, and {count} {plural_locks} {verb} some ({}{more}) (to unlock: {unlock})",
        names(listed),
        crd = api::escape(crd),
    );
    let mut refused = Verdict::deny(403, "Forbidden", message);
    refused.warnings = verdict.warnings;
    refused.locks = listed.iter().map(|l| l.key()).collect();
    debug_assert_eq!(refused.outcome, Outcome::Denied);
    refused.annotate("crd-locks", names(listed))
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn delete(resource: serde_json::Value, name: &str) -> AdmissionRequest<'static> {
        AdmissionRequest::from_json(json!({
            "uid": "u", "operation": "DELETE", "name": name, "resource": resource,
            "userInfo": {"username": "admin", "groups": []},
            "object": null, "oldObject": {"metadata": {"name": name}},
        }))
        .expect("request")
    }

    fn crd_delete(name: &str) -> AdmissionRequest<'static> {
        delete(
            json!({"group": CRD_GROUP, "version": "v1", "resource": CRD_RESOURCE}),
            name,
        )
    }

    fn lock(ns: Option<&str>, name: &str, spec: serde_json::Value) -> LockRef {
        let spec = serde_json::from_value(spec).expect("spec");
        match ns {
            Some(ns) => LockRef::lock(ns, name, spec),
            None => LockRef::cluster_lock(name, spec),
        }
    }

    fn sets(locks: Vec<LockRef>) -> Vec<Arc<LockSet>> {
        locks
            .into_iter()
            .map(|l| Arc::new(LockSet::from_iter([l])))
            .collect()
    }

    fn decide(req: &AdmissionRequest, locks: Vec<LockRef>) -> Verdict {
        let now = "2026-11-22T12:00:00Z".parse().expect("time");
        let sets = sets(locks);
        crd_deletion(req, Verdict::allow(), Some(&sets), OnLookupError::Deny, now)
    }

    #[test]
    fn a_crd_deletion_is_refused_while_a_lock_names_its_resource() {
        let widgets = |resources: &str| json!({"resources": [{"apiGroups": ["example.com"], "resources": [resources]}]});
        let req = crd_delete("widgets.example.com");
        assert_eq!(deleted_resource(&req), Some(("example.com", "widgets")));
        let verdict = decide(&req, vec![lock(Some("team"), "db", widgets("widgets"))]);
        assert_eq!(
            verdict.refusal.expect("refused").message,
            "deleting customresourcedefinitions.apiextensions.k8s.io \"widgets.example.com\" would delete every widgets.example.com object, with no admission for them, and 1 lock protects some (Lock team/db) (to unlock: kubectl delete lock db -n team)"
        );
        for (why, spec, refused) in [
            ("every resource of the group", widgets("*"), true),
            ("a ClusterLock", widgets("widgets"), true),
            ("another resource of the group", widgets("gadgets"), false),
            ("a subresource only", widgets("widgets/scale"), false),
            ("no resources: every group", json!({}), false),
            (
                "every group",
                json!({"resources": [{"apiGroups": ["*"], "resources": ["*"]}]}),
                false,
            ),
            (
                "UPDATE only",
                json!({"operations": ["UPDATE"], "resources": [{"apiGroups": ["example.com"], "resources": ["widgets"]}]}),
                false,
            ),
            (
                "expired",
                json!({"expiresAt": "2020-01-01T00:00:00Z", "resources": [{"apiGroups": ["example.com"], "resources": ["widgets"]}]}),
                false,
            ),
            (
                "Warn",
                json!({"mode": "Warn", "resources": [{"apiGroups": ["example.com"], "resources": ["widgets"]}]}),
                false,
            ),
            // Nobody deletes the objects through the API: an exemption does not let them go.
            (
                "exempting the user",
                json!({"exempt": {"users": ["admin"]}, "resources": [{"apiGroups": ["example.com"], "resources": ["widgets"]}]}),
                true,
            ),
        ] {
            let ns = (why != "a ClusterLock").then_some("team");
            let verdict = decide(&req, vec![lock(ns, "db", spec)]);
            assert_eq!(!verdict.allowed(), refused, "{why}: {verdict:?}");
        }
        let warned = decide(
            &req,
            vec![lock(
                Some("team"),
                "db",
                json!({"mode": "Warn", "resources": [{"apiGroups": ["example.com"], "resources": ["widgets"]}]}),
            )],
        );
        assert_eq!(warned.outcome, Outcome::Warned);
        // Other requests: the CRD of another group, a CRD's update, another resource's DELETE.
        let locks = || vec![lock(Some("team"), "db", widgets("*"))];
        assert!(decide(&crd_delete("widgets.other.com"), locks()).allowed());
        let configmap = delete(
            json!({"group": "", "version": "v1", "resource": "configmaps"}),
            "widgets.example.com",
        );
        assert_eq!(deleted_resource(&configmap), None);
        assert!(decide(&configmap, locks()).allowed());
        // The locks not at hand: the policy decides.
        let now = "2026-11-22T12:00:00Z".parse().expect("time");
        let verdict = crd_deletion(&req, Verdict::allow(), None, OnLookupError::Deny, now);
        assert_eq!(verdict.refusal.expect("refused").code, 503);
        let verdict = crd_deletion(&req, Verdict::allow(), None, OnLookupError::Allow, now);
        assert!(verdict.allowed());
    }

    #[test]
    fn a_refusal_names_at_most_five_locks() {
        let spec =
            || json!({"resources": [{"apiGroups": ["example.com"], "resources": ["widgets"]}]});
        let locks = (0..7)
            .map(|i| lock(Some(&format!("ns-{i}")), "db", spec()))
            .collect();
        let message = decide(&crd_delete("widgets.example.com"), locks)
            .refusal
            .expect("refused")
            .message;
        assert!(message.contains("7 locks protect some (Lock ns-0/db, Lock ns-1/db, Lock ns-2/db, Lock ns-3/db, Lock ns-4/db and 2 more)"), "{message}");
    }
}
