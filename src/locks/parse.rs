//! Lock specs into `LockRef`s, one object at a time: the one reader of Lock specs. Invariant: a
//! spec this version cannot read fails closed on its own name, never wider than what the lock
//! policy checked (its own `resources` and `operations` when they read).

use kube::api::DynamicObject;
use serde_json::Value;

use std::sync::Arc;

use serde::Deserialize;

use super::{LockKind, LockMeta, LockRef};
use crate::api::{LockSpec, LockStatus};

/// The lock an object stands for; `None` only for an object without a name (never served by a
/// real API server). Never fails on the spec: see the module docs.
pub fn lock_ref(kind: LockKind, object: &DynamicObject) -> Option<LockRef> {
    let name = object.metadata.name.as_deref()?;
    let mut lock = match kind {
        LockKind::Lock => LockRef::lock(
            object.metadata.namespace.as_deref().unwrap_or_default(),
            name,
            LockSpec::default(),
        ),
        LockKind::ClusterLock => LockRef::cluster_lock(name, LockSpec::default()),
    };
    lock.generation = object.metadata.generation;
    lock.meta = Arc::new(LockMeta {
        uid: object.metadata.uid.clone().unwrap_or_default(),
        resource_version: object.metadata.resource_version.clone().unwrap_or_default(),
        // A status this version cannot read is taken as empty: the status writer then writes
        // its own part again.
        status: object
            .data
            .get("status")
            .and_then(|s| LockStatus::deserialize(s).ok())
            .unwrap_or_default(),
    });
    match spec(object.data.get("spec")) {
        Ok(spec) => lock.spec = spec,
        Err(problem) => {
            lock.spec = fallback(object.data.get("spec"));
            lock.problem = Some(problem);
        }
    }
    Some(lock)
}

/// The fail-closed spec of a Lock whose spec has a problem: the reason, and the `resources` and
/// `operations` that read and validate on their own (what the lock policy checked rights for);
/// everything else as in the empty spec.
fn fallback(raw: Option<&Value>) -> LockSpec {
    let field = |name: &str| raw.and_then(|spec| spec.get(name)).filter(|v| !v.is_null());
    // A spec of that one field, if it reads and validates.
    let alone = |name: &str| {
        let only = serde_json::Map::from_iter([(name.to_owned(), field(name)?.clone())]);
        let spec = LockSpec::deserialize(Value::Object(only)).ok()?;
        spec.validate().is_ok().then_some(spec)
    };
    LockSpec {
        reason: field("reason").and_then(Value::as_str).map(str::to_owned),
        resources: alone("resources").and_then(|spec| spec.resources),
        operations: alone("operations").and_then(|spec| spec.operations),
        ..LockSpec::default()
    }
}

/// The spec, or what is wrong with it.
fn spec(raw: Option<&Value>) -> Result<LockSpec, String> {
    let Some(raw) = raw.filter(|v| !v.is_null()) else {
        return Ok(LockSpec::default());
    };
    let spec: LockSpec = serde_path_to_error::deserialize(raw).map_err(|e| {
        let path = e.path().to_string();
        let path = if path == "." {
            "spec".to_owned()
        } else {
            format!("spec.{path}")
        };
        format!("{path}: {}", e.into_inner())
    })?;
    spec.validate().map_err(|e| format!("spec.{e}"))?;
    Ok(spec)
}

