//! `kube-object-lock check`: the answer the server would give to one AdmissionReview (from a
//! file or stdin, e.g. captured from the audit log), the locks read once from the configured
//! source (no watch).

use std::io::Read;
use std::path::Path;
use std::sync::Arc;

use crate::admission::labels::apiserver::KubeLabels;
use crate::admission::{Outcome, ReviewError, Reviewer};
use crate::app::{self, StartError};
use crate::settings::Settings;

#[derive(Debug)]
pub struct CheckResult {
    pub response: String,
    pub allowed: bool,
    pub outcome: Outcome,
    /// Where the locks were read from (for "could not decide").
    pub source: String,
}

impl CheckResult {
    /// The exit status: 0 allowed, 1 denied, [`UNDECIDED`] when the locks could not be read
    /// (the response printed is then what `on_lookup_error` gives, not a decision on locks).
    pub fn exit_code(&self) -> u8 {
        match (self.outcome, self.allowed) {
            (Outcome::Error, _) => UNDECIDED,
            (_, true) => 0,
            (_, false) => 1,
        }
    }
}

/// The exit status of `check` when it could not decide: the locks could not be read.
pub const UNDECIDED: u8 = 3;

#[derive(Debug, thiserror::Error)]
pub enum CheckError {
    #[error("cannot read {path}: {source}")]
    Read {
        path: String,
        source: std::io::Error,
    },
    #[error("{path}: {source}")]
    Review { path: String, source: ReviewError },
    #[error(transparent)]
    Source(#[from] StartError),
}

impl CheckError {
    /// 2 for bad input (the review), [`UNDECIDED`] when the locks cannot be read.
    pub fn exit_code(&self) -> u8 {
        match self {
            CheckError::Read { .. } | CheckError::Review { .. } => 2,
            CheckError::Source(_) => UNDECIDED,
        }
    }
}

/// Answers the review in `input` (`-` = stdin).
pub async fn check(settings: &Settings, input: &Path) -> Result<CheckResult, CheckError> {
    let name = input.display().to_string();
    let body = if name == "-" {
        let mut buf = Vec::new();
        std::io::stdin().read_to_end(&mut buf).map(|_| buf)
    } else {
        std::fs::read(input)
    };
    let body = body.map_err(|source| CheckError::Read {
        path: name.clone(),
        source,
    })?;
    // Refuse bad input before touching the cluster.
    crate::admission::review::parse(&body).map_err(|source| CheckError::Review {
        path: name.clone(),
        source,
    })?;
    let source = app::lock_source(settings, false, Default::default()).await?;
    let described = match (&source.client, &settings.kube.kubeconfig) {
        (Some(_), Some(path)) => format!(
            "{} (kubeconfig {})",
            source.source.describe(),
            path.display()
        ),
        _ => source.source.describe(),
    };
    let mut reviewer = Reviewer::new(source.source, settings.review_policy());
    if let Some(client) = source.client {
        reviewer = reviewer.with_labels(Arc::new(KubeLabels::new(client)));
    }
    let answer = reviewer
        .review(&body, None)
        .await
        .map_err(|source| CheckError::Review { path: name, source })?;
    let allowed = answer.review.response.allowed;
    let response = serde_json::to_string_pretty(&answer.review).unwrap_or_default();
    Ok(CheckResult {
        response,
        allowed,
        outcome: answer.outcome,
        source: described,
    })
}
