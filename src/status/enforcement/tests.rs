use std::sync::Arc;

use super::*;

fn now() -> Timestamp {
    "2026-11-22T12:00:00Z".parse().expect("timestamp")
}

/// The lock `web` with `spec`, read by the index's own parser (an unreadable spec included).
fn lock(namespace: Option<&str>, spec: serde_json::Value) -> LockRef {
    let kind = match namespace {
        Some(_) => crate::api::LockKind::Lock,
        None => crate::api::LockKind::ClusterLock,
    };
    let object = serde_json::json!({
        "apiVersion": crate::api::API_VERSION, "kind": kind.as_str(),
        "metadata": {"name": "web", "namespace": namespace, "generation": 3, "uid": "uid-1",
                     "resourceVersion": "10"},
        "spec": spec,
    });
    let object = serde_json::from_value(object).expect("an object");
    crate::locks::parse::lock_ref(kind, &object).expect("named")
}

fn enforcer(instance: &str, generation: i64, since: &str) -> Enforcer {
    Enforcer {
        instance: instance.to_owned(),
        observed_generation: generation,
        since: Time(since.parse().expect("time")),
    }
}

#[test]
fn an_enforced_lock_gets_this_instances_entry_and_the_count() {
    let mut l = lock(Some("prod"), serde_json::json!({}));
    Arc::make_mut(&mut l.meta).status.enforced_by =
        vec![enforcer("cp-2", 3, "2026-11-22T10:00:00Z")];
    let want = desired(&l, true, &Coverage::Sent, "cp-1", now());
    assert_eq!(
        want.entry,
        Some(enforcer("cp-1", 3, "2026-11-22T12:00:00Z"))
    );
    assert_eq!(want.count, 2, "the other instance's entry and ours");
    assert_eq!(want.conditions.len(), 1);
    let condition = &want.conditions[0];
    assert_eq!(
        (
            condition.type_.as_str(),
            condition.status.as_str(),
            condition.reason.as_str()
        ),
        ("Enforced", "True", "Enforcing")
    );
    assert_eq!(condition.observed_generation, Some(3));
}

#[test]
fn since_is_kept_from_this_instances_own_entry() {
    let mut l = lock(Some("prod"), serde_json::json!({}));
    l.generation = Some(4);
    Arc::make_mut(&mut l.meta).status.enforced_by =
        vec![enforcer("cp-1", 3, "2026-11-22T09:00:00Z")];
    let want = desired(&l, true, &Coverage::Sent, "cp-1", now());
    assert_eq!(
        want.entry,
        Some(enforcer("cp-1", 4, "2026-11-22T09:00:00Z"))
    );
    assert_eq!(want.count, 1);
    assert!(needs_write(&l, &want, "cp-1", None), "generation 3 -> 4");
}

#[test]
fn locks_that_are_not_enforced_say_why() {
    let cases = [
        (
            lock(Some("prod"), serde_json::json!({"mode": "Warn"})),
            "WarnMode",
        ),
        (
            lock(
                Some("prod"),
                serde_json::json!({"expiresAt": "2026-11-22T11:00:00Z"}),
            ),
            "Expired",
        ),
        (
            lock(Some("kube-system"), serde_json::json!({})),
            "NotSentToWebhook",
        ),
        (
            lock(Some("kube-node-lease"), serde_json::json!({"mode": "Warn"})),
            "NotSentToWebhook",
        ),
    ];
    for (l, reason) in cases {
        let want = desired(&l, true, &Coverage::Sent, "cp-1", now());
        assert_eq!(want.entry, None, "{reason}");
        assert_eq!(want.count, 0, "{reason}");
        assert_eq!(want.conditions[0].status, "False", "{reason}");
        assert_eq!(want.conditions[0].reason, reason);
        assert!(!want.conditions[0].message.is_empty());
    }
    // A ClusterLock on the Namespace kube-system: that Namespace is not sent either.
    let mut namespace = lock(
        None,
        serde_json::json!({"resources": [{"apiGroups": [""], "resources": ["namespaces"]}]}),
    );
    namespace.name = "kube-system".into();
    assert_eq!(
        desired(&namespace, true, &Coverage::Sent, "cp-1", now()).conditions[0].reason,
        "NotSentToWebhook"
    );
    namespace.spec = LockSpec::default();
    assert!(
        desired(&namespace, true, &Coverage::Sent, "cp-1", now())
            .entry
            .is_some(),
        "may cover other kinds"
    );
    // Not yet expired: enforced.
    let later = lock(
        None,
        serde_json::json!({"expiresAt": "2026-11-22T13:00:00Z"}),
    );
    assert!(
        desired(&later, true, &Coverage::Sent, "cp-1", now())
            .entry
            .is_some()
    );
    let unparsed = lock(Some("prod"), serde_json::json!({"mode": "Audit"}));
    let want = desired(&unparsed, true, &Coverage::Sent, "cp-1", now());
    assert!(want.entry.is_some(), "an unparseable lock locks its name");
    assert_eq!(want.conditions[0].reason, "Unparseable");
}

