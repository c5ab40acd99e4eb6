//! Admission: what arrives, what is decided, what is answered.
//!
//! `request` holds the slice of an AdmissionReview the decision reads, `json` and `tape` read
//! it from the body fast, `decide` is the pure decision, `subresources` says which subresources change their
//! object, and `review` joins them to a lock source: bytes in, AdmissionReview out.

pub mod decide;
mod json;
pub mod request;
pub mod review;
pub mod subresources;
mod tape;

pub use decide::{OnLookupError, Outcome, Verdict};
pub use request::AdmissionRequest;
pub use review::{Answer, ReviewError, ReviewPolicy, Reviewer};
