//! Admission: `request` (what arrives) → `decide` (pure) → `response` (what is answered),
//! joined to a lock source by `review`; `refusals` feeds the event writer.

pub mod changes;
pub mod decide;
pub mod labels;
pub mod refusals;
pub mod request;
pub mod response;
pub mod review;
pub mod subresources;

pub use crate::settings::{OnLookupError, ReviewPolicy};
pub use decide::{Outcome, Verdict};
pub use request::AdmissionRequest;
pub use review::{Answer, ReviewError, Reviewer};
