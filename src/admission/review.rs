//! From request bytes to response bytes: parse the AdmissionReview, plan, read the locks, decide,
//! answer.
//!
//! A body that is not an AdmissionReview with a `request` cannot be answered (there is no uid to
//! echo), so it is a [`ReviewError`] that the HTTP layer turns into a 400. Everything else gets an
//! AdmissionReview carrying the request's uid, in the request's `apiVersion`, even when the locks
//! cannot be read.

use std::sync::Arc;
use std::time::{Duration, Instant};

use k8s_openapi::jiff::Timestamp;
use kube::core::Status;
use kube::core::admission::{AdmissionResponse, AdmissionReview};
use kube::core::{DynamicObject, TypeMeta};
use serde::Deserialize;
use tracing::{debug, info, warn};

use super::decide::{self, OnLookupError, Outcome, Plan, Verdict};
use super::request::{ADMISSION_V1, ADMISSION_V1BETA1, AdmissionRequest};
use crate::events::EventSink;
use crate::locks::{LockSet, LockSource, LookupError};
use crate::metrics::{AdmissionMetrics, Decision, LookupErrorLabels};

/// Why a body could not be answered with an AdmissionReview.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum ReviewError {
    /// The body is empty.
    #[error("empty body: expected an AdmissionReview")]
    Empty,
    /// The body is not JSON of the expected shape.
    #[error("malformed AdmissionReview: {0}")]
    Malformed(String),
    /// `kind` is not `AdmissionReview`.
    #[error("kind is {0:?}, expected \"AdmissionReview\"")]
    WrongKind(String),
    /// `apiVersion` is not one the webhook speaks.
    #[error("apiVersion is {0:?}, expected \"admission.k8s.io/v1\" (or v1beta1)")]
    WrongVersion(String),
    /// There is no `request` to answer (a response was sent, or nothing).
    #[error("the AdmissionReview has no request")]
    NoRequest,
    /// `request.uid` is empty, so no answer could be matched to it.
    #[error("request.uid is empty")]
    NoUid,
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct IncomingReview {
    #[serde(default)]
    api_version: String,
    #[serde(default)]
    kind: String,
    #[serde(default)]
    request: Option<AdmissionRequest>,
}

/// A parsed review: the request and the version to answer in.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ParsedReview {
    /// `admission.k8s.io/v1` or `admission.k8s.io/v1beta1`.
    pub api_version: &'static str,
    /// The request.
    pub request: AdmissionRequest,
}

