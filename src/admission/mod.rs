//! Admission: what arrives, what is decided, what is answered.
//!
//! `request` holds the slice of an AdmissionReview the decision reads (borrowed from the body by
//! serde_json), `decide` is the pure decision, `refusals` what it hands on to the event writer,
//! `subresources` says which subresources change their object, `labels` reads the labels an
//! eviction or a scale does not carry, and `review` joins them to a lock source: bytes in,
//! AdmissionReview out.

pub mod changes;
pub mod decide;
pub mod labels;
pub mod refusals;
pub mod request;
pub mod response;
pub mod review;
pub mod subresources;

/// The review path's settings, defined with the other settings.
pub use crate::settings::{OnLookupError, ReviewPolicy};
pub use decide::{Outcome, Verdict};
pub use request::AdmissionRequest;
pub use review::{Answer, ReviewError, Reviewer};
