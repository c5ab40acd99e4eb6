//! The answer: the response AdmissionReview for a verdict, in the request's `apiVersion`,
//! carrying its uid, written as kube's `AdmissionReview` serializes.

use std::collections::BTreeMap;

use serde::Serialize;

use super::decide::Verdict;
use super::request::ParsedReview;

/// The AdmissionReview sent back: `kube`'s `AdmissionReview` as it serializes, built from the
/// verdict without copies or intermediate values.
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
    /// The answer's JSON, written into one allocation, where `serde_json::to_vec` starts empty
    /// and grows three times. A plain allow, nearly every answer, is written around its one
    /// variable part, the uid (escaped by serde_json), exactly as serde would write it, into an
    /// allocation of its exact size, which the response body then takes over without another.
    pub fn to_json(&self) -> serde_json::Result<Vec<u8>> {
        const HEAD: &[u8] = br#"{"apiVersion":"#;
        const KIND: &[u8] = br#","kind":"AdmissionReview","response":{"uid":"#;
        const TAIL: &[u8] = br#","allowed":true,"status":{}}}"#;
        let response = &self.response;
        let plain_allow = response.allowed
            && response.status == ReviewStatus::default()
            && response.audit_annotations.is_empty()
            && response.warnings.is_empty();
        if !(plain_allow && self.kind == "AdmissionReview") {
            let mut json = Vec::with_capacity(512);
            serde_json::to_writer(&mut json, self)?;
            return Ok(json);
        }
        // Exact when neither string needs escaping (otherwise it grows): the two strings and
        // their quotes between the constant parts.
        let quoted = |text: &str| text.len() + 2;
        let size =
            HEAD.len() + quoted(self.api_version) + KIND.len() + quoted(&response.uid) + TAIL.len();
        let mut json = Vec::with_capacity(size);
        json.extend_from_slice(HEAD);
        serde_json::to_writer(&mut json, self.api_version)?;
        json.extend_from_slice(KIND);
        serde_json::to_writer(&mut json, &response.uid)?;
        json.extend_from_slice(TAIL);
        Ok(json)
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
