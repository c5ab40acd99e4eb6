//! From request bytes to response bytes: parse, triage, read the locks, decide, answer. A body
//! with no request to answer (no uid to echo) is a [`ReviewError`] (a 400); everything else gets
//! an AdmissionReview with its uid, in its `apiVersion`, even when the locks cannot be read.

use std::sync::Arc;
use std::time::{Duration, Instant};

use k8s_openapi::jiff::Timestamp;
use tracing::{debug, info, warn};

use super::changes::Objects;
use super::decide::{self, Outcome, Triage, Verdict};
use super::labels::{LabelError, LabelReader, Labels, NoCluster, Target};
use super::refusals::EventSink;
use super::request::{
    ADMISSION_V1, ADMISSION_V1BETA1, AdmissionRequest, IncomingReview, ParsedReview, Resource,
};
use super::response::{ReviewAnswer, respond};
use crate::fieldpath::FieldPath;
use crate::locks::{LockSet, LockSource, LookupError};
use crate::metrics::{AdmissionMetrics, Decision, LabelReadLabels, LookupErrorLabels};
use crate::settings::ReviewPolicy;

/// Why a body could not be answered with an AdmissionReview.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum ReviewError {
    #[error("empty body: expected an AdmissionReview")]
    Empty,
    #[error("malformed AdmissionReview: {0}")]
    Malformed(String),
    #[error("kind is {0:?}, expected \"AdmissionReview\"")]
    WrongKind(String),
    #[error("apiVersion is {0:?}, expected \"admission.k8s.io/v1\" (or v1beta1)")]
    WrongVersion(String),
    #[error("the AdmissionReview has no request")]
    NoRequest,
    #[error("request.uid is empty")]
    NoUid,
}

/// Parses an AdmissionReview, reading only what the decision needs (borrowed from `body`).
pub fn parse(body: &[u8]) -> Result<ParsedReview<'_>, ReviewError> {
    if body.iter().all(u8::is_ascii_whitespace) {
        return Err(ReviewError::Empty);
    }
    // Only a body that fails is parsed again, to name the field (tracking the path costs a
    // third of a parse).
    let review: IncomingReview =
        serde_json::from_slice(body).map_err(|_| describe_parse_error(body))?;
    if review.kind != "AdmissionReview" {
        return Err(ReviewError::WrongKind(review.kind.into_owned()));
    }
    let api_version = match &*review.api_version {
        ADMISSION_V1 => ADMISSION_V1,
        ADMISSION_V1BETA1 => ADMISSION_V1BETA1,
        _ => return Err(ReviewError::WrongVersion(review.api_version.into_owned())),
    };
    let request = review.request.ok_or(ReviewError::NoRequest)?;
    if request.uid.is_empty() {
        return Err(ReviewError::NoUid);
    }
    Ok(ParsedReview {
        api_version,
        request,
    })
}

/// The error of a body that does not parse, naming the field where it went wrong.
fn describe_parse_error(body: &[u8]) -> ReviewError {
    let mut de = serde_json::Deserializer::from_slice(body);
    let result: Result<IncomingReview, _> = serde_path_to_error::deserialize(&mut de);
    let error = match result {
        Ok(_) => match de.end() {
            Ok(()) => return ReviewError::Malformed("invalid JSON".to_owned()),
            Err(e) => return ReviewError::Malformed(e.to_string()),
        },
        Err(e) => e,
    };
    let path = error.path().to_string();
    let inner = error.into_inner();
    if path == "." || path.is_empty() {
        ReviewError::Malformed(inner.to_string())
    } else {
        ReviewError::Malformed(format!("{path}: {inner}"))
    }
}

/// A lookup's locks: those of its scope and, for a Namespace DELETE, the namespace's own.
type ReadLocks = (Arc<LockSet>, Option<Arc<LockSet>>);

/// Answers AdmissionReviews from a lock source.
#[derive(Clone)]
pub struct Reviewer {
    source: Arc<dyn LockSource>,
    labels: Arc<dyn LabelReader>,
    policy: ReviewPolicy,
    metrics: AdmissionMetrics,
    events: Option<EventSink>,
}