#[test]
fn an_unreadable_locks_status_names_what_it_still_refuses() {
    let message = |spec: serde_json::Value| {
        let l = lock(Some("prod"), spec);
        let want = desired(&l, true, &Coverage::Sent, "cp-1", now());
        assert!(want.entry.is_some(), "fails closed");
        let condition = &want.conditions[0];
        assert_eq!(
            (condition.status.as_str(), condition.reason.as_str()),
            ("True", "Unparseable")
        );
        condition.message.clone()
    };
    // The operations read alone: the status says DELETE only, as the webhook refuses.
    let delete_only = message(serde_json::json!({"operations": ["DELETE"], "mode": "Audit"}));
    assert!(
        delete_only.starts_with("the spec does not parse (spec.mode: unknown variant `Audit`")
            && delete_only.contains(": DELETE of the locked object is refused;"),
        "{delete_only}"
    );
    // Unreadable operations: UPDATE and DELETE, the default.
    let default = message(serde_json::json!({"operations": ["SHUTDOWN"]}));
    assert!(
        default.contains(": UPDATE and DELETE of the locked object are refused;"),
        "{default}"
    );
    // A CREATE the configuration never sends is said so, as for a readable lock.
    let l = lock(
        Some("prod"),
        serde_json::json!({"operations": ["CREATE", "DELETE"], "mode": "Audit"}),
    );
    let never = Coverage::NeverSent(vec![LockOperation::Create]);
    let want = desired(&l, true, &never, "cp-1", now());
    assert!(
        want.conditions[0]
            .message
            .contains(": DELETE of the locked object is refused (CREATE never reaches the webhook"),
        "{}",
        want.conditions[0].message
    );
    // A CREATE-only one whose CREATE is never sent refuses nothing: not enforced.
    let l = lock(
        Some("prod"),
        serde_json::json!({"operations": ["CREATE"], "mode": "Audit"}),
    );
    let want = desired(&l, true, &never, "cp-1", now());
    assert_eq!(want.entry, None);
    assert_eq!(want.conditions[0].reason, "NotSentToWebhook");
    assert!(
        want.conditions[0]
            .message
            .starts_with("CREATE never reaches the webhook")
    );
}

#[test]
fn an_unhealthy_source_withdraws_this_instance_only() {
    let mut l = lock(Some("prod"), serde_json::json!({}));
    Arc::make_mut(&mut l.meta).status.enforced_by = vec![
        enforcer("cp-1", 3, "2026-11-22T10:00:00Z"),
        enforcer("cp-2", 3, "2026-11-22T10:00:00Z"),
    ];
    Arc::make_mut(&mut l.meta).status.enforced_count = Some(2);
    let want = desired(&l, false, &Coverage::Sent, "cp-1", now());
    assert_eq!(want.entry, None);
    assert_eq!(want.count, 1);
    assert!(want.conditions.is_empty(), "asserts nothing it cannot see");
    assert!(needs_write(&l, &want, "cp-1", None));
    let config = want.apply_config(&l.key());
    assert_eq!(
        config,
        serde_json::json!({
            "apiVersion": "objectlock.dev/v1alpha1",
            "kind": "Lock",
            "metadata": {"name": "web", "namespace": "prod"},
            "status": {"enforcedCount": 1},
        }),
        "no enforcedBy at all: an empty list would claim the list"
    );
}

