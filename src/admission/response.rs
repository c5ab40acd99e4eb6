//! The answer: the response AdmissionReview for a verdict, in the request's `apiVersion`,
//! carrying its uid, written as kube's `AdmissionReview` serializes.

use std::collections::BTreeMap;

use serde::Serialize;

use super::decide::Verdict;
use super::request::ParsedReview;

/// The AdmissionReview sent back, serialized as `kube`'s `AdmissionReview` is.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct ReviewAnswer {
    /// The request's `apiVersion`.
    pub api_version: &'static str,
    /// Always `AdmissionReview`.
    pub kind: &'static str,
    /// The answer.
    pub response: ReviewResponse,
}

impl ReviewAnswer {
    /// The answer's JSON.
    pub fn to_json(&self) -> serde_json::Result<Vec<u8>> {
        serde_json::to_vec(self)
    }
}

/// An AdmissionReview's `response`.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct ReviewResponse {
    /// The request's uid.
    pub uid: String,
    /// True when the request may proceed.
    pub allowed: bool,
    /// Why it may not (empty when allowed).
    pub status: ReviewStatus,
    /// Recorded in the audit log.
    #[serde(skip_serializing_if = "BTreeMap::is_empty")]
    pub audit_annotations: BTreeMap<String, String>,
    /// Shown by kubectl.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub warnings: Vec<String>,
}

/// A `Status` as the API server reads it from a response: `{}` when allowed.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize)]
pub struct ReviewStatus {
    /// `Failure` for a refusal.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub status: Option<&'static str>,
    /// The HTTP code the user sees.
    #[serde(skip_serializing_if = "is_zero")]
    pub code: u16,
    /// The message kubectl prints.
    #[serde(skip_serializing_if = "String::is_empty")]
    pub message: String,
    /// `Forbidden` or `ServiceUnavailable`.
    #[serde(skip_serializing_if = "str::is_empty")]
    pub reason: &'static str,
}

fn is_zero(code: &u16) -> bool {
    *code == 0
}

/// The response AdmissionReview for a verdict.
pub fn respond(review: ParsedReview, verdict: Verdict) -> ReviewAnswer {
    let allowed = verdict.allowed();
    let status = match verdict.refusal {
        Some(refusal) => ReviewStatus {
            status: Some("Failure"),
            code: refusal.code,
            message: refusal.message,
            reason: refusal.reason,
        },
        None => ReviewStatus::default(),
    };
    ReviewAnswer {
        api_version: review.api_version,
        kind: "AdmissionReview",
        response: ReviewResponse {
            uid: review.request.uid.into_owned(),
            allowed,
            status,
            audit_annotations: verdict.audit_annotations,
            warnings: verdict.warnings,
        },
    }
}
