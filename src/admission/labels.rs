//! The labels of the object a review acts on but does not carry (the pod of an eviction, the
//! object of a Scale), read through a [`LabelReader`] only when
//! [`crate::admission::decide::labels_needed`] says a selector Lock needs them.

pub mod apiserver;

use std::collections::BTreeMap;
use std::fmt;
use std::time::Duration;

use futures::future::BoxFuture;

use super::request::Resource;

/// The object whose labels are needed: what a metadata-only GET names.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Target<'a> {
    pub resource: &'a Resource<'a>,
    pub namespace: Option<&'a str>,
    pub name: &'a str,
}

impl fmt::Display for Target<'_> {
    /// `pods "db-0" in namespace "prod"`, as the API server words objects.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} \"{}\"", self.resource.qualified(), self.name)?;
        match self.namespace {
            Some(ns) => write!(f, " in namespace \"{ns}\""),
            None => Ok(()),
        }
    }
}

/// What reading a [`Target`]'s labels gave.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Labels {
    Read(BTreeMap<String, String>),
    /// It does not exist (404): the API server answers the eviction or scale itself.
    Gone,
    /// They could not be read; `on_lookup_error` decides for the locks that need them.
    Unreadable(LabelError),
}

/// Why a target's labels could not be read.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum LabelError {
    #[error("no answer within {}ms", .0.as_millis())]
    Timeout(Duration),
    #[error(
        "the webhook's identity may not get {resource}: grant it get on {resource} ({message})"
    )]
    Forbidden { resource: String, message: String },
    /// The API server answered with another error (5xx, 4xx other than 403 and 404).
    #[error("the API server answered {code}: {message}")]
    Api { code: u16, message: String },
    /// The API server could not be reached, or its answer not read.
    #[error("{0}")]
    Connection(String),
    /// The locks come from files: there is no cluster to read labels from.
    #[error("locks are read from files: there is no cluster to read them from")]
    NoCluster,
}

impl LabelError {
    /// A short label for metrics: `timeout`, `forbidden`, `api`, `connection`, `no_cluster`.
    pub fn reason(&self) -> &'static str {
        match self {
            LabelError::Timeout(_) => "timeout",
            LabelError::Forbidden { .. } => "forbidden",
            LabelError::Api { .. } => "api",
            LabelError::Connection(_) => "connection",
            LabelError::NoCluster => "no_cluster",
        }
    }
}

/// Where labels and a custom resource's scaled field are read; the caller bounds the wait.
pub trait LabelReader: Send + Sync + 'static {
    /// The labels of `target`; `Ok(None)` when it does not exist.
    fn labels(
        &self,
        target: &Target<'_>,
    ) -> BoxFuture<'static, Result<Option<BTreeMap<String, String>>, LabelError>>;

    /// The `specReplicasPath` (`.spec.size`) of `resource`'s CRD; `Ok(None)` without CRD or scale.
    fn scaled_field(
        &self,
        resource: &Resource<'_>,
    ) -> BoxFuture<'static, Result<Option<String>, LabelError>>;
}

/// Without a cluster (locks from files) every read fails with [`LabelError::NoCluster`].
#[derive(Clone, Copy, Debug, Default)]
pub struct NoCluster;

impl LabelReader for NoCluster {
    fn labels(
        &self,
        _target: &Target<'_>,
    ) -> BoxFuture<'static, Result<Option<BTreeMap<String, String>>, LabelError>> {
        Box::pin(async { Err(LabelError::NoCluster) })
    }

    fn scaled_field(
        &self,
        _resource: &Resource<'_>,
    ) -> BoxFuture<'static, Result<Option<String>, LabelError>> {
        Box::pin(async { Err(LabelError::NoCluster) })
    }
}
