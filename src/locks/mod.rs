//! Where locks come from, per namespace (`""` for ClusterLocks): [`apiserver::KubeSource`] (an
//! [`index`] fed by a watch, LISTs through a short-lived cache while it is not healthy) and
//! [`files::FilesSource`] (a directory of YAML documents). Neither knows of HTTP or the decision.

pub mod apiserver;
pub mod files;
pub mod index;
pub mod liveness;
pub mod parse;
pub mod watch;

use std::fmt;
use std::sync::Arc;

use futures::future::BoxFuture;

pub use crate::api::{LockKey, LockKind};
use crate::api::{LockSpec, LockStatus, escape};

/// One lock, as the decision needs it.
#[derive(Clone, Debug, PartialEq)]
pub struct LockRef {
    pub kind: LockKind,
    /// `None` for a ClusterLock.
    pub namespace: Option<String>,
    /// Also the name of the object it locks.
    pub name: String,
    /// For a spec that does not parse, what of it fails closed ([`parse`]).
    pub spec: LockSpec,
    /// Why the stored spec could not be read: the lock fails closed for its own name only.
    pub problem: Option<String>,
    /// `None` for files and tests.
    pub generation: Option<i64>,
    pub meta: Arc<LockMeta>,
}

/// What the status and event writers read besides; the admission path never does.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct LockMeta {
    pub uid: String,
    /// The status writer recognises the echo of its own write by it.
    pub resource_version: String,
    /// Every instance's entries; empty when it cannot be read.
    pub status: LockStatus,
}

impl LockRef {
    pub fn lock(namespace: &str, name: &str, spec: LockSpec) -> Self {
        LockRef {
            kind: LockKind::Lock,
            namespace: Some(namespace.to_owned()),
            ..LockRef::cluster_lock(name, spec)
        }
    }

    pub fn cluster_lock(name: &str, spec: LockSpec) -> Self {
        LockRef {
            kind: LockKind::ClusterLock,
            namespace: None,
            name: name.to_owned(),
            spec,
            problem: None,
            generation: None,
            meta: Arc::default(),
        }
    }

    /// True when `other` decides every request as this lock does (status and
    /// resourceVersion aside).
    pub fn same_rule(&self, other: &LockRef) -> bool {
        self.kind == other.kind
            && self.namespace == other.namespace
            && self.name == other.name
            && self.spec == other.spec
            && self.problem == other.problem
            && self.generation == other.generation
    }

    pub fn key(&self) -> LockKey {
        LockKey {
            namespace: self.namespace.clone(),
            name: self.name.clone(),
        }
    }

    pub fn unlock_command(&self) -> String {
        self.key().unlock_command()
    }
}

impl fmt::Display for LockRef {
    /// `Lock prod/app-config` or `ClusterLock lock-demo-reader`.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match &self.namespace {
            Some(ns) => write!(f, "Lock {}/{}", escape(ns), escape(&self.name)),
            None => write!(f, "ClusterLock {}", escape(&self.name)),
        }
    }
}

/// All locks of one namespace (or all ClusterLocks): a vector sorted by name, smaller than a
/// map for the usual one or two locks.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct LockSet {
    by_name: Vec<LockRef>,
}

impl LockSet {
    /// An empty set, shared so that namespaces without locks cost nothing.
    pub fn empty() -> Arc<LockSet> {
        static EMPTY: std::sync::OnceLock<Arc<LockSet>> = std::sync::OnceLock::new();
        EMPTY.get_or_init(|| Arc::new(LockSet::default())).clone()
    }

    pub fn insert(&mut self, lock: LockRef) {
        match self.position(&lock.name) {
            Ok(i) => self.by_name[i] = lock,
            Err(i) => self.by_name.insert(i, lock),
        }
    }

    pub fn remove(&mut self, name: &str) -> Option<LockRef> {
        self.position(name).ok().map(|i| self.by_name.remove(i))
    }

    pub fn get(&self, name: &str) -> Option<&LockRef> {
        self.position(name).ok().map(|i| &self.by_name[i])
    }

    pub fn iter(&self) -> impl Iterator<Item = &LockRef> {
        self.by_name.iter()
    }

    pub fn len(&self) -> usize {
        self.by_name.len()
    }

    pub fn is_empty(&self) -> bool {
        self.by_name.is_empty()
    }

    pub fn shrink_to_fit(&mut self) {
        self.by_name.shrink_to_fit();
    }