#[test]
fn a_withdrawal_keeps_the_condition_of_the_others_and_the_last_one_clears() {
    let mut l = lock(Some("prod"), serde_json::json!({}));
    let enforcing = desired(&l, true, &Coverage::Sent, "cp-2", now()).conditions;
    let other = LockCondition {
        type_: "Other".to_owned(),
        ..enforcing[0].clone()
    };
    Arc::make_mut(&mut l.meta).status = LockStatus {
        enforced_by: vec![
            enforcer("cp-1", 3, "2026-11-22T10:00:00Z"),
            enforcer("cp-2", 3, "2026-11-22T10:00:00Z"),
        ],
        enforced_count: Some(2),
        conditions: [enforcing.clone(), vec![other]].concat(),
    };
    // cp-1 may own the condition's fields alone (it wrote them last): leaving them out would
    // strip them from cp-2's condition.
    let want = desired(&l, false, &Coverage::Sent, "cp-1", now());
    assert_eq!((want.entry.as_ref(), want.count), (None, 1));
    assert_eq!(
        want.conditions, enforcing,
        "the Enforced condition as it stands"
    );
    assert!(!want.clears());
    assert_eq!(
        want.apply_config(&l.key())["status"]["conditions"],
        serde_json::json!(enforcing)
    );
    // cp-2 is the last: the status is cleared, whoever wrote its fields.
    Arc::make_mut(&mut l.meta).status.enforced_by.remove(0);
    let last = desired(&l, false, &Coverage::Sent, "cp-2", now());
    assert!(last.clears());
    assert!(needs_write(&l, &last, "cp-2", None));
    assert_eq!(
        Desired::clearing("7"),
        serde_json::json!({"metadata": {"resourceVersion": "7"},
            "status": {"enforcedBy": null, "enforcedCount": 0, "conditions": null}})
    );
    // A healthy instance that enforces nothing still says why: never a clearing.
    let warn = lock(Some("prod"), serde_json::json!({"mode": "Warn"}));
    assert!(!desired(&warn, true, &Coverage::Sent, "cp-1", now()).clears());
}

#[test]
fn writes_happen_only_when_the_status_differs() {
    let mut l = lock(None, serde_json::json!({}));
    let want = desired(&l, true, &Coverage::Sent, "cp-1", now());
    assert!(needs_write(&l, &want, "cp-1", None), "nothing written yet");
    // What the API server shows after our write.
    Arc::make_mut(&mut l.meta).status = LockStatus {
        enforced_by: vec![want.entry.clone().expect("entry")],
        enforced_count: Some(1),
        conditions: want.conditions.clone(),
    };
    Arc::make_mut(&mut l.meta).resource_version = "11".to_owned();
    let again = desired(&l, true, &Coverage::Sent, "cp-1", now());
    assert!(
        !needs_write(&l, &again, "cp-1", None),
        "a restart with nothing changed"
    );
    // Our write landed, the watch still shows the object before it: no second write.
    let before = lock(None, serde_json::json!({}));
    let mut applied = Applied::new(want.clone(), "11".to_owned());
    assert!(!needs_write(&before, &want, "cp-1", Some(&applied)));
    applied.echoed = true;
    // Another instance removed the count it owned: write it again, although we wrote it.
    Arc::make_mut(&mut l.meta).status.enforced_count = None;
    Arc::make_mut(&mut l.meta).resource_version = "12".to_owned();
    assert!(needs_write(&l, &again, "cp-1", Some(&applied)));
    // A condition another instance wrote differently is left alone once ours is written.
    Arc::make_mut(&mut l.meta).status.enforced_count = Some(1);
    Arc::make_mut(&mut l.meta).status.conditions[0].message = "older wording".to_owned();
    assert!(!needs_write(&l, &again, "cp-1", Some(&applied)));
    assert!(needs_write(&l, &again, "cp-1", None));
}

