//! Prometheus metrics (`kube_object_lock_*`), served in the text format with the probes on a
//! separate plain-HTTP listener. Invariant: label values come from small fixed sets, except the
//! few that name locks (`unparseable_locks`, `refusals`); the counters alerts watch for failures
//! start at 0, so that the first failure is an increase.

use std::sync::{Arc, OnceLock};
use std::time::Duration;

use prometheus_client::encoding::{EncodeLabelSet, EncodeLabelValue};
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::Histogram;
use prometheus_client::registry::Registry;

#[derive(Clone, Copy, Debug, Hash, PartialEq, Eq, EncodeLabelValue)]
#[allow(non_camel_case_types)]
pub enum Decision {
    allowed,
    warned,
    denied,
    error,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct AdmissionLabels {
    /// CREATE, UPDATE, DELETE or CONNECT. (Requests that are not an AdmissionReview are
    /// counted in `invalid_requests` instead.)
    pub operation: &'static str,
    /// The decision.
    pub decision: Decision,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct LookupErrorLabels {
    /// `timeout`, `forbidden` or `api`.
    pub reason: &'static str,
    /// What `on_lookup_error` answered: `deny` or `allow`.
    pub decision: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct LabelReadLabels {
    /// `read`, `not_found`, `timeout`, `forbidden`, `api`, `connection` or `no_cluster`.
    pub outcome: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ApiLabels {
    /// `list`.
    pub verb: &'static str,
    /// `locks` or `clusterlocks`.
    pub resource: &'static str,
    /// `success`, or the error class (`forbidden`, `server_error`, `client_error`, `connection`).
    pub outcome: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct KindLabels {
    /// `Lock` or `ClusterLock`.
    pub kind: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ModeLabels {
    /// `Lock` or `ClusterLock`.
    pub kind: &'static str,
    /// `watch` (answered from the index) or `fallback` (LIST through the cache).
    pub mode: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct LockLabels {
    /// `Lock` or `ClusterLock`.
    pub kind: &'static str,
    /// The Lock's namespace (empty for a ClusterLock).
    pub namespace: String,
    /// The lock's name.
    pub name: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct CacheLabels {
    /// `hit` or `miss`.
    pub result: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ScopeLabels {
    /// `namespaced` or `cluster`.
    pub scope: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct BuildLabels {
    /// The crate version.
    pub version: &'static str,
}

const OPERATIONS: [&str; 4] = ["CREATE", "UPDATE", "DELETE", "CONNECT"];
const DECISIONS: usize = Decision::error as usize + 1;

#[derive(Clone, Debug)]
pub struct AdmissionMetrics {
    pub requests: Family<AdmissionLabels, Counter>,
    pub duration: Histogram,
    pub lookup_errors: Family<LookupErrorLabels, Counter>,
    pub label_reads: Family<LabelReadLabels, Counter>,
    // The counters of `requests`, each looked up once (a family lookup hashes and locks).
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

#[derive(Clone, Debug, Default)]
pub struct SourceMetrics {
    pub cache_requests: Family<CacheLabels, Counter>,
    pub cache_loads: Counter,
    pub api_requests: Family<ApiLabels, Counter>,
    pub watch_restarts: Family<KindLabels, Counter>,
    pub watch_events: Family<KindLabels, Counter>,
    pub mode: Family<ModeLabels, Gauge>,
    pub mode_since: Family<KindLabels, Gauge>,
    pub unparseable_locks: Family<LockLabels, Gauge>,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct OutcomeLabels {
    /// `success` (status) or `written` (registration), or the failure (`forbidden`,
    /// `not_found`, `missing`, `conflict`, `error`).
    pub outcome: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct EventLabels {
    /// `Blocked` or `WouldBlock`.
    pub reason: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct RefusalLabels {
    /// `Blocked` or `WouldBlock`.
    pub reason: &'static str,
    /// The lock's namespace (empty for a ClusterLock).
    pub namespace: String,
    /// The lock's name.
    pub name: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct DropLabels {
    /// `queue_full`, `series_limit` or `write_failed`.
    pub cause: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct EventWriteLabels {
    /// `create` or `patch`.
    pub verb: &'static str,
    /// `success` or `failure`.
    pub outcome: &'static str,
}

#[derive(Clone, Debug, Default)]
pub struct EnforcementMetrics {
    pub status_writes: Family<OutcomeLabels, Counter>,
    pub refusal_events: Family<EventLabels, Counter>,
    pub refusal_events_dropped: Family<DropLabels, Counter>,
    pub refusals: Family<RefusalLabels, Counter>,
    pub event_writes: Family<EventWriteLabels, Counter>,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ConfigurationLabels {
    /// The ValidatingWebhookConfiguration's name.
    pub name: String,
}

#[derive(Clone, Debug, Default)]
pub struct RegistrationMetrics {
    pub narrowed: Gauge,
    pub locked_names: Gauge,
    pub writes: Family<OutcomeLabels, Counter>,
    pub current: Family<ConfigurationLabels, Gauge>,
    pub undone: Counter,
}

#[derive(Debug)]
pub struct Metrics {
    registry: Registry,
    pub admission: AdmissionMetrics,
    pub source: SourceMetrics,
    pub locks: Family<ScopeLabels, Gauge>,
    pub certificate_expiry: Gauge,
    pub invalid: Counter,
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
        let m = Metrics {
            registry: Registry::default(),
            admission: AdmissionMetrics::default(),
            source: SourceMetrics::default(),
            locks: Family::default(),
            certificate_expiry: Gauge::default(),
            invalid: Counter::default(),
            enforcement: EnforcementMetrics::default(),
            registration: RegistrationMetrics::default(),
        };
        let build = Family::<BuildLabels, Gauge>::default();
        build
            .get_or_create(&BuildLabels {
                version: env!("CARGO_PKG_VERSION"),
            })
            .set(1);
        let (a, s, e, r) = (&m.admission, &m.source, &m.enforcement, &m.registration);
        macro_rules! register {
            ($($name:literal, $help:literal, $metric:expr;)*) => {
                $(registry.register($name, $help, $metric.clone());)*
            };
        }
        register! {
            "admission_requests", "Admission requests answered, by operation and decision", a.requests;
            "admission_duration_seconds", "Time to answer an admission request, body received to answer encoded", a.duration;
            "lookup_errors", "Lock lookups that failed, by reason and the on_lookup_error decision they caused", a.lookup_errors;
            "label_reads", "Reads of the labels of evicted pods and scaled objects for selector locks, by outcome", a.label_reads;
            "invalid_requests", "Requests to /validate answered 4xx because they were not a usable AdmissionReview", m.invalid;
            "cache_requests", "Lock lookups answered from the cache (hit) or needing a load (miss)", s.cache_requests;
            "cache_loads", "Namespace loads into the lock cache (one LIST each; concurrent misses share one)", s.cache_loads;
            "api_requests", "Requests to the Kubernetes API made by lookups, by verb, resource and outcome", s.api_requests;
            "watch_restarts", "Lock watch failures (restarted with backoff) and re-lists, by kind", s.watch_restarts;
            "watch_events", "Lock watch events received, by kind", s.watch_events;
            "lock_source_mode", "1 for the mode lookups of each lock kind are in: watch (from the index) or fallback (LIST through the cache)", s.mode;
            "lock_source_mode_since_timestamp_seconds", "When each lock kind entered its current mode (Unix time)", s.mode_since;
            "unparseable_locks", "Locks whose spec cannot be read; each fails closed on its own name until fixed", s.unparseable_locks;
            "locks", "Locks known, by scope", m.locks;
            "certificate_expiry_timestamp_seconds", "End of validity of the serving certificate (Unix time)", m.certificate_expiry;
            "build_info", "Build information", build;
            "status_writes", "Lock status writes (server-side apply of this instance's entry), by outcome", e.status_writes;
            "refusal_events", "Refusals (Blocked) and Warn-mode matches (WouldBlock) queued for a Kubernetes Event", e.refusal_events;
            "refusal_events_dropped", "Refusals left out of events, by cause (queue_full, series_limit, write_failed)", e.refusal_events_dropped;
            "refusals", "Refusals (Blocked) and Warn-mode matches (WouldBlock), by reason and lock", e.refusals;
            "event_writes", "Kubernetes Event writes (create a series, patch its count), by verb and outcome", e.event_writes;
            "registration_narrowed", "1 while the webhook configuration is narrowed to the locked names, 0 while it is broad", r.narrowed;
            "registration_locked_names", "Live locks the webhook configuration was computed from", r.locked_names;
            "registration_writes", "Writes of the webhook configuration, by outcome", r.writes;
            "registration_current", "1 once the webhook configuration is confirmed to say what this instance computes, 0 before and after a failed write", r.current;
            "registration_undone", "Writes of the webhook configuration that put back what another writer had changed", r.undone;
        }
        // Failure series present at 0 from the start, so that an alert sees the first as an increase.
        for (reason, decision) in ["timeout", "forbidden", "api"]
            .into_iter()
            .flat_map(|r| [(r, "deny"), (r, "allow")])
        {
            let _ = a
                .lookup_errors
                .get_or_create(&LookupErrorLabels { reason, decision });
        }
        for outcome in ["success", "forbidden", "not_found", "conflict", "error"] {
            let _ = e.status_writes.get_or_create(&OutcomeLabels { outcome });
        }
        for (verb, outcome) in [
            ("create", "success"),
            ("create", "failure"),
            ("patch", "success"),
            ("patch", "failure"),
        ] {
            let _ = e
                .event_writes
                .get_or_create(&EventWriteLabels { verb, outcome });
        }
        for cause in ["queue_full", "series_limit", "write_failed"] {
            let _ = e
                .refusal_events_dropped
                .get_or_create(&DropLabels { cause });
        }
        for outcome in ["written", "conflict", "forbidden", "missing", "error"] {
            let _ = r.writes.get_or_create(&OutcomeLabels { outcome });
        }
        Metrics { registry, ..m }
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
