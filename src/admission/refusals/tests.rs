use super::*;
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

fn verdict(req: &AdmissionRequest, set: &LockSet) -> Verdict {
    let Triage::Lookup(lookup) = decide::triage(req) else {
        panic!("needs a lookup")
    };
    decide::decide(
        req,
        &lookup,
        set,
        None,
        None,
        &crate::admission::changes::Objects::unknown(),
        Timestamp::now(),
    )
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
fn a_refusal_is_recorded_against_the_lock_that_refused() {
    let set: LockSet = [
        LockRef::lock("prod", "app-config", spec(json!({"reason": "freeze"}))),
        LockRef::lock("prod", "other", LockSpec::default()),
    ]
    .into_iter()
    .collect();
    let metrics = EnforcementMetrics::default();
    let (sink, mut rx) = EventSink::channel(8, metrics.clone());
    let req = request(json!({}));
    sink.record_verdict(&req, &verdict(&req, &set), &set, None);
    let recorded = drain(&mut rx);
    assert_eq!(
        recorded,
        [RefusalEvent {
            lock: LockKey {
                namespace: Some("prod".into()),
                name: "app-config".into()
            },
            reason: Reason::Blocked,
            operation: "DELETE",
            note: "DELETE of configmaps \"app-config\" in namespace \"prod\" by alice refused"
                .into(),
        }]
    );
    let labels = EventLabels { reason: BLOCKED };
    assert_eq!(metrics.refusal_events.get_or_create(&labels).get(), 1);

    // Allowed: nothing recorded.
    let free = request(json!({"name": "free", "oldObject": {"metadata": {"name": "free"}}}));
    sink.record_verdict(&free, &verdict(&free, &set), &set, None);
    assert!(drain(&mut rx).is_empty());
}

#[test]
fn warn_mode_locks_record_would_block_and_dry_runs_nothing() {
    let set: LockSet = [LockRef::lock(
        "prod",
        "app-config",
        spec(json!({"mode": "Warn"})),
    )]
    .into_iter()
    .collect();
    let (sink, mut rx) = EventSink::channel(8, EnforcementMetrics::default());
    let req = request(json!({"operation": "UPDATE", "userInfo": {"username": "bob"}}));
    sink.record_verdict(&req, &verdict(&req, &set), &set, None);
    let recorded = drain(&mut rx);
    assert_eq!(recorded.len(), 1);
    assert_eq!(recorded[0].reason, Reason::WouldBlock);
    assert_eq!(recorded[0].operation, "UPDATE");
    assert!(
        recorded[0].note.contains("by bob allowed with a warning"),
        "{}",
        recorded[0].note
    );

    let dry = request(json!({"dryRun": true}));
    let enforce: LockSet = [LockRef::lock("prod", "app-config", LockSpec::default())]
        .into_iter()
        .collect();
    let refused = verdict(&dry, &enforce);
    assert!(
        !refused.allowed(),
        "a dry run is refused like the real thing"
    );
    sink.record_verdict(&dry, &refused, &enforce, None);
    assert!(drain(&mut rx).is_empty(), "but leaves no event");
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
        &crate::admission::changes::Objects::unknown(),
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

#[test]
fn the_note_names_the_field_that_changed() {
    let set: LockSet = [LockRef::lock(
        "prod",
        "app-config",
        spec(json!({"fields": ["data"]})),
    )]
    .into_iter()
    .collect();
    let (sink, mut rx) = EventSink::channel(8, EnforcementMetrics::default());
    let req = request(json!({"operation": "UPDATE"}));
    let Triage::Lookup(lookup) = decide::triage(&req) else {
        panic!("needs a lookup")
    };
    let objects = crate::admission::changes::Objects::from_values(
        json!({"data": {"k": "1"}}),
        json!({"data": {"k": "2"}}),
    );
    let refused = decide::decide(&req, &lookup, &set, None, None, &objects, Timestamp::now());
    sink.record_verdict(&req, &refused, &set, None);
    let notes: Vec<String> = drain(&mut rx).into_iter().map(|r| r.note).collect();
    assert_eq!(
        notes,
        [
            "UPDATE of configmaps \"app-config\" in namespace \"prod\" (data changed) by alice refused"
        ]
    );
}
