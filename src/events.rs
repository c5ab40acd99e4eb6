//! Refusals become Kubernetes Events on the Lock (`Blocked`, `WouldBlock`), in series as
//! client-go's recorder makes them, written by a background task started with the lock status
//! writer ([`Reporting`]). Invariant: recording never waits and never changes an answer (a full
//! queue drops and counts); at most one write per lock per `min_interval`; dry runs are not recorded.

use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;
use std::time::Duration;

use k8s_openapi::api::core::v1::ObjectReference;
use k8s_openapi::api::events::v1::{Event, EventSeries};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{MicroTime, ObjectMeta};
use k8s_openapi::jiff::Timestamp;
use kube::api::{Api, Patch, PatchParams, PostParams};
use tokio::sync::{mpsc, watch};
use tokio::task::JoinSet;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;
use tracing::{debug, warn};

pub use crate::admission::refusals::{BLOCKED, EventSink, Reason, RefusalEvent, WOULD_BLOCK};
use crate::api::{self, LockKey};
use crate::locks::index::LockIndex;
use crate::metrics::{DropLabels, EnforcementMetrics, EventWriteLabels};
use crate::registration::Registered;
use crate::status::{self, LockSnapshot};

pub const REPORTING_CONTROLLER: &str = "objectlock.dev/kube-object-lock";
/// At most one write per lock this often.
pub const MIN_INTERVAL: Duration = Duration::from_secs(5);
/// Series kept at once; refusals that would start one more are dropped and counted.
const MAX_SERIES: usize = 4096;
/// A series idle this long is finished; the next refusal starts a new Event (as client-go).
const SERIES_IDLE: Duration = Duration::from_secs(6 * 60);
/// Failed writes of one series before its pending count is given up (and counted dropped).
const MAX_FAILURES: u32 = 3;
/// How often pending counts are looked at.
const TICK: Duration = Duration::from_millis(200);

#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord)]
struct SeriesKey {
    lock: LockKey,
    reason: Reason,
    note: String,
}

#[derive(Debug)]
struct Series {
    operation: &'static str,
    event: Option<Event>,
    /// Occurrences seen, and as last written.
    count: i32,
    written: i32,
    last_observed: Timestamp,
    failures: u32,
}

/// Writes the queued refusals as event series, at most one write per lock each `min_interval`
/// (all that is pending at once when the queue closes), until the queue closes. `locks` gives
/// the uid of each lock (so that `kubectl describe` finds its events).
pub async fn run(
    client: kube::Client,
    instance: String,
    min_interval: Duration,
    mut queue: mpsc::Receiver<RefusalEvent>,
    locks: watch::Receiver<LockSnapshot>,
    metrics: EnforcementMetrics,
) {
    let mut series: BTreeMap<SeriesKey, Series> = BTreeMap::new();
    let mut last_write: HashMap<LockKey, Instant> = HashMap::new();
    let mut tick = tokio::time::interval(TICK);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let mut open = true;
    while open || series.values().any(|s| s.count > s.written) {
        tokio::select! {
            received = queue.recv(), if open => {
                match received {
                    Some(refusal) => add(&mut series, refusal, MAX_SERIES, &metrics),
                    None => open = false,
                }
                continue;
            },
            _ = tick.tick() => {}
        }
        let (now, clock) = (Timestamp::now(), Instant::now());
        // Finished series go: memory stays bounded by what happened in the last few minutes.
        series.retain(|_, s| {
            s.count > s.written || now.duration_since(s.last_observed).unsigned_abs() < SERIES_IDLE
        });
        last_write.retain(|_, at| clock.duration_since(*at) < min_interval);
        // One write per lock whose interval has passed: its oldest pending series.
        let mut due: Vec<SeriesKey> = vec![];
        for (key, s) in &series {
            let lock_free = !open || !last_write.contains_key(&key.lock);
            if s.count > s.written && lock_free && !due.iter().any(|d| d.lock == key.lock) {
                due.push(key.clone());
            }
        }
        for key in due {
            last_write.insert(key.lock.clone(), clock);
            let Some(s) = series.get_mut(&key) else {
                continue;
            };
            let uid = locks.borrow().get(&key.lock).map(|l| l.meta.uid.clone());
            let (verb, result) = write(&client, &instance, &key, s, uid).await;
            let outcome = if result.is_ok() { "success" } else { "failure" };
            (metrics
                .event_writes
                .get_or_create(&EventWriteLabels { verb, outcome }))
            .inc();
            match result {
                Ok(event) => {
                    debug!(lock = %key.lock, reason = key.reason.as_str(), count = s.count, "refusal event written");
                    s.event = Some(event);
                    s.written = s.count;
                    s.failures = 0;
                }
                Err(error) => {
                    s.failures += 1;
                    // The Event was deleted (events live an hour): start a new one.
                    if matches!(&error, kube::Error::Api(e) if e.code == 404) {
                        s.event = None;
                        s.written = 0;
                    }
                    // Once per lock until a write succeeds, its repeats at debug; the hint only
                    // where the API server refused what was asked.
                    if s.failures > 1 {
                        debug!(lock = %key.lock, %error, failures = s.failures, "cannot write refusal event, again");
                    } else if crate::retry::is_refusal(&error) {
                        warn!(lock = %key.lock, %error, failures = s.failures,
                            "cannot write refusal event (needs create and patch on events.events.k8s.io)");
                    } else {
                        warn!(lock = %key.lock, %error, failures = s.failures, "cannot write refusal event");
                    }
                    if s.failures >= MAX_FAILURES {
                        let lost = u64::try_from(s.count - s.written).unwrap_or(0);
                        dropped(&metrics, "write_failed", lost);
                        series.remove(&key);
                    }
                }
            }
        }
    }
}