/// A review's answer, and what it was, for logs and metrics.
#[derive(Debug)]
pub struct Answer {
    pub review: ReviewAnswer,
    pub outcome: Outcome,
}

impl Reviewer {
    pub fn new(source: Arc<dyn LockSource>, policy: ReviewPolicy) -> Self {
        Reviewer {
            source,
            labels: Arc::new(NoCluster),
            policy,
            metrics: AdmissionMetrics::default(),
            events: None,
        }
    }

    pub fn with_metrics(mut self, metrics: AdmissionMetrics) -> Self {
        self.metrics = metrics;
        self
    }

    /// Reads the labels an eviction or a scale does not carry through `reader` (without one,
    /// they cannot be read and `on_lookup_error` decides for the selector Locks needing them).
    pub fn with_labels(mut self, reader: Arc<dyn LabelReader>) -> Self {
        self.labels = reader;
        self
    }

    /// Records refusals (and Warn-mode matches) as Kubernetes Events through `sink`.
    pub fn with_events(mut self, sink: EventSink) -> Self {
        self.events = Some(sink);
        self
    }

    pub fn source(&self) -> &Arc<dyn LockSource> {
        &self.source
    }

    /// Answers one review. `deadline` is the API server's own timeout (`?timeout=10s`), which
    /// shortens the lookup timeout so the answer arrives while the API server still waits.
    pub async fn review(
        &self,
        body: &[u8],
        deadline: Option<Duration>,
    ) -> Result<Answer, ReviewError> {
        let started = Instant::now();
        let parsed = parse(body)?;
        let req = &parsed.request;
        let verdict = match decide::triage(req) {
            Triage::Allow(why) => {
                debug!(uid = %req.uid, operation = req.operation.as_str(), resource = %req.resource_path(),
                    namespace = req.object_namespace().unwrap_or(""), name = req.object_name().unwrap_or(""),
                    exempt = why.as_str(), "allowed without lookup");
                self.metrics
                    .observe(req.operation.as_str(), Decision::allowed, started.elapsed());
                return Ok(Answer {
                    review: respond(parsed, Verdict::allow()),
                    outcome: Outcome::Allowed,
                });
            }
            Triage::Lookup(lookup) => {
                // Leave the API server a quarter of its own timeout to receive the answer.
                let timeout = match deadline {
                    Some(d) if !d.is_zero() => self.policy.lookup_timeout.min(d * 3 / 4),
                    _ => self.policy.lookup_timeout,
                };
                let left = || timeout.saturating_sub(started.elapsed());
                let read = match self.locks_at_hand(&lookup) {
                    Some(locks) => Ok(locks),
                    // Boxed: the review's future stays small for the answers that never wait.
                    None => Box::pin(self.read(&lookup, timeout)).await,
                };
                let now = Timestamp::now();
                // Only an eviction or a scale that a selector Lock could cover reads labels.
                let target = (read.as_ref().ok())
                    .and_then(|(scope, _)| decide::labels_needed(req, scope, now));
                let labels = match target {
                    Some(target) => Some(Box::pin(self.read_labels(req, target, left())).await),
                    None => None,
                };
                // Only a custom resource's scale that a lock on fields covers reads its CRD.
                let scaled = (read.as_ref().ok())
                    .and_then(|(scope, _)| decide::scaled_field_needed(req, scope, now));
                let scaled = match scaled {
                    Some(resource) => Box::pin(self.read_scaled_field(req, resource, left())).await,
                    None => None,
                };
                let objects = Objects::from_review(body).with_scaled_field(scaled);
                let verdict = self.verdict(req, &lookup, read, labels.as_ref(), &objects, now);
                // Deleting a CRD deletes its objects, in every namespace, without admission.
                match decide::deleted_resource(req) {
                    Some(_) => decide::crd_deletion(
                        req,
                        verdict,
                        self.source.all_at_hand().as_deref(),
                        self.policy.on_lookup_error,
                        now,
                    ),
                    None => verdict,
                }
            }
        };
        let elapsed = started.elapsed();
        log_verdict(req, &verdict, elapsed);
        let decision = match verdict.outcome {
            Outcome::Allowed => Decision::allowed,
            Outcome::Warned => Decision::warned,
            Outcome::Denied => Decision::denied,
            Outcome::Error => Decision::error,
        };
        self.metrics
            .observe(req.operation.as_str(), decision, elapsed);
        let outcome = verdict.outcome;
        Ok(Answer {
            review: respond(parsed, verdict),
            outcome,
        })
    }