#[test]
fn coverage_follows_what_the_registration_names() {
    use LockOperation::{Connect, Create};
    let l = lock(Some("prod"), serde_json::json!({}));
    use Coverage::{Broad, NeverSent, NotYet, OperationsNotYet, Sent};
    // `part=keys` for part base, create or connect; keys `broad`, `-` (none), or a list of
    // `ns/name` (a Lock) and `name` (a ClusterLock). `not kept`: no configuration kept here.
    let registered = |text: &str| -> Option<Registered> {
        let mut registered = Registered::default();
        for part in (text != "not kept").then_some(text)?.split_whitespace() {
            let (part, keys) = part.split_once('=').expect("part=keys");
            let scope = match keys {
                "broad" => RegisteredScope::Broad("too many".to_owned()),
                keys => RegisteredScope::Narrow(
                    (keys.split(',').filter(|k| *k != "-"))
                        .map(|k| match k.split_once('/') {
                            Some((ns, name)) => LockKey::lock(ns, name),
                            None => LockKey::cluster_lock(k),
                        })
                        .collect(),
                ),
            };
            *match part {
                "base" => &mut registered.scope,
                "create" => &mut registered.create,
                _ => &mut registered.connect,
            } = Some(scope);
        }
        Some(registered)
    };
    use serde_json::json;
    let create = lock(Some("prod"), json!({"operations": ["CREATE", "UPDATE"]}));
    let connect = lock(Some("prod"), json!({"operations": ["CONNECT"]}));
    let both = lock(Some("prod"), json!({"operations": ["CREATE", "CONNECT"]}));
    let cluster_both = lock(None, json!({"operations": ["CREATE", "CONNECT"]}));
    let unparsed = lock(Some("prod"), json!({"operations": ["SHUTDOWN"]}));
    assert!(unparsed.problem.is_some());
    let too_many = || Broad("too many".into());
    let web = "base=prod/web";
    let rows: Vec<(&str, &str, &LockRef, Coverage)> = vec![
        ("not kept here", "not kept", &l, Sent),
        ("no write confirmed", "", &l, NotYet),
        ("same name, other scope", "base=web,dev/web", &l, NotYet),
        ("named", web, &l, Sent),
        ("broad", "base=broad", &l, too_many()),
        // CREATE and CONNECT: their own entries must name the lock too.
        (
            "CREATE not written yet",
            web,
            &create,
            OperationsNotYet(vec![Create]),
        ),
        (
            "CREATE names another",
            "base=prod/web create=dev/web",
            &create,
            OperationsNotYet(vec![Create]),
        ),
        (
            "CREATE named",
            "base=prod/web create=prod/web",
            &create,
            Sent,
        ),
        (
            "CREATE named, base not yet",
            "base=- create=prod/web",
            &create,
            NotYet,
        ),
        (
            "CREATE named, base broad",
            "base=broad create=prod/web",
            &create,
            too_many(),
        ),
        ("CREATE broad", "base=prod/web create=broad", &create, Sent),
        (
            "CONNECT not named, CREATE is",
            "base=prod/web create=prod/web connect=-",
            &both,
            OperationsNotYet(vec![Connect]),
        ),
        (
            "neither named",
            web,
            &both,
            OperationsNotYet(vec![Create, Connect]),
        ),
        (
            "CONNECT named",
            "base=prod/web connect=prod/web",
            &connect,
            Sent,
        ),
        (
            "a ClusterLock's CONNECT is never sent",
            "base=web create=web connect=-",
            &cluster_both,
            NeverSent(vec![Connect]),
        ),
        // A configuration this instance keeps no copy of has no CREATE or CONNECT rules.
        (
            "--broad or static: CREATE",
            "not kept",
            &create,
            NeverSent(vec![Create]),
        ),
        (
            "--broad or static: both",
            "not kept",
            &both,
            NeverSent(vec![Create, Connect]),
        ),
        // A spec that does not parse locks UPDATE and DELETE of its name only.
        ("unparsed", web, &unparsed, Sent),
    ];
    for (what, text, lock, expected) in rows {
        assert_eq!(
            Coverage::of(registered(text).as_ref(), &NamespaceLabels::default(), lock),
            expected,
            "{what}"
        );
    }
    // A lock whose CREATE is not sent yet is not enforced yet, as for UPDATE and DELETE.
    let operations_not_yet = Coverage::OperationsNotYet(vec![Create]);
    let pending = desired(&create, true, &operations_not_yet, "cp-1", now());
    assert_eq!(pending.entry, None);
    assert_eq!(pending.conditions[0].reason, "NotYetRegistered");

    let not_yet = desired(&l, true, &Coverage::NotYet, "cp-1", now());
    assert_eq!(not_yet.entry, None);
    assert_eq!(not_yet.count, 0);
    assert_eq!(not_yet.conditions[0].reason, "NotYetRegistered");
    assert_eq!(not_yet.conditions[0].status, "False");

    let broad = desired(&l, true, &Coverage::Broad("too many".into()), "cp-1", now());
    assert!(broad.entry.is_some());
    assert_eq!(broad.conditions[0].reason, "Enforcing");
    assert!(broad.conditions[0].message.contains("broad (too many)"));

    // A lock that is not enforced anyway says why, whatever the registration.
    let warn = lock(Some("prod"), serde_json::json!({"mode": "Warn"}));
    assert_eq!(
        desired(&warn, true, &Coverage::NotYet, "cp-1", now()).conditions[0].reason,
        "WarnMode"
    );
}