/// Refusals queued for events at most; more are dropped (and counted) until the writer catches up.
const EVENT_QUEUE: usize = 4096;

/// The two writers that report what this instance enforces, started and stopped together: lock
/// status ([`crate::status`]) and refusal events, both reading the admission path's lock index.
pub struct Reporting {
    /// The admission path's end of the event queue.
    pub events: EventSink,
    stop: CancellationToken,
    /// The two writers, the lock feed and the namespace watch: aborted when dropped.
    tasks: JoinSet<()>,
}

impl Reporting {
    /// `registered`: what the narrowed configuration names, when this instance keeps one.
    pub fn start(
        client: kube::Client,
        instance: String,
        metrics: EnforcementMetrics,
        index: Arc<LockIndex>,
        registered: Option<watch::Receiver<Registered>>,
    ) -> Reporting {
        let mut tasks = JoinSet::new();
        let (snapshots, feed) = status::view::follow(index);
        tasks.spawn(feed);
        // The namespaces' labels matter only under a configuration this instance keeps: only
        // there can it read the operator's requirements.
        let namespaces = registered.as_ref().map(|registered| {
            let (rx, run) = status::namespaces::follow(client.clone(), registered.clone());
            tasks.spawn(run);
            rx
        });
        let (events, queue) = EventSink::channel(EVENT_QUEUE, metrics.clone());
        let stop = CancellationToken::new();
        tasks.spawn(run(
            client.clone(),
            instance.clone(),
            MIN_INTERVAL,
            queue,
            snapshots.clone(),
            metrics.clone(),
        ));
        tasks.spawn(status::writer::run(
            client,
            instance,
            snapshots,
            registered,
            namespaces,
            metrics,
            stop.clone().cancelled_owned(),
        ));
        Reporting {
            events,
            stop,
            tasks,
        }
    }

    /// Withdraws this instance from the status of the locks and writes the pending events,
    /// within `grace`; the rest is abandoned.
    pub async fn stop(mut self, grace: Duration) {
        self.stop.cancel();
        // The queue closes when the last sink (the reviewer's) is gone; the feed and the
        // namespace watch end with the writers, their only readers.
        drop(self.events);
        let work = async { while self.tasks.join_next().await.is_some() {} };
        if tokio::time::timeout(grace, work).await.is_err() {
            warn!(
                ?grace,
                "lock status and events not fully written at shutdown"
            );
        }
    }
}

