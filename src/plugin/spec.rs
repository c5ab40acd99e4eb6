//! A lock's spec, the crate's [`LockSpec`]: written by `kubectl lock`, read and described by
//! `list` and `unlock`, which decide what it covers with the webhook's own function.

use k8s_openapi::apimachinery::pkg::apis::meta::v1::{LabelSelector, Time};
use k8s_openapi::jiff::Timestamp;
use kube::api::DynamicObject;
use kube::core::Selector;

use super::cli::LockArgs;
use super::discovery::qualified;
use crate::api::{
    Exemptions, Holder, LockKey, LockKind, LockMode, LockOperation, LockSpec, ResourceRule,
};

/// The spec of a new lock on `plural` in `group` (`operations` sorted, without repeats).
pub(super) fn new(
    args: &LockArgs,
    (group, plural): (&str, &str),
    operations: &[LockOperation],
    expires_at: Option<Timestamp>,
    holder: Option<Holder>,
) -> LockSpec {
    let some = |list: &[String]| (!list.is_empty()).then(|| list.to_vec());
    LockSpec {
        reason: args.reason.clone(),
        operations: (!operations.is_empty()).then(|| operations.to_vec()),
        resources: Some(vec![ResourceRule {
            api_groups: vec![group.to_owned()],
            resources: vec![plural.to_owned()],
        }]),
        selector: None,
        exempt: some(&args.exempt_users).map(|users| Exemptions {
            users,
            ..Exemptions::default()
        }),
        expires_at: expires_at.map(Time),
        mode: args.warn.then_some(LockMode::Warn),
        holder,
        fields: some(&args.fields),
        except_fields: some(&args.except_fields),
    }
}

/// `UPDATE, DELETE; warn only; exempt alice; until 2026-11-22T05:00:00Z`.
pub(super) fn summary(spec: &LockSpec) -> String {
    let operations = spec.operations().iter().map(|o| o.as_str());
    let mut parts = vec![operations.collect::<Vec<_>>().join(", ")];
    if let Some(fields) = &spec.fields {
        parts.push(format!("fields {}", fields.join(", ")));
    }
    if let Some(except) = &spec.except_fields {
        parts.push(format!("all but {}", except.join(", ")));
    }
    if spec.mode == Some(LockMode::Warn) {
        parts.push("warn only".into());
    }
    if let Some(exempt) = &spec.exempt {
        parts.push(format!("exempt {}", exempt.users.join(", ")));
    }
    if let Some(at) = &spec.expires_at {
        parts.push(format!("until {}", at.0));
    }
    if let Some(holder) = &spec.holder {
        parts.push(format!("held by {holder}"));
    }
    parts.join("; ")
}

/// A holder in one table cell: `alice`, `group:ops`, `sa:backup/snapshotter`.
pub(super) fn holder_cell(holder: &Holder) -> String {
    match (&holder.user, &holder.group, &holder.service_account) {
        (Some(user), _, _) => user.clone(),
        (_, Some(group), _) => format!("group:{group}"),
        (_, _, Some(sa)) => format!("sa:{sa}"),
        _ => "-".to_owned(),
    }
}

/// The spec as the webhook reads it: for one it cannot read, what fails closed, and a note why.
pub(super) fn read(object: &DynamicObject) -> (LockSpec, Option<String>) {
    let kind = LockKind::for_namespace(object.metadata.namespace.as_deref().unwrap_or(""));
    let Some(lock) = crate::locks::parse::lock_ref(kind, object) else {
        return (LockSpec::default(), None);
    };
    let key = LockKey {
        namespace: lock.namespace,
        name: lock.name,
    };
    let note =
        (lock.problem).map(|p| format!("{key}: unreadable spec, fails closed until fixed: {p}"));
    (lock.spec, note)
}

/// The `(group, resource)` pairs of `spec.resources`, if any.
fn pairs(spec: &LockSpec) -> Option<Vec<(&str, &str)>> {
    let rules = spec.resources.as_ref()?;
    Some(
        rules
            .iter()
            .flat_map(|rule| {
                rule.api_groups
                    .iter()
                    .flat_map(move |g| rule.resources.iter().map(move |r| (g.as_str(), r.as_str())))
            })
            .collect(),
    )
}

/// The COVERS column: `deployments.apps`, `any resource named web`, `selector app=web`.
pub(super) fn describe_covers(name: &str, spec: &LockSpec) -> String {
    let resources = pairs(spec).map(|pairs| match pairs.as_slice() {
        [] => "no resource".to_owned(),
        pairs => pairs
            .iter()
            .map(|(g, r)| qualified(g, r))
            .collect::<Vec<_>>()
            .join(","),
    });
    let selector = (spec.selector.as_ref()).map(|s| format!("selector {}", describe_selector(s)));
    match (resources, selector) {
        (None, None) => format!("any resource named {name}"),
        (r, s) => [r, s].into_iter().flatten().collect::<Vec<_>>().join(" "),
    }
}