    /// The locks a lookup needs, when the source has them at hand (nearly every lookup, from
    /// the watch-fed index): no future, no timer.
    fn locks_at_hand(&self, lookup: &decide::Lookup<'_>) -> Option<ReadLocks> {
        let scope = self.source.locks_at_hand(lookup.scope)?;
        let contents = match lookup.contents_of {
            Some(ns) => Some(self.source.locks_at_hand(ns)?),
            None => None,
        };
        Some((scope, contents))
    }

    fn verdict(
        &self,
        req: &AdmissionRequest<'_>,
        lookup: &decide::Lookup<'_>,
        read: Result<ReadLocks, LookupError>,
        labels: Option<&Labels>,
        objects: &Objects,
        now: Timestamp,
    ) -> Verdict {
        match read {
            Ok((scope, contents)) => {
                let contents = contents.as_deref();
                // The objects are read from the body only if a lock covers the update.
                let labels = labels.map(|labels| (labels, self.policy.on_lookup_error));
                let verdict = decide::decide(req, lookup, &scope, contents, labels, objects, now);
                if let Some(events) = &self.events {
                    events.record_verdict(req, &verdict, &scope, contents);
                }
                verdict
            }
            Err(error) => {
                warn!(uid = %req.uid, operation = req.operation.as_str(), resource = %req.resource_path(),
                    namespace = req.object_namespace().unwrap_or(""), name = %lookup.name,
                    policy = ?self.policy.on_lookup_error, %error, "lock lookup failed");
                let verdict =
                    decide::decide_unreadable(req, lookup, self.policy.on_lookup_error, &error);
                let labels = LookupErrorLabels {
                    reason: match error {
                        LookupError::Timeout(_) => "timeout",
                        LookupError::Forbidden { .. } => "forbidden",
                        LookupError::Api { .. } => "api",
                    },
                    decision: if verdict.allowed() { "allow" } else { "deny" },
                };
                self.metrics.lookup_errors.get_or_create(&labels).inc();
                verdict
            }
        }
    }

    async fn read_labels(
        &self,
        req: &AdmissionRequest<'_>,
        target: Target<'_>,
        timeout: Duration,
    ) -> Labels {
        let read = tokio::time::timeout(timeout, self.labels.labels(&target)).await;
        let labels = match read {
            Ok(Ok(Some(labels))) => Labels::Read(labels),
            Ok(Ok(None)) => Labels::Gone,
            Ok(Err(error)) => Labels::Unreadable(error),
            Err(_) => Labels::Unreadable(LabelError::Timeout(timeout)),
        };
        let outcome = match &labels {
            Labels::Read(_) => "read",
            Labels::Gone => "not_found",
            Labels::Unreadable(error) => error.reason(),
        };
        let counted = LabelReadLabels { outcome };
        self.metrics.label_reads.get_or_create(&counted).inc();
        match &labels {
            Labels::Unreadable(error) => {
                warn!(uid = %req.uid, operation = req.operation.as_str(), resource = %req.resource_path(),
                    object = %target, %error, "cannot read the labels a selector lock needs")
            }
            _ => {
                debug!(uid = %req.uid, object = %target, outcome, "read labels for selector locks")
            }
        }
        labels
    }