fn dropped(metrics: &EnforcementMetrics, cause: &'static str, lost: u64) {
    (metrics
        .refusal_events_dropped
        .get_or_create(&DropLabels { cause }))
    .inc_by(lost);
}

fn add(
    series: &mut BTreeMap<SeriesKey, Series>,
    refusal: RefusalEvent,
    max_series: usize,
    metrics: &EnforcementMetrics,
) {
    let key = SeriesKey {
        lock: refusal.lock,
        reason: refusal.reason,
        note: refusal.note,
    };
    let now = Timestamp::now();
    if let Some(s) = series.get_mut(&key) {
        s.count = s.count.saturating_add(1);
        s.last_observed = now;
        return;
    }
    if series.len() >= max_series {
        dropped(metrics, "series_limit", 1);
        return;
    }
    series.insert(
        key,
        Series {
            operation: refusal.operation,
            event: None,
            count: 1,
            written: 0,
            last_observed: now,
            failures: 0,
        },
    );
}

async fn write(
    client: &kube::Client,
    instance: &str,
    key: &SeriesKey,
    s: &Series,
    uid: Option<String>,
) -> (&'static str, Result<Event, kube::Error>) {
    let namespace = key.lock.namespace.as_deref().unwrap_or("default");
    let api: Api<Event> = Api::namespaced(client.clone(), namespace);
    let series = (s.count >= 2).then_some(EventSeries {
        count: s.count,
        last_observed_time: MicroTime(s.last_observed),
    });
    match &s.event {
        Some(event) => {
            let name = event.metadata.name.as_deref().unwrap_or_default();
            let patch = Patch::Merge(serde_json::json!({ "series": series }));
            (
                "patch",
                api.patch(name, &PatchParams::default(), &patch).await,
            )
        }
        None => {
            let now = Timestamp::now();
            let event = Event {
                metadata: ObjectMeta {
                    name: Some(format!("{}.{:x}", key.lock.name, now.as_nanosecond())),
                    namespace: Some(namespace.to_owned()),
                    ..ObjectMeta::default()
                },
                event_time: Some(MicroTime(now)),
                action: Some(s.operation.to_owned()),
                reason: Some(key.reason.as_str().to_owned()),
                note: Some(key.note.clone()),
                type_: Some(match key.reason {
                    Reason::Blocked => "Warning".to_owned(),
                    Reason::WouldBlock => "Normal".to_owned(),
                }),
                regarding: Some(ObjectReference {
                    api_version: Some(api::API_VERSION.to_owned()),
                    kind: Some(key.lock.kind().as_str().to_owned()),
                    name: Some(key.lock.name.clone()),
                    namespace: key.lock.namespace.clone(),
                    uid: uid.filter(|u| !u.is_empty()),
                    ..ObjectReference::default()
                }),
                reporting_controller: Some(REPORTING_CONTROLLER.to_owned()),
                reporting_instance: Some(instance.to_owned()),
                series,
                ..Event::default()
            };
            ("create", api.create(&PostParams::default(), &event).await)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn repeats_grow_one_series_and_new_series_are_bounded() {
        let metrics = EnforcementMetrics::default();
        let mut series = BTreeMap::new();
        let refusal = |note: &str| RefusalEvent {
            lock: LockKey {
                namespace: Some("prod".into()),
                name: "web".into(),
            },
            reason: Reason::Blocked,
            operation: "DELETE",
            note: note.into(),
        };
        for _ in 0..10 {
            add(&mut series, refusal("a"), 2, &metrics);
        }
        add(&mut series, refusal("b"), 2, &metrics);
        add(&mut series, refusal("c"), 2, &metrics);
        assert_eq!(series.len(), 2);
        let counts: Vec<i32> = series.values().map(|s| s.count).collect();
        assert_eq!(counts, [10, 1]);
        let dropped = DropLabels {
            cause: "series_limit",
        };
        assert_eq!(
            metrics.refusal_events_dropped.get_or_create(&dropped).get(),
            1
        );
    }
}
