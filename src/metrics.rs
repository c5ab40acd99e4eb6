//! Prometheus metrics, served in the text format on a separate plain-HTTP listener (with the
//! health and readiness probes).
//!
//! Every UPDATE and DELETE in the cluster waits on this webhook, so its latency, its errors and
//! its cost to the API server must be visible. All names share the `kube_object_lock_` prefix;
//! label values come from small fixed sets (operations, decisions, verbs), never from object
//! names or uids, so the series count stays bounded whatever the traffic. The exceptions name
//! locks, which are few and made by hand: `unparseable_locks`, each Lock whose spec cannot be
//! read (there should be none, and an operator needs to know which one to fix), and
//! `refusals`, each lock that refused something. The counters alerts watch for failures start
//! at 0, so that the first failure is an increase.

use std::sync::{Arc, OnceLock};
use std::time::Duration;

use prometheus_client::encoding::{EncodeLabelSet, EncodeLabelValue};
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::Histogram;
use prometheus_client::registry::Registry;

/// The decision an admission request got.
#[derive(Clone, Copy, Debug, Hash, PartialEq, Eq, EncodeLabelValue)]
#[allow(non_camel_case_types)]
pub enum Decision {
    /// Allowed.
    allowed,
    /// Allowed with a warning.
    warned,
    /// Refused by a lock.
    denied,
    /// The locks could not be read; `on_lookup_error` decided.
    error,
}

/// Labels of the admission counter.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct AdmissionLabels {
    /// CREATE, UPDATE, DELETE or CONNECT. (Requests that are not an AdmissionReview are
    /// counted in `invalid_requests` instead.)
    pub operation: &'static str,
    /// The decision.
    pub decision: Decision,
}

/// Labels of lookup errors.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct LookupErrorLabels {
    /// `timeout`, `forbidden` or `api`.
    pub reason: &'static str,
    /// What `on_lookup_error` answered: `deny` or `allow`.
    pub decision: &'static str,
}

/// Labels of the reads of an object's labels for selector locks.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct LabelReadLabels {
    /// `read`, `not_found`, `timeout`, `forbidden`, `api`, `connection` or `no_cluster`.
    pub outcome: &'static str,
}

/// Labels of API requests.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ApiLabels {
    /// `list`.
    pub verb: &'static str,
    /// `locks` or `clusterlocks`.
    pub resource: &'static str,
    /// `success`, or the error class (`forbidden`, `server_error`, `client_error`, `connection`).
    pub outcome: &'static str,
}

/// Labels naming a lock kind.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct KindLabels {
    /// `Lock` or `ClusterLock`.
    pub kind: &'static str,
}

/// Labels of the lock source's mode.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ModeLabels {
    /// `Lock` or `ClusterLock`.
    pub kind: &'static str,
    /// `watch` (answered from the index) or `fallback` (LIST through the cache).
    pub mode: &'static str,
}

/// Labels naming one lock object.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct LockLabels {
    /// `Lock` or `ClusterLock`.
    pub kind: &'static str,
    /// The Lock's namespace (empty for a ClusterLock).
    pub namespace: String,
    /// The lock's name.
    pub name: String,
}

/// Labels naming a cache result.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct CacheLabels {
    /// `hit` or `miss`.
    pub result: &'static str,
}

/// Labels naming a lock scope.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ScopeLabels {
    /// `namespaced` or `cluster`.
    pub scope: &'static str,
}

/// Labels of the build info.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct BuildLabels {
    /// The crate version.
    pub version: &'static str,
}

/// The operations whose request counters are kept at hand.
const OPERATIONS: [&str; 4] = ["CREATE", "UPDATE", "DELETE", "CONNECT"];
/// How many [`Decision`]s there are.
const DECISIONS: usize = Decision::error as usize + 1;