    fn position(&self, name: &str) -> Result<usize, usize> {
        self.by_name
            .binary_search_by(|lock| lock.name.as_str().cmp(name))
    }
}

impl FromIterator<LockRef> for LockSet {
    fn from_iter<I: IntoIterator<Item = LockRef>>(iter: I) -> Self {
        let mut set = LockSet::default();
        for lock in iter {
            set.insert(lock);
        }
        set.shrink_to_fit();
        set
    }
}

#[derive(Debug, Clone, thiserror::Error)]
pub enum LookupError {
    #[error("no answer within {0:?}")]
    Timeout(std::time::Duration),
    #[error(
        "the webhook's identity may not list {resource}.objectlock.dev{scope}: grant it get, list and watch on locks and clusterlocks ({message})"
    )]
    Forbidden {
        resource: &'static str,
        scope: String,
        message: String,
    },
    #[error("listing {resource}{scope} failed: {message}")]
    Api {
        resource: &'static str,
        scope: String,
        message: String,
    },
}

pub trait LockSource: Send + Sync + 'static {
    /// The locks of `namespace`; `""` asks for the ClusterLocks.
    fn locks(&self, namespace: &str) -> BoxFuture<'_, Result<Arc<LockSet>, LookupError>>;

    /// The answer of [`LockSource::locks`] when it is in memory; `None` when it must be asked for.
    fn locks_at_hand(&self, namespace: &str) -> Option<Arc<LockSet>> {
        let _ = namespace;
        None
    }

    /// True once the source has a complete view.
    fn is_ready(&self) -> bool;

    fn readiness(&self) -> Result<(), String> {
        if self.is_ready() {
            Ok(())
        } else {
            Err(format!(
                "lock source ({}) has not synced yet",
                self.describe()
            ))
        }
    }

    /// For logs, e.g. `files in /etc/kube-object-lock/locks`.
    fn describe(&self) -> String;

    fn lock_counts(&self) -> LockCounts;

    fn index(&self) -> Option<Arc<index::LockIndex>> {
        None
    }

    /// Every lock set, when all are at hand and fresh (a CRD deletion is decided on them).
    fn all_at_hand(&self) -> Option<Vec<Arc<LockSet>>> {
        let index = self.index()?;
        (index.is_fresh() && index.listed())
            .then(|| index.snapshot().sets.values().cloned().collect())
    }
}

#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct LockCounts {
    pub namespaced: u64,
    pub cluster: u64,
}

impl LockCounts {
    fn of<'a>(sets: impl IntoIterator<Item = (&'a String, &'a Arc<LockSet>)>) -> LockCounts {
        let mut counts = LockCounts::default();
        for (namespace, set) in sets {
            if namespace.is_empty() {
                counts.cluster += set.len() as u64;
            } else {
                counts.namespaced += set.len() as u64;
            }
        }
        counts
    }
}

/// A fixed set of locks, for `check` runs and tests.
#[derive(Debug, Default)]
pub struct StaticSource {
    namespaces: std::collections::HashMap<String, Arc<LockSet>>,
}

impl StaticSource {
    pub fn new(locks: impl IntoIterator<Item = LockRef>) -> Self {
        let mut sets: std::collections::HashMap<String, LockSet> = Default::default();
        for lock in locks {
            let key = lock.namespace.clone().unwrap_or_default();
            sets.entry(key).or_default().insert(lock);
        }
        StaticSource {
            namespaces: sets.into_iter().map(|(k, v)| (k, Arc::new(v))).collect(),
        }
    }
}

impl LockSource for StaticSource {
    fn locks(&self, namespace: &str) -> BoxFuture<'_, Result<Arc<LockSet>, LookupError>> {
        let set = self.locks_at_hand(namespace);
        Box::pin(async move { Ok(set.unwrap_or_else(LockSet::empty)) })
    }

    fn locks_at_hand(&self, namespace: &str) -> Option<Arc<LockSet>> {
        Some(
            self.namespaces
                .get(namespace)
                .cloned()
                .unwrap_or_else(LockSet::empty),
        )
    }

    fn is_ready(&self) -> bool {
        true
    }

    fn describe(&self) -> String {
        "static locks".to_owned()
    }

    fn all_at_hand(&self) -> Option<Vec<Arc<LockSet>>> {
        Some(self.namespaces.values().cloned().collect())
    }

    fn lock_counts(&self) -> LockCounts {
        LockCounts::of(&self.namespaces)
    }
}