    /// The field `resource`'s scale writes, from its CRD, read within `timeout`; `None` when it
    /// cannot be read (every lock covering the scale then freezes it), said in a warning.
    async fn read_scaled_field(
        &self,
        req: &AdmissionRequest<'_>,
        resource: &Resource<'_>,
        timeout: Duration,
    ) -> Option<FieldPath> {
        let read = tokio::time::timeout(timeout, self.labels.scaled_field(resource)).await;
        let error = match read {
            Ok(Ok(Some(path))) => match FieldPath::parse(path.trim_start_matches('.')) {
                Ok(field) => return Some(field),
                Err(e) => format!("its specReplicasPath {path:?} does not read: {e}"),
            },
            Ok(Ok(None)) => "it has no scale subresource at this version".to_owned(),
            Ok(Err(error)) => error.to_string(),
            Err(_) => LabelError::Timeout(timeout).to_string(),
        };
        warn!(uid = %req.uid, resource = %req.resource_path(), %error,
            "cannot read which field the scale writes from the CRD: every lock covering the scale refuses a change of replicas");
        None
    }

    async fn read(
        &self,
        lookup: &decide::Lookup<'_>,
        timeout: Duration,
    ) -> Result<ReadLocks, LookupError> {
        let work = async {
            let scope = self.source.locks(lookup.scope);
            match &lookup.contents_of {
                Some(ns) => {
                    let (scope, contents) = futures::try_join!(scope, self.source.locks(ns))?;
                    Ok((scope, Some(contents)))
                }
                None => Ok((scope.await?, None)),
            }
        };
        tokio::time::timeout(timeout, work)
            .await
            .map_err(|_| LookupError::Timeout(timeout))?
    }
}