/// Metrics of the admission path.
#[derive(Clone, Debug)]
pub struct AdmissionMetrics {
    /// Requests by operation and decision.
    pub requests: Family<AdmissionLabels, Counter>,
    /// Time from body received to answer encoded.
    pub duration: Histogram,
    /// Lookup failures by reason and the decision they caused.
    pub lookup_errors: Family<LookupErrorLabels, Counter>,
    /// Reads of the labels of evicted pods and scaled objects for selector locks, by outcome.
    pub label_reads: Family<LabelReadLabels, Counter>,
    /// The counters of `requests`, each looked up once: the family hashes its labels and takes
    /// a lock on every lookup. Filled on first use, so a series appears once it counts.
    counters: Arc<[OnceLock<Counter>; OPERATIONS.len() * DECISIONS]>,
}

impl Default for AdmissionMetrics {
    fn default() -> Self {
        AdmissionMetrics {
            requests: Family::default(),
            // 25 µs to ~6.5 s: fine enough for cached answers, wide enough for API timeouts.
            duration: Histogram::new(prometheus_client::metrics::histogram::exponential_buckets(
                0.000_025, 2.0, 19,
            )),
            lookup_errors: Family::default(),
            label_reads: Family::default(),
            counters: Arc::new(std::array::from_fn(|_| OnceLock::new())),
        }
    }
}

impl AdmissionMetrics {
    /// Records one answered request.
    pub fn observe(&self, operation: &'static str, decision: Decision, took: Duration) {
        let labels = || AdmissionLabels {
            operation,
            decision,
        };
        match OPERATIONS.iter().position(|o| *o == operation) {
            Some(index) => {
                let slot = index * DECISIONS + decision as usize;
                self.counters[slot]
                    .get_or_init(|| self.requests.get_or_create(&labels()).clone())
                    .inc();
            }
            None => {
                self.requests.get_or_create(&labels()).inc();
            }
        }
        self.duration.observe(took.as_secs_f64());
    }
}

/// Metrics of the Kubernetes lock source.
#[derive(Clone, Debug, Default)]
pub struct SourceMetrics {
    /// Lookups answered from the cache (`hit`) or needing a load (`miss`).
    pub cache_requests: Family<CacheLabels, Counter>,
    /// LISTs made to fill the cache (concurrent misses share one).
    pub cache_loads: Counter,
    /// API requests made by lookups, by verb, resource and outcome.
    pub api_requests: Family<ApiLabels, Counter>,
    /// Watch failures (each one restarts the watch with backoff) and re-lists.
    pub watch_restarts: Family<KindLabels, Counter>,
    pub watch_events: Family<KindLabels, Counter>,
    /// 1 for the mode each kind's lookups are in (`watch` or `fallback`), 0 for the other.
    pub mode: Family<ModeLabels, Gauge>,
    /// When each kind entered its current mode (Unix time).
    pub mode_since: Family<KindLabels, Gauge>,
    /// Locks whose spec cannot be read (each locks its own name, fail closed): 1 per lock.
    pub unparseable_locks: Family<LockLabels, Gauge>,
}

/// Labels of a writer's writes.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct OutcomeLabels {
    /// `success` (status) or `written` (registration), or the failure (`forbidden`,
    /// `not_found`, `missing`, `conflict`, `error`).
    pub outcome: &'static str,
}

/// Labels of refusal events.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct EventLabels {
    /// `Blocked` or `WouldBlock`.
    pub reason: &'static str,
}

/// Labels of refusals counted per lock.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct RefusalLabels {
    /// `Blocked` or `WouldBlock`.
    pub reason: &'static str,
    /// The lock's namespace (empty for a ClusterLock).
    pub namespace: String,
    /// The lock's name.
    pub name: String,
}

/// Labels of refusal events that were not written.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct DropLabels {
    /// `queue_full`, `series_limit` or `write_failed`.
    pub cause: &'static str,
}

/// Labels of event API writes.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct EventWriteLabels {
    /// `create` or `patch`.
    pub verb: &'static str,
    /// `success` or `failure`.
    pub outcome: &'static str,
}