/// A spec from a lock file, stricter than one the API server stored: unknown fields are refused
/// (the API server would prune them; in a file they are typos), and the CRD's validation is
/// applied, the file's reader refusing the whole file on any problem.
pub fn file_spec(value: serde_json::Value) -> Result<LockSpec, String> {
    let value = match value {
        serde_json::Value::Null => return Ok(LockSpec::default()),
        v @ serde_json::Value::Object(_) => v,
        other => return Err(format!("spec must be a mapping, found {other}")),
    };
    let mut unknown = Vec::new();
    // The field that does not read is named (`spec.expiresAt: ...`), not only what is wrong.
    let mut note_unknown = |path: serde_ignored::Path<'_>| {
        // Option layers show as `?` in the path; they mean nothing to the author of the file.
        let path = path.to_string();
        unknown.push(
            path.split('.')
                .filter(|part| *part != "?")
                .collect::<Vec<_>>()
                .join("."),
        );
    };
    let spec: LockSpec = serde_path_to_error::deserialize(serde_ignored::Deserializer::new(
        value,
        &mut note_unknown,
    ))
    .map_err(|e| {
        let path = e.path().to_string();
        let error = e.into_inner();
        if path == "." {
            format!("spec: {error}")
        } else {
            format!("spec.{path}: {error}")
        }
    })?;
    if let Some(field) = unknown.first() {
        return Err(format!("spec.{field} is not a field of a lock spec"));
    }
    spec.validate().map_err(|e| format!("spec.{e}"))?;
    Ok(spec)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::api::{LockMode, LockOperation, ResourceRule};
    use serde_json::json;

    fn object(namespace: Option<&str>, name: &str, spec: Value) -> DynamicObject {
        let mut metadata = json!({"name": name, "generation": 3});
        if let Some(ns) = namespace {
            metadata["namespace"] = json!(ns);
        }
        serde_json::from_value(json!({
            "apiVersion": "objectlock.dev/v1alpha1",
            "kind": "Lock",
            "metadata": metadata,
            "spec": spec,
        }))
        .expect("a dynamic object")
    }

    #[test]
    fn a_valid_spec_is_read_with_its_generation() {
        let obj = object(
            Some("prod"),
            "web",
            json!({"operations": ["DELETE"], "mode": "Warn"}),
        );
        let lock = lock_ref(LockKind::Lock, &obj).expect("named");
        assert_eq!(lock.namespace.as_deref(), Some("prod"));
        assert_eq!(lock.spec.operations(), [LockOperation::Delete]);
        assert_eq!(lock.spec.mode, Some(LockMode::Warn));
        assert_eq!(lock.generation, Some(3));
        assert_eq!(lock.problem, None);
    }

    #[test]
    fn an_unreadable_spec_fails_closed_within_what_its_creator_could_lock() {
        let cm = json!([{"apiGroups": [""], "resources": ["configmaps"]}]);
        let del = json!(["DELETE"]);
        // (spec, the field named, whether `resources` (configmaps) and `operations` (DELETE)
        // are kept)
        for (mut spec, field, kept_resources, kept_operations) in [
            (
                json!({"mode": "Audit", "operations": del}),
                "spec.mode",
                false,
                true,
            ),
            (
                json!({"operations": "DELETE", "resources": cm}),
                "spec.operations",
                true,
                false,
            ),
            (json!({"operations": []}), "spec.operations", false, false),
            (
                json!({"operations": ["DELETE", "DELETE"], "resources": cm}),
                "spec.operations",
                true,
                false,
            ),
            (
                json!({"resources": [{"apiGroups": [], "resources": ["x"]}], "operations": del}),
                "spec.resources",
                false,
                true,
            ),
            (
                json!({"resources": "configmaps"}),
                "spec.resources",
                false,
                false,
            ),
            // A selector the API server accepts but kube's Selector refuses: the Lock's own
            // name, of the resources it names only.
            (
                json!({"selector": {"matchExpressions": [{"key": "app", "operator": "In"}]}, "resources": cm, "operations": del}),
                "spec.selector",
                true,
                true,
            ),
            (
                json!({"selector": {"matchLabels": {}}, "resources": cm}),
                "spec.selector",
                true,
                false,
            ),
            // Times the API server's date-time check lets through.
            (
                json!({"expiresAt": "2030-01-01T00:00:00x1Z", "resources": cm, "mode": "Warn"}),
                "spec.expiresAt",
                true,
                false,
            ),
            (
                json!({"expiresAt": "2030-01-01T00:00:00+99:00", "operations": del, "exempt": {"users": ["alice"]}}),
                "spec.expiresAt",
                false,
                true,
            ),
            (
                json!({"expiresAt": "tomorrow"}),
                "spec.expiresAt",
                false,
                false,
            ),
            // A fields list that does not read locks the whole object.
            (
                json!({"fields": ["spec..template"]}),
                "spec.fields",
                false,
                false,
            ),
            (
                json!({"fields": ["spec"], "exceptFields": ["status"], "resources": cm}),
                "spec.fields",
                true,
                false,
            ),
        ] {
            spec["reason"] = json!("freeze");
            let lock = lock_ref(LockKind::Lock, &object(Some("prod"), "web", spec.clone()))
                .expect("named");
            let problem = lock.problem.clone().unwrap_or_default();
            assert!(problem.starts_with(field), "{spec}: {problem}");
            // Fail closed, no wider than what the policy checked: the resources and operations
            // that read on their own (else every resource, UPDATE and DELETE), Enforce, no
            // selector, expiry or exemption, keeping the reason for the message.
            let resources = kept_resources.then(|| {
                vec![ResourceRule {
                    api_groups: vec![String::new()],
                    resources: vec!["configmaps".into()],
                }]
            });
            let operations = kept_operations.then(|| vec![LockOperation::Delete]);
            assert_eq!(
                lock.spec,
                LockSpec {
                    reason: Some("freeze".into()),
                    resources,
                    operations,
                    ..LockSpec::default()
                },
                "{spec}"
            );
        }
    }

    #[test]
    fn a_missing_or_null_spec_is_the_empty_spec() {
        let mut obj = object(None, "kube-system", json!(null));
        let lock = lock_ref(LockKind::ClusterLock, &obj).expect("named");
        assert_eq!(
            (lock.spec.clone(), lock.problem.clone()),
            (LockSpec::default(), None)
        );
        obj.data = json!({});
        let lock = lock_ref(LockKind::ClusterLock, &obj).expect("named");
        assert_eq!(lock.namespace, None);
        assert_eq!(lock.problem, None);
    }
}
