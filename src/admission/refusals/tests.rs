use super::*;
use crate::admission::changes::Objects;
use crate::admission::decide::{self, Triage};
use crate::api::LockSpec;
use k8s_openapi::jiff::Timestamp;
use serde_json::json;

fn request(patch: serde_json::Value) -> AdmissionRequest<'static> {
    let mut base = json!({
        "uid": "u-1",
        "resource": {"group": "", "version": "v1", "resource": "configmaps"},
        "name": "app-config",
        "namespace": "prod",
        "operation": "DELETE",
        "userInfo": {"username": "alice", "groups": ["dev"]},
        "oldObject": {"metadata": {"name": "app-config", "namespace": "prod"}},
    });
    for (k, v) in patch.as_object().expect("object") {
        base[k] = v.clone();
    }
    AdmissionRequest::from_json(base).expect("valid request")
}

fn verdict(req: &AdmissionRequest, set: &LockSet, objects: &Objects) -> Verdict {
    let Triage::Lookup(lookup) = decide::triage(req) else {
        panic!("needs a lookup")
    };
    decide::decide(req, &lookup, set, None, None, objects, Timestamp::now())
}

fn spec(value: serde_json::Value) -> LockSpec {
    serde_json::from_value(value).expect("spec")
}

fn drain(rx: &mut mpsc::Receiver<RefusalEvent>) -> Vec<RefusalEvent> {
    let mut out = vec![];
    while let Ok(r) = rx.try_recv() {
        out.push(r);
    }
    out
}

#[test]
fn what_each_verdict_records() {
    let metrics = EnforcementMetrics::default();
    let (sink, mut rx) = EventSink::channel(8, metrics.clone());
    let lock = |value| LockRef::lock("prod", "app-config", spec(value));
    let data = || Objects::from_values(json!({"data": {"k": "1"}}), json!({"data": {"k": "2"}}));
    let of = "of configmaps \"app-config\" in namespace \"prod\"";
    // (request, locks, objects, what is recorded: reason, operation, note)
    let rows = [
        (
            json!({}),
            vec![
                lock(json!({"reason": "freeze"})),
                LockRef::lock("prod", "other", LockSpec::default()),
            ],
            Objects::unknown(),
            vec![(
                Reason::Blocked,
                "DELETE",
                format!("DELETE {of} by alice refused"),
            )],
        ),
        (
            json!({"name": "free", "oldObject": {"metadata": {"name": "free"}}}),
            vec![lock(json!({}))],
            Objects::unknown(),
            vec![],
        ),
        (
            json!({"operation": "UPDATE", "userInfo": {"username": "bob"}}),
            vec![lock(json!({"mode": "Warn"}))],
            Objects::unknown(),
            vec![(
                Reason::WouldBlock,
                "UPDATE",
                format!("UPDATE {of} by bob allowed with a warning (mode Warn)"),
            )],
        ),
        // A dry run is refused like the real thing, but leaves no event.
        (
            json!({"dryRun": true}),
            vec![lock(json!({}))],
            Objects::unknown(),
            vec![],
        ),
        (
            json!({"operation": "UPDATE"}),
            vec![lock(json!({"fields": ["data"]}))],
            data(),
            vec![(
                Reason::Blocked,
                "UPDATE",
                format!("UPDATE {of} (data changed) by alice refused"),
            )],
        ),
    ];
    for (patch, locks, objects, expected) in rows {
        let set: LockSet = locks.into_iter().collect();
        let req = request(patch.clone());
        sink.record_verdict(&req, &verdict(&req, &set, &objects), &set, None);
        let recorded: Vec<_> = (drain(&mut rx).into_iter())
            .inspect(|r| assert_eq!(r.lock, LockKey::lock("prod", "app-config")))
            .map(|r| (r.reason, r.operation, r.note))
            .collect();
        assert_eq!(recorded, expected, "{patch}");
    }
    let labels = EventLabels { reason: BLOCKED };
    assert_eq!(metrics.refusal_events.get_or_create(&labels).get(), 2);
}

#[test]
fn namespace_deletion_is_recorded_on_the_locks_inside() {
    let contents: LockSet = [LockRef::lock("prod", "a", LockSpec::default())]
        .into_iter()
        .collect();
    let req = request(json!({
        "resource": {"group": "", "version": "v1", "resource": "namespaces"},
        "name": "prod", "namespace": "prod",
        "oldObject": {"metadata": {"name": "prod"}},
    }));
    let Triage::Lookup(lookup) = decide::triage(&req) else {
        panic!("lookup")
    };
    let cluster = LockSet::default();
    let refused = decide::decide(
        &req,
        &lookup,
        &cluster,
        Some(&contents),
        None,
        &Objects::unknown(),
        Timestamp::now(),
    );
    let found = refusing_locks(&refused, &cluster, Some(&contents));
    assert_eq!(found.len(), 1);
    assert_eq!(
        (found[0].0.name.as_str(), found[0].1),
        ("a", Reason::Blocked)
    );
}

#[test]
fn a_full_queue_drops_and_counts_without_waiting() {
    let metrics = EnforcementMetrics::default();
    let (sink, mut rx) = EventSink::channel(2, metrics.clone());
    let refusal = RefusalEvent {
        lock: LockKey {
            namespace: None,
            name: "n".into(),
        },
        reason: Reason::Blocked,
        operation: "DELETE",
        note: "x".into(),
    };
    for _ in 0..5 {
        sink.record(refusal.clone());
    }
    assert_eq!(drain(&mut rx).len(), 2);
    let dropped = DropLabels {
        cause: "queue_full",
    };
    assert_eq!(
        metrics.refusal_events_dropped.get_or_create(&dropped).get(),
        3
    );
    // Every refusal counts against its lock, queued or dropped.
    let by_lock = RefusalLabels {
        reason: "Blocked",
        namespace: String::new(),
        name: "n".into(),
    };
    assert_eq!(metrics.refusals.get_or_create(&by_lock).get(), 5);
}

#[test]
fn notes_fit_an_event() {
    let long = clip("é".repeat(2000));
    assert!(long.len() <= MAX_NOTE_BYTES, "{}", long.len());
    assert!(long.ends_with('…'));
    assert_eq!(clip("short".into()), "short");
}