/// Parses an AdmissionReview, reading only what the decision needs.
pub fn parse(body: &[u8]) -> Result<ParsedReview, ReviewError> {
    if body.iter().all(u8::is_ascii_whitespace) {
        return Err(ReviewError::Empty);
    }
    // The fast path is plain serde_json; only a body that fails is parsed again to name the
    // field, since tracking the path costs a third of every parse.
    let review: IncomingReview = match serde_json::from_slice(body) {
        Ok(review) => review,
        Err(_) => return Err(describe_parse_error(body)),
    };
    if review.kind != "AdmissionReview" {
        return Err(ReviewError::WrongKind(review.kind));
    }
    let api_version = match review.api_version.as_str() {
        ADMISSION_V1 => ADMISSION_V1,
        ADMISSION_V1BETA1 => ADMISSION_V1BETA1,
        _ => return Err(ReviewError::WrongVersion(review.api_version)),
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

/// The response AdmissionReview for a verdict.
pub fn respond(review: &ParsedReview, verdict: &Verdict) -> AdmissionReview<DynamicObject> {
    let mut response = AdmissionResponse::invalid("");
    response.types = TypeMeta {
        api_version: review.api_version.to_owned(),
        kind: "AdmissionReview".to_owned(),
    };
    response.uid = review.request.uid.clone();
    response.allowed = verdict.allowed();
    response.result = match &verdict.refusal {
        Some(refusal) => Status::failure(&refusal.message, refusal.reason).with_code(refusal.code),
        None => Status::default(),
    };
    response.audit_annotations = verdict
        .audit_annotations
        .iter()
        .map(|(k, v)| (k.clone(), v.clone()))
        .collect();
    response.warnings = (!verdict.warnings.is_empty()).then(|| verdict.warnings.clone());
    response.into_review()
}

/// The settings the review path needs.
#[derive(Debug, Clone, Copy)]
pub struct ReviewPolicy {
    /// What to do when the locks cannot be read.
    pub on_lookup_error: OnLookupError,
    /// The longest a lock lookup may take.
    pub lookup_timeout: Duration,
}

/// Answers AdmissionReviews from a lock source.
#[derive(Clone)]
pub struct Reviewer {
    source: Arc<dyn LockSource>,
    policy: ReviewPolicy,
    metrics: AdmissionMetrics,
    events: Option<EventSink>,
}

/// A review's answer, and what it was, for logs and metrics.
#[derive(Debug)]
pub struct Answer {
    /// The response to send.
    pub review: AdmissionReview<DynamicObject>,
    /// What the answer was.
    pub outcome: Outcome,
}

impl Reviewer {
    /// A reviewer reading locks from `source`.
    pub fn new(source: Arc<dyn LockSource>, policy: ReviewPolicy) -> Self {
        Reviewer::with_metrics(source, policy, AdmissionMetrics::default())
    }

    /// Like [`Reviewer::new`], counting into `metrics`.
    pub fn with_metrics(
        source: Arc<dyn LockSource>,
        policy: ReviewPolicy,
        metrics: AdmissionMetrics,
    ) -> Self {
        Reviewer {
            source,
            policy,
            metrics,
            events: None,
        }
    }

    /// Records refusals (and Warn-mode matches) as Kubernetes Events through `sink`.
    pub fn with_events(mut self, sink: EventSink) -> Self {
        self.events = Some(sink);
        self
    }

    /// The lock source, for readiness.
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
        let verdict = match decide::plan(req) {
            Plan::Allow(why) => {
                debug!(uid = %req.uid, operation = req.operation.as_str(), resource = %req.resource_path(),
                    namespace = req.object_namespace().unwrap_or(""), name = req.object_name().unwrap_or(""),
                    exempt = why.as_str(), "allowed without lookup");
                self.metrics
                    .observe(req.operation.as_str(), Decision::allowed, started.elapsed());
                return Ok(Answer {
                    review: respond(&parsed, &Verdict::allow()),
                    outcome: Outcome::Allowed,
                });
            }
            Plan::Lookup(lookup) => {
                let timeout = self.lookup_timeout(deadline);
                match self.read(&lookup, timeout).await {
                    Ok((scope, contents)) => {
                        let verdict = decide::decide(
                            req,
                            &lookup,
                            &scope,
                            contents.as_deref(),
                            Timestamp::now(),
                        );
                        if let Some(events) = &self.events {
                            events.record_verdict(req, &verdict, &scope, contents.as_deref());
                        }
                        verdict
                    }
                    Err(error) => {
                        warn!(uid = %req.uid, operation = req.operation.as_str(), resource = %req.resource_path(),
                            namespace = req.object_namespace().unwrap_or(""), name = %lookup.name,
                            policy = ?self.policy.on_lookup_error, %error, "lock lookup failed");
                        let verdict = decide::decide_unreadable(
                            req,
                            &lookup,
                            self.policy.on_lookup_error,
                            &error,
                        );
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
        };
        log_verdict(req, &verdict, started.elapsed());
        let decision = match verdict.outcome {
            Outcome::Allowed => Decision::allowed,
            Outcome::Warned => Decision::warned,
            Outcome::Denied => Decision::denied,
            Outcome::Error => Decision::error,
        };
        self.metrics
            .observe(req.operation.as_str(), decision, started.elapsed());
        Ok(Answer {
            review: respond(&parsed, &verdict),
            outcome: verdict.outcome,
        })
    }

    fn lookup_timeout(&self, deadline: Option<Duration>) -> Duration {
        // Leave the API server a quarter of its own timeout to receive the answer.
        match deadline {
            Some(d) if !d.is_zero() => self.policy.lookup_timeout.min(d * 3 / 4),
            _ => self.policy.lookup_timeout,
        }
    }

    async fn read(
        &self,
        lookup: &decide::Lookup,
        timeout: Duration,
    ) -> Result<(Arc<LockSet>, Option<Arc<LockSet>>), LookupError> {
        let work = async {
            let scope = self.source.locks(&lookup.scope);
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
    let namespace = req.object_namespace().unwrap_or("");
    let name = req.object_name().unwrap_or("");
    let locks = verdict.locks.join(",");
    if verdict.outcome == Outcome::Denied {
        info!(uid = %req.uid, operation = req.operation.as_str(), resource = %req.resource_path(),
            %namespace, %name, user = %req.user_info.username, lock = %locks,
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
            locks: vec![],
        };
        let json = serde_json::to_value(respond(&parsed, &verdict)).expect("serializes");
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
}
