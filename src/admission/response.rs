//! The answer: the response AdmissionReview for a verdict, in the request's `apiVersion`,
//! carrying its uid, written as kube's `AdmissionReview` serializes.

use std::collections::BTreeMap;

use serde::Serialize;

use super::decide::Verdict;
use super::request::ParsedReview;

#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct ReviewAnswer {
    pub api_version: &'static str,
    pub kind: &'static str,
    pub response: ReviewResponse,
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct ReviewResponse {
    pub uid: String,
    pub allowed: bool,
    pub status: ReviewStatus,
    #[serde(skip_serializing_if = "BTreeMap::is_empty")]
    pub audit_annotations: BTreeMap<String, String>,
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub warnings: Vec<String>,
}

/// A `Status` as the API server reads it from a response: `{}` when allowed.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize)]
pub struct ReviewStatus {
    #[serde(skip_serializing_if = "Option::is_none")]
    pub status: Option<&'static str>,
    #[serde(skip_serializing_if = "is_zero")]
    pub code: u16,
    #[serde(skip_serializing_if = "String::is_empty")]
    pub message: String,
    #[serde(skip_serializing_if = "str::is_empty")]
    pub reason: &'static str,
}

fn is_zero(code: &u16) -> bool {
    *code == 0
}

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