/// Namespaces labelled `lockable`: `prod` true, `dev` false, `bare` without the label.
fn labelled() -> NamespaceLabels {
    let labels = |lockable: Option<&str>| {
        Arc::new(
            lockable
                .map(|v| ("lockable".to_owned(), v.to_owned()))
                .into_iter()
                .collect(),
        )
    };
    NamespaceLabels {
        listed: true,
        labels: [
            ("prod".to_owned(), labels(Some("true"))),
            ("dev".to_owned(), labels(Some("false"))),
            ("bare".to_owned(), labels(None)),
        ]
        .into_iter()
        .collect(),
    }
}

/// A registration naming every lock of `keys`, limited to `lockable=true` namespaces (the
/// namespaced entries and the cluster-scoped one alike).
fn opted_in(keys: &[LockKey]) -> Registered {
    let lockable = LabelSelector {
        match_labels: Some([("lockable".to_owned(), "true".to_owned())].into()),
        match_expressions: None,
    };
    Registered {
        scope: Some(RegisteredScope::Narrow(keys.iter().cloned().collect())),
        namespaces: crate::registration::NamespaceSelection {
            locks: lockable.clone(),
            namespaces: lockable,
        },
        ..Registered::default()
    }
}

#[test]
fn a_lock_in_a_namespace_the_selector_leaves_out_is_not_enforced_and_says_where() {
    let labels = labelled();
    for ns in ["dev", "bare"] {
        let l = lock(Some(ns), serde_json::json!({}));
        let registered = opted_in(&[l.key()]);
        let coverage = Coverage::of(Some(&registered), &labels, &l);
        assert_eq!(
            coverage,
            Coverage::NotSelected {
                namespace: ns.to_owned(),
                selector: "lockable=true".to_owned()
            }
        );
        let want = desired(&l, true, &coverage, "cp-1", now());
        assert_eq!(want.entry, None, "{ns}");
        assert_eq!(want.count, 0);
        let condition = &want.conditions[0];
        assert_eq!(
            (condition.status.as_str(), condition.reason.as_str()),
            ("False", "NamespaceNotSelected")
        );
        assert!(
            condition.message.contains(&format!("namespace {ns} "))
                && condition.message.contains("(lockable=true)"),
            "names the namespace and the selector: {}",
            condition.message
        );
        // Not sent: a Warn-mode lock warns of nothing, an expired or unreadable one neither.
        for spec in [
            serde_json::json!({"mode": "Warn"}),
            serde_json::json!({"expiresAt": "2026-11-22T11:00:00Z"}),
            serde_json::json!({"mode": 7}),
        ] {
            let other = lock(Some(ns), spec);
            let want = desired(&other, true, &coverage, "cp-1", now());
            assert_eq!(want.conditions[0].reason, "NamespaceNotSelected");
            assert_eq!(want.entry, None);
        }
    }
    // In a selected namespace, named by the registration: enforced.
    let l = lock(Some("prod"), serde_json::json!({}));
    let registered = opted_in(&[l.key()]);
    let coverage = Coverage::of(Some(&registered), &labels, &l);
    assert_eq!(coverage, Coverage::Sent);
    assert_eq!(
        desired(&l, true, &coverage, "cp-1", now()).conditions[0].reason,
        "Enforcing"
    );
    // Broad beyond the bound: still sent only where selected.
    let mut broad = registered.clone();
    broad.scope = Some(RegisteredScope::Broad("too many".into()));
    assert_eq!(
        Coverage::of(Some(&broad), &labels, &l),
        Coverage::Broad("too many".into())
    );
    let dev = lock(Some("dev"), serde_json::json!({}));
    assert!(matches!(
        Coverage::of(Some(&broad), &labels, &dev),
        Coverage::NotSelected { .. }
    ));
    // Relabelled: the same lock is sent.
    let mut relabelled = labels.clone();
    relabelled.labels.insert(
        "dev".to_owned(),
        Arc::new([("lockable".to_owned(), "true".to_owned())].into()),
    );
    let registered = opted_in(&[dev.key()]);
    assert_eq!(
        Coverage::of(Some(&registered), &relabelled, &dev),
        Coverage::Sent
    );
    // The labels not known yet, or a namespace the watch has not shown yet: not yet.
    assert_eq!(
        Coverage::of(Some(&registered), &NamespaceLabels::default(), &dev),
        Coverage::NotYet
    );
    let new = lock(Some("new"), serde_json::json!({}));
    assert_eq!(
        Coverage::of(Some(&opted_in(&[new.key()])), &labels, &new),
        Coverage::NotYet
    );
    // kube-system keeps its own reason.
    let system = lock(Some("kube-system"), serde_json::json!({}));
    let coverage = Coverage::NotSelected {
        namespace: "kube-system".into(),
        selector: "lockable=true".into(),
    };
    assert_eq!(
        desired(&system, true, &coverage, "cp-1", now()).conditions[0].reason,
        "NotSentToWebhook"
    );
}