/// Metrics of lock status and refusal events.
#[derive(Clone, Debug, Default)]
pub struct EnforcementMetrics {
    /// Status writes, by outcome.
    pub status_writes: Family<OutcomeLabels, Counter>,
    /// Refusals handed to the event writer, by reason.
    pub refusal_events: Family<EventLabels, Counter>,
    /// Refusals that never made it into an event, by cause.
    pub refusal_events_dropped: Family<DropLabels, Counter>,
    /// Refusals (and Warn-mode matches) by reason and lock.
    pub refusals: Family<RefusalLabels, Counter>,
    /// Event API writes, by verb and outcome.
    pub event_writes: Family<EventWriteLabels, Counter>,
}

impl EnforcementMetrics {
    /// Registers every metric in `registry`.
    pub fn registered(registry: &mut Registry) -> EnforcementMetrics {
        let metrics = EnforcementMetrics::default();
        registry.register(
            "status_writes",
            "Lock status writes (server-side apply of this instance's entry), by outcome",
            metrics.status_writes.clone(),
        );
        registry.register(
            "refusal_events",
            "Refusals (Blocked) and Warn-mode matches (WouldBlock) queued for a Kubernetes Event",
            metrics.refusal_events.clone(),
        );
        registry.register(
            "refusal_events_dropped",
            "Refusals left out of events, by cause (queue_full, series_limit, write_failed)",
            metrics.refusal_events_dropped.clone(),
        );
        registry.register(
            "refusals",
            "Refusals (Blocked) and Warn-mode matches (WouldBlock), by reason and lock",
            metrics.refusals.clone(),
        );
        registry.register(
            "event_writes",
            "Kubernetes Event writes (create a series, patch its count), by verb and outcome",
            metrics.event_writes.clone(),
        );
        // Present at 0 from the start, so that an alert sees the first failure as an increase.
        for outcome in ["success", "forbidden", "not_found", "conflict", "error"] {
            let _ = metrics
                .status_writes
                .get_or_create(&OutcomeLabels { outcome });
        }
        for verb in ["create", "patch"] {
            for outcome in ["success", "failure"] {
                let _ = (metrics.event_writes).get_or_create(&EventWriteLabels { verb, outcome });
            }
        }
        for cause in ["queue_full", "series_limit", "write_failed"] {
            let _ = metrics
                .refusal_events_dropped
                .get_or_create(&DropLabels { cause });
        }
        metrics
    }
}

/// Labels naming the webhook configuration.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ConfigurationLabels {
    /// The ValidatingWebhookConfiguration's name.
    pub name: String,
}

/// Metrics of the registration writer.
#[derive(Clone, Debug, Default)]
pub struct RegistrationMetrics {
    /// 1 while the written registration is narrowed, 0 while it is broad (or not written).
    pub narrowed: Gauge,
    /// Live locks in the last plan.
    pub locked_names: Gauge,
    /// Writes of the configuration, by outcome.
    pub writes: Family<OutcomeLabels, Counter>,
    /// 1 once the configuration is confirmed to say what this instance computes, 0 before
    /// and after a failed write; a series only where this instance keeps the configuration.
    pub current: Family<ConfigurationLabels, Gauge>,
    /// Writes that put back what another writer had changed in the configuration.
    pub undone: Counter,
}

impl RegistrationMetrics {
    /// Registers the metrics under `registration_*`.
    pub fn register(&self, registry: &mut Registry) {
        registry.register(
            "registration_narrowed",
            "1 while the webhook configuration is narrowed to the locked names, 0 while it is broad",
            self.narrowed.clone(),
        );
        registry.register(
            "registration_locked_names",
            "Live locks the webhook configuration was computed from",
            self.locked_names.clone(),
        );
        registry.register(
            "registration_writes",
            "Writes of the webhook configuration, by outcome",
            self.writes.clone(),
        );
        registry.register(
            "registration_current",
            "1 once the webhook configuration is confirmed to say what this instance computes, 0 before and after a failed write",
            self.current.clone(),
        );
        registry.register(
            "registration_undone",
            "Writes of the webhook configuration that put back what another writer had changed",
            self.undone.clone(),
        );
        for outcome in ["written", "conflict", "forbidden", "missing", "error"] {
            let _ = self.writes.get_or_create(&OutcomeLabels { outcome });
        }
    }
}