/// The OPERATIONS column: `UPDATE[spec.template],DELETE`, `UPDATE[all-but:metadata.labels]`.
pub(super) fn operations(spec: &LockSpec) -> String {
    let frozen = match (&spec.fields, &spec.except_fields) {
        (Some(fields), _) => format!("[{}]", fields.join(",")),
        (None, Some(except)) => format!("[all-but:{}]", except.join(",")),
        (None, None) => String::new(),
    };
    (spec.operations().iter())
        .map(|op| match op {
            LockOperation::Update => format!("UPDATE{frozen}"),
            other => other.as_str().to_owned(),
        })
        .collect::<Vec<_>>()
        .join(",")
}

/// The one resource whose object of the lock's name can be looked up (no wildcard, no selector).
pub(super) fn single_resource(spec: &LockSpec) -> Option<(String, String)> {
    if spec.selector.is_some() {
        return None;
    }
    match pairs(spec)?.as_slice() {
        [(group, plural)] if *group != "*" && *plural != "*" && !plural.contains('/') => {
            Some(((*group).to_owned(), (*plural).to_owned()))
        }
        _ => None,
    }
}

/// A LabelSelector as kubectl writes one: `app=web,tier in (a,b),!canary`.
fn describe_selector(selector: &LabelSelector) -> String {
    match Selector::try_from(selector.clone()) {
        Ok(selector) if selector.selects_all() => "(everything)".to_owned(),
        Ok(selector) => selector.to_string(),
        Err(e) => e.to_string(),
    }
}

