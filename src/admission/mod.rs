//! Admission: what arrives, what is decided, what is answered.
//!
//! `request` holds the slice of an AdmissionReview the decision reads, `scan` reads it from the
//! body fast, `decide` is the pure decision, `subresources` says which subresources change their
//! object, and `review` joins them to a lock source: bytes in, AdmissionReview out.

pub mod decide;
pub mod request;
pub mod review;
mod scan;
pub mod subresources;

pub use decide::{OnLookupError, Outcome, Verdict};
pub use request::AdmissionRequest;
pub use review::{Answer, ReviewError, ReviewPolicy, Reviewer};