/// All metrics and their registry.
#[derive(Debug)]
pub struct Metrics {
    registry: Registry,
    pub admission: AdmissionMetrics,
    /// The Kubernetes lock source.
    pub source: SourceMetrics,
    /// Locks known by scope, refreshed at scrape time.
    pub locks: Family<ScopeLabels, Gauge>,
    /// Serving certificate expiry, refreshed at scrape time.
    pub certificate_expiry: Gauge,
    /// Requests refused before admission (not an AdmissionReview).
    pub invalid: Counter,
    /// Lock status writes and refusal events.
    pub enforcement: EnforcementMetrics,
    pub registration: RegistrationMetrics,
}

impl Default for Metrics {
    fn default() -> Self {
        Metrics::new()
    }
}

impl Metrics {
    pub fn new() -> Metrics {
        let mut registry = Registry::with_prefix("kube_object_lock");
        let admission = AdmissionMetrics::default();
        let source = SourceMetrics::default();
        let locks = Family::<ScopeLabels, Gauge>::default();
        let certificate_expiry = Gauge::default();
        let invalid = Counter::default();
        let build = Family::<BuildLabels, Gauge>::default();
        build
            .get_or_create(&BuildLabels {
                version: env!("CARGO_PKG_VERSION"),
            })
            .set(1);
        registry.register(
            "admission_requests",
            "Admission requests answered, by operation and decision",
            admission.requests.clone(),
        );
        registry.register(
            "admission_duration_seconds",
            "Time to answer an admission request, body received to answer encoded",
            admission.duration.clone(),
        );
        for reason in ["timeout", "forbidden", "api"] {
            for decision in ["deny", "allow"] {
                let _ = (admission.lookup_errors)
                    .get_or_create(&LookupErrorLabels { reason, decision });
            }
        }
        registry.register(
            "lookup_errors",
            "Lock lookups that failed, by reason and the on_lookup_error decision they caused",
            admission.lookup_errors.clone(),
        );
        registry.register(
            "label_reads",
            "Reads of the labels of evicted pods and scaled objects for selector locks, by outcome",
            admission.label_reads.clone(),
        );
        registry.register(
            "invalid_requests",
            "Requests to /validate answered 4xx because they were not a usable AdmissionReview",
            invalid.clone(),
        );
        registry.register(
            "cache_requests",
            "Lock lookups answered from the cache (hit) or needing a load (miss)",
            source.cache_requests.clone(),
        );
        registry.register(
            "cache_loads",
            "Namespace loads into the lock cache (one LIST each; concurrent misses share one)",
            source.cache_loads.clone(),
        );
        registry.register(
            "api_requests",
            "Requests to the Kubernetes API made by lookups, by verb, resource and outcome",
            source.api_requests.clone(),
        );
        registry.register(
            "watch_restarts",
            "Lock watch failures (restarted with backoff) and re-lists, by kind",
            source.watch_restarts.clone(),
        );
        registry.register(
            "watch_events",
            "Lock watch events received, by kind",
            source.watch_events.clone(),
        );
        registry.register(
            "lock_source_mode",
            "1 for the mode lookups of each lock kind are in: watch (from the index) or fallback (LIST through the cache)",
            source.mode.clone(),
        );
        registry.register(
            "lock_source_mode_since_timestamp_seconds",
            "When each lock kind entered its current mode (Unix time)",
            source.mode_since.clone(),
        );
        registry.register(
            "unparseable_locks",
            "Locks whose spec cannot be read; each fails closed on its own name until fixed",
            source.unparseable_locks.clone(),
        );
        registry.register("locks", "Locks known, by scope", locks.clone());
        registry.register(
            "certificate_expiry_timestamp_seconds",
            "End of validity of the serving certificate (Unix time)",
            certificate_expiry.clone(),
        );
        registry.register("build_info", "Build information", build);
        let enforcement = EnforcementMetrics::registered(&mut registry);
        let registration = RegistrationMetrics::default();
        registration.register(&mut registry);
        Metrics {
            enforcement,
            registry,
            admission,
            source,
            locks,
            certificate_expiry,
            invalid,
            registration,
        }
    }