fn log_verdict(req: &AdmissionRequest, verdict: &Verdict, elapsed: Duration) {
    // The fields below are built only for a line that is written.
    let written = if verdict.outcome == Outcome::Denied {
        tracing::enabled!(tracing::Level::INFO)
    } else {
        tracing::enabled!(tracing::Level::DEBUG)
    };
    if !written {
        return;
    }
    let namespace = req.object_namespace().unwrap_or("");
    let name = req.object_name().unwrap_or("");
    let locks = decide::join(&verdict.locks, ",");
    if verdict.outcome == Outcome::Denied {
        let changed = decide::join(verdict.changed.iter().map(|(_, path)| path), ",");
        info!(uid = %req.uid, operation = req.operation.as_str(), resource = %req.resource_path(),
            %namespace, %name, user = %req.user_info.username, lock = %locks, %changed,
            dry_run = req.dry_run.unwrap_or(false), "denied");
    } else {
        debug!(uid = %req.uid, operation = req.operation.as_str(), resource = %req.resource_path(),
            %namespace, %name, user = %req.user_info.username, outcome = verdict.outcome.as_str(),
            lock = %locks, elapsed_us = elapsed.as_micros() as u64, "decided");
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parse_rejects_what_cannot_be_answered() {
        let cases: &[(&str, ReviewError)] = &[
            ("", ReviewError::Empty),
            ("  \n", ReviewError::Empty),
            (
                r#"{"kind":"Pod","apiVersion":"admission.k8s.io/v1"}"#,
                ReviewError::WrongKind("Pod".into()),
            ),
            (
                r#"{"kind":"AdmissionReview","apiVersion":"admission.k8s.io/v2"}"#,
                ReviewError::WrongVersion("admission.k8s.io/v2".into()),
            ),
            (
                r#"{"kind":"AdmissionReview","apiVersion":"admission.k8s.io/v1"}"#,
                ReviewError::NoRequest,
            ),
        ];
        for (body, expected) in cases {
            assert_eq!(&parse(body.as_bytes()).expect_err(body), expected, "{body}");
        }
    }

    #[test]
    fn parse_names_the_bad_field() {
        let body = r#"{"kind":"AdmissionReview","apiVersion":"admission.k8s.io/v1","request":{"uid":"x","resource":{"group":"","version":"v1","resource":"pods"},"operation":"PATCH","userInfo":{}}}"#;
        let ReviewError::Malformed(message) = parse(body.as_bytes()).expect_err("bad op") else {
            panic!("expected Malformed")
        };
        assert!(
            message.starts_with("request.operation: unknown variant `PATCH`"),
            "{message}"
        );
        let ReviewError::Malformed(message) = parse(b"{\"kind\": 5}").expect_err("bad kind") else {
            panic!("expected Malformed")
        };
        assert!(
            message.starts_with("kind: invalid type: integer `5`"),
            "{message}"
        );
        assert!(matches!(
            parse(b"{} trailing"),
            Err(ReviewError::Malformed(_))
        ));
    }

    #[test]
    fn denial_response_has_code_reason_and_uid() {
        let body = br#"{"kind":"AdmissionReview","apiVersion":"admission.k8s.io/v1beta1","request":{"uid":"abc","resource":{"group":"","version":"v1","resource":"pods"},"operation":"DELETE","userInfo":{}}}"#;
        let parsed = parse(body).expect("valid");
        let verdict = Verdict {
            refusal: Some(decide::Refusal {
                code: 403,
                reason: "Forbidden",
                message: "locked".into(),
            }),
            warnings: vec!["w".into()],
            audit_annotations: [("lock".to_owned(), "Lock a/b".to_owned())].into(),
            outcome: Outcome::Denied,
            ..Verdict::allow()
        };
        let json = serde_json::to_value(respond(parsed, verdict)).expect("serializes");
        assert_eq!(
            json,
            serde_json::json!({
                "apiVersion": "admission.k8s.io/v1beta1",
                "kind": "AdmissionReview",
                "response": {
                    "uid": "abc",
                    "allowed": false,
                    "status": {"status": "Failure", "code": 403, "reason": "Forbidden", "message": "locked"},
                    "auditAnnotations": {"lock": "Lock a/b"},
                    "warnings": ["w"],
                }
            })
        );
    }

    /// The answer serializes as kube's `AdmissionReview` does, for every kind of verdict.
    #[test]
    fn answers_serialize_as_kube_admission_reviews() {
        use kube::core::admission::{AdmissionResponse, AdmissionReview};
        use kube::core::{DynamicObject, Status, TypeMeta};

        let kube_answer = |parsed: &ParsedReview, verdict: &Verdict| {
            let mut response = AdmissionResponse::invalid("");
            response.types = TypeMeta {
                api_version: parsed.api_version.to_owned(),
                kind: "AdmissionReview".to_owned(),
            };
            response.uid = parsed.request.uid.to_string();
            response.allowed = verdict.allowed();
            response.result = match &verdict.refusal {
                Some(r) => Status::failure(&r.message, r.reason).with_code(r.code),
                None => Status::default(),
            };
            response.audit_annotations = verdict.audit_annotations.clone().into_iter().collect();
            response.warnings = (!verdict.warnings.is_empty()).then(|| verdict.warnings.clone());
            let review: AdmissionReview<DynamicObject> = response.into_review();
            serde_json::to_value(review).expect("serializes")
        };
        let refused = Verdict {
            refusal: Some(decide::Refusal {
                code: 503,
                reason: "ServiceUnavailable",
                message: "cannot read locks".into(),
            }),
            outcome: Outcome::Error,
            ..Verdict::allow()
        };
        let warned = Verdict {
            warnings: vec!["one".into(), "two".into()],
            audit_annotations: [
                ("a".to_owned(), "1".to_owned()),
                ("b".to_owned(), "2".to_owned()),
            ]
            .into(),
            outcome: Outcome::Warned,
            ..Verdict::allow()
        };
        for version in [ADMISSION_V1, ADMISSION_V1BETA1] {
            let body = format!(
                r#"{{"kind":"AdmissionReview","apiVersion":"{version}","request":{{"uid":"u-1","resource":{{"group":"","version":"v1","resource":"pods"}},"operation":"DELETE","userInfo":{{}}}}}}"#
            );
            let parsed = parse(body.as_bytes()).expect("valid");
            for verdict in [Verdict::allow(), refused.clone(), warned.clone()] {
                let expected = kube_answer(&parsed, &verdict);
                let answer = respond(parsed.clone(), verdict);
                assert_eq!(serde_json::to_value(&answer).expect("serializes"), expected);
            }
        }
    }
}