#[test]
fn a_cluster_lock_on_an_unselected_namespace_is_not_enforced_and_others_are() {
    let labels = labelled();
    let on_namespace = |name: &str| {
        let mut l = lock(
            None,
            serde_json::json!({"resources": [{"apiGroups": [""], "resources": ["namespaces"]}]}),
        );
        l.name = name.to_owned();
        l
    };
    let dev = on_namespace("dev");
    let coverage = Coverage::of(Some(&opted_in(&[dev.key()])), &labels, &dev);
    assert_eq!(
        desired(&dev, true, &coverage, "cp-1", now()).conditions[0].reason,
        "NamespaceNotSelected"
    );
    let prod = on_namespace("prod");
    let coverage = Coverage::of(Some(&opted_in(&[prod.key()])), &labels, &prod);
    assert_eq!(coverage, Coverage::Sent);
    // A ClusterLock that may cover other cluster-scoped objects named "dev": those are sent.
    let mut any = lock(None, serde_json::json!({}));
    any.name = "dev".to_owned();
    assert_eq!(
        Coverage::of(Some(&opted_in(&[any.key()])), &labels, &any),
        Coverage::Sent
    );
    // A Namespace that does not exist has no labels to leave it out by.
    let missing = on_namespace("missing");
    assert_eq!(
        Coverage::of(Some(&opted_in(&[missing.key()])), &labels, &missing),
        Coverage::Sent
    );
}

#[test]
fn the_condition_names_the_operations_refused_and_those_never_sent() {
    use LockOperation::Create;
    let message = |spec: serde_json::Value, coverage: &Coverage| {
        let want = desired(&lock(Some("prod"), spec), true, coverage, "cp-1", now());
        let condition = want.conditions[0].clone();
        (condition.status, condition.reason, condition.message)
    };
    let (status, reason, text) = message(serde_json::json!({}), &Coverage::Sent);
    assert_eq!((status.as_str(), reason.as_str()), ("True", "Enforcing"));
    assert!(
        text.starts_with("UPDATE and DELETE of the locked object are refused;"),
        "{text}"
    );
    let connect = serde_json::json!({"operations": ["CONNECT"]});
    let (_, _, text) = message(connect, &Coverage::Sent);
    assert!(
        text.starts_with("CONNECT of the locked object is refused;"),
        "{text}"
    );

    // A registration the instances do not keep sends no CREATE: the rest is still refused...
    let never = Coverage::NeverSent(vec![Create]);
    let both = serde_json::json!({"operations": ["CREATE", "UPDATE"]});
    let (status, reason, text) = message(both, &never);
    assert_eq!((status.as_str(), reason.as_str()), ("True", "Enforcing"));
    assert!(
        text.starts_with(
            "UPDATE of the locked object is refused (CREATE never reaches the webhook:"
        ),
        "{text}"
    );
    // ...and a lock of CREATE alone refuses nothing, which the plugin stops waiting on.
    let (status, reason, text) = message(serde_json::json!({"operations": ["CREATE"]}), &never);
    assert_eq!(
        (status.as_str(), reason.as_str()),
        ("False", "NotSentToWebhook")
    );
    assert!(
        text.starts_with("CREATE never reaches the webhook"),
        "{text}"
    );
}