    pub fn encode(&self) -> String {
        let mut out = String::new();
        // Writing into a String cannot fail.
        let _ = prometheus_client::encoding::text::encode(&mut out, &self.registry);
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_carry_the_prefix_and_bounded_labels() {
        let metrics = Metrics::new();
        metrics
            .admission
            .observe("DELETE", Decision::denied, Duration::from_micros(300));
        metrics.source.cache_loads.inc();
        let text = metrics.encode();
        assert!(text.contains(
            "kube_object_lock_admission_requests_total{operation=\"DELETE\",decision=\"denied\"} 1"
        ), "{text}");
        assert!(
            text.contains("kube_object_lock_admission_duration_seconds_bucket{le=\"0.0004\"} 1"),
            "{text}"
        );
        assert!(
            text.contains("kube_object_lock_cache_loads_total 1"),
            "{text}"
        );
        assert!(
            text.contains("kube_object_lock_build_info{version=\""),
            "{text}"
        );
        for line in text.lines().filter(|l| !l.starts_with('#')) {
            assert!(line.starts_with("kube_object_lock_"), "{line}");
        }
    }

    /// The failure counters alerts watch are there at 0 before anything fails, so that the first
    /// failure is an increase; the registration's state only once a writer sets it.
    #[test]
    fn failure_counters_start_at_zero() {
        let text = Metrics::new().encode();
        for series in [
            "kube_object_lock_lookup_errors_total{reason=\"timeout\",decision=\"deny\"} 0",
            "kube_object_lock_lookup_errors_total{reason=\"api\",decision=\"allow\"} 0",
            "kube_object_lock_status_writes_total{outcome=\"error\"} 0",
            "kube_object_lock_event_writes_total{verb=\"create\",outcome=\"failure\"} 0",
            "kube_object_lock_registration_writes_total{outcome=\"conflict\"} 0",
            "kube_object_lock_registration_undone_total 0",
        ] {
            assert!(text.contains(series), "{series} in {text}");
        }
        assert!(
            !text.contains("kube_object_lock_registration_current{"),
            "{text}"
        );
    }

    /// The counters kept at hand count into the family's series, each into its own, also
    /// through a clone of the metrics, and a series appears only once it has counted.
    #[test]
    fn kept_counters_count_into_their_series() {
        let metrics = Metrics::new();
        let clone = metrics.admission.clone();
        let took = Duration::from_micros(50);
        for _ in 0..3 {
            metrics.admission.observe("UPDATE", Decision::allowed, took);
        }
        clone.observe("UPDATE", Decision::allowed, took);
        clone.observe("DELETE", Decision::warned, took);
        // An operation not kept at hand still counts, through the family.
        clone.observe("PATCH", Decision::error, took);
        let text = metrics.encode();
        for series in [
            "{operation=\"UPDATE\",decision=\"allowed\"} 4",
            "{operation=\"DELETE\",decision=\"warned\"} 1",
            "{operation=\"PATCH\",decision=\"error\"} 1",
        ] {
            let line = format!("kube_object_lock_admission_requests_total{series}");
            assert!(text.contains(&line), "{line} in {text}");
        }
        assert!(
            !text.contains("decision=\"denied\""),
            "no series before it counts: {text}"
        );
    }
}