/// The EXPIRES column: `1h59m`, `expired`, or `never`.
pub(super) fn time_left(spec: &LockSpec, now: Timestamp) -> String {
    let Some(at) = &spec.expires_at else {
        return "never".to_owned();
    };
    let left = at.0.duration_since(now).as_secs();
    if left <= 0 {
        return "expired".to_owned();
    }
    let (days, hours, minutes) = (left / 86_400, left % 86_400 / 3600, left % 3600 / 60);
    match (days, hours, minutes) {
        (0, 0, 0) => format!("{left}s"),
        (0, 0, m) => format!("{m}m"),
        (0, h, 0) => format!("{h}h"),
        (0, h, m) => format!("{h}h{m}m"),
        (d, 0, _) => format!("{d}d"),
        (d, h, _) => format!("{d}d{h}h"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde::Deserialize;
    use serde_json::{Value, json};

    fn spec(value: Value) -> LockSpec {
        LockSpec::deserialize(value).expect("a lock spec")
    }

    #[test]
    fn operations_show_what_an_update_lock_freezes() {
        for (value, shown) in [
            (json!({}), "UPDATE,DELETE"),
            (
                json!({"fields": ["spec.template"]}),
                "UPDATE[spec.template],DELETE",
            ),
            (
                json!({"exceptFields": ["metadata.annotations", "spec.replicas"], "operations": ["UPDATE"]}),
                "UPDATE[all-but:metadata.annotations,spec.replicas]",
            ),
            (
                json!({"fields": ["spec"], "operations": ["DELETE"]}),
                "DELETE",
            ),
        ] {
            assert_eq!(operations(&spec(value.clone())), shown, "{value}");
        }
    }

    #[test]
    fn a_new_spec_has_only_what_was_asked() {
        let args = |flags: &[&str]| match crate::plugin::cli::parse(
            ["kubectl-lock", "deploy/web"].iter().chain(flags),
        ) {
            Ok(crate::plugin::cli::Invocation::Lock(cli)) => cli.lock,
            other => panic!("{other:?}"),
        };
        let at: Timestamp = "2026-11-22T05:00:00Z".parse().expect("time");
        let flags = [
            "--reason",
            "release freeze",
            "--exempt-user",
            "alice",
            "--warn",
            "--fields",
            "spec.template",
        ];
        let holder = Holder::for_user("system:serviceaccount:backup:snapshotter");
        let written = new(
            &args(&flags),
            ("apps", "deployments"),
            &[LockOperation::Delete],
            Some(at),
            Some(holder),
        );
        assert_eq!(written.validate(), Ok(()));
        assert_eq!(
            serde_json::to_value(&written).expect("json"),
            json!({
                "resources": [{ "apiGroups": ["apps"], "resources": ["deployments"] }],
                "reason": "release freeze",
                "operations": ["DELETE"],
                "exempt": { "users": ["alice"] },
                "expiresAt": "2026-11-22T05:00:00Z",
                "mode": "Warn",
                "holder": { "serviceAccount": "backup/snapshotter" },
                "fields": ["spec.template"],
            })
        );
        assert_eq!(
            summary(&written),
            "DELETE; fields spec.template; warn only; exempt alice; until 2026-11-22T05:00:00Z; held by service account \"backup/snapshotter\""
        );
        let bare = new(&args(&[]), ("", "configmaps"), &[], None, None);
        assert_eq!(
            serde_json::to_value(&bare).expect("json"),
            json!({ "resources": [{ "apiGroups": [""], "resources": ["configmaps"] }] })
        );
        assert_eq!(summary(&bare), "UPDATE, DELETE");
    }

    #[test]
    fn what_a_spec_covers() {
        let selector = json!({ "matchLabels": { "app": "web" },
            "matchExpressions": [{ "key": "tier", "operator": "In", "values": ["a", "b"] },
                                 { "key": "canary", "operator": "DoesNotExist" }] });
        let rule = |groups: Value, resources: Value| json!({ "resources": [{ "apiGroups": groups, "resources": resources }] });
        for (value, covers, single) in [
            (
                rule(json!(["apps"]), json!(["deployments"])),
                "deployments.apps",
                Some(("apps", "deployments")),
            ),
            (json!({}), "any resource named web", None),
            (rule(json!(["*"]), json!(["*"])), "*.*", None),
            (
                json!({ "resources": [{ "apiGroups": ["", "apps"], "resources": ["configmaps"] }],
                        "selector": selector }),
                "configmaps,configmaps.apps selector app=web,tier in (a,b),!canary",
                None,
            ),
            (
                json!({ "selector": { "matchLabels": { "app": "web" } } }),
                "selector app=web",
                None,
            ),
            // A rule with an empty list matches nothing in the webhook: no resource here.
            (rule(json!([]), json!(["configmaps"])), "no resource", None),
            (rule(json!([""]), json!([])), "no resource", None),
        ] {
            let spec = spec(value.clone());
            assert_eq!(describe_covers("web", &spec), covers, "{value}");
            let single = single.map(|(g, r)| (g.to_owned(), r.to_owned()));
            assert_eq!(single_resource(&spec), single, "{value}");
        }
    }

    /// `read` of a Lock in `prod` with `spec`.
    fn read_lock(spec: Value) -> (LockSpec, Option<String>) {
        let object = json!({"apiVersion": crate::api::API_VERSION, "kind": "Lock",
            "metadata": {"name": "web", "namespace": "prod"}, "spec": spec});
        read(&serde_json::from_value(object).expect("an object"))
    }

    #[test]
    fn unreadable_specs_read_as_what_fails_closed() {
        assert_eq!(read_lock(Value::Null), (LockSpec::default(), None));
        let configmaps = json!([{"apiGroups": [""], "resources": ["configmaps"]}]);
        let (kept, problem) = read_lock(json!({"mode": "Audit", "resources": configmaps,
                                              "operations": ["DELETE"]}));
        let note =
            "Lock prod/web: unreadable spec, fails closed until fixed: spec.mode: unknown variant";
        assert!(
            problem.as_deref().is_some_and(|p| p.starts_with(note)),
            "{problem:?}"
        );
        assert_eq!(describe_covers("web", &kept), "configmaps");
        assert_eq!(operations(&kept), "DELETE");
        for unreadable in [json!({"expiresAt": "soon"}), json!("text")] {
            let (kept, problem) = read_lock(unreadable);
            assert!(problem.is_some());
            assert_eq!(
                kept,
                LockSpec::default(),
                "every resource, UPDATE and DELETE"
            );
        }
    }

    #[test]
    fn time_left_is_short() {
        let now: Timestamp = "2026-01-01T00:00:00Z".parse().expect("time");
        let left = |at: &str| time_left(&spec(json!({ "expiresAt": at })), now);
        assert_eq!(time_left(&spec(json!({})), now), "never");
        assert_eq!(left("2025-12-31T23:59:59Z"), "expired");
        assert_eq!(left("2026-01-01T00:00:00Z"), "expired");
        assert_eq!(left("2026-01-01T00:00:42Z"), "42s");
        assert_eq!(left("2026-01-01T00:30:59Z"), "30m");
        assert_eq!(left("2026-01-01T01:59:59Z"), "1h59m");
        assert_eq!(left("2026-01-01T02:00:00Z"), "2h");
        assert_eq!(left("2026-01-03T04:05:00Z"), "2d4h");
        assert_eq!(left("2026-01-08T00:00:00Z"), "7d");
    }
}
