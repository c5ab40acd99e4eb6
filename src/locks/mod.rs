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
    /// The Lock's namespace; `None` for a ClusterLock.
    pub namespace: Option<String>,
    /// The Lock's name, which is also the name of the object it locks.
    pub name: String,
    /// The Lock's spec. For a Lock whose spec does not parse, what of it fails closed: its own
    /// name, its `resources` and `operations` where each reads alone, Enforce mode (see
    /// [`LockRef::problem`] and [`parse`]).
    pub spec: LockSpec,
    /// Why the stored spec could not be read, when it could not (an unknown enum value from a
    /// newer version, a hand-edited object). Such a lock fails closed for its own name only;
    /// the refusal carries this as a warning.
    pub problem: Option<String>,
    /// `metadata.generation` as the API server reported it (`None` for files and tests).
    pub generation: Option<i64>,
    /// What the status and event writers read besides: shared, so that copying a set of locks
    /// copies a pointer per lock.
    pub meta: Arc<LockMeta>,
}

/// A lock's object metadata and status, as the watch last delivered them. The admission path
/// never reads them; they ride along in the index so that one watch serves every reader.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct LockMeta {
    /// `metadata.uid` (events name it, so that `kubectl describe` finds them).
    pub uid: String,
    /// `metadata.resourceVersion`: the status writer recognises the echo of its own write by it.
    pub resource_version: String,
    /// The status as last seen (every instance's entries); empty when it cannot be read.
    pub status: LockStatus,
}

impl LockRef {
    pub fn lock(namespace: &str, name: &str, spec: LockSpec) -> Self {
        LockRef {
            kind: LockKind::Lock,
            namespace: Some(namespace.to_owned()),
            name: name.to_owned(),
            spec,
            problem: None,
            generation: None,
            meta: Arc::default(),
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

    /// True when `other` decides every request as this lock does: the same lock, spec,
    /// readability and generation, whatever its status and resourceVersion (every instance's
    /// status write changes those, and nothing else).
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

/// All locks of one namespace (or all ClusterLocks), by name.
///
/// A sorted vector sized to fit, not a map: the index holds one per namespace, most with one
/// or two locks, and a map's nodes would cost kilobytes each.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct LockSet {
    /// Sorted by name, names unique.
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

/// Why the locks of a namespace could not be read.
#[derive(Debug, Clone, thiserror::Error)]
pub enum LookupError {
    /// The source did not answer within the lookup timeout.
    #[error("no answer within {0:?}")]
    Timeout(std::time::Duration),
    /// The API server refused the webhook's identity.
    #[error(
        "the webhook's identity may not list {resource}.objectlock.dev{scope}: grant it get, list and watch on locks and clusterlocks ({message})"
    )]
    Forbidden {
        resource: &'static str,
        scope: String,
        message: String,
    },
    /// Any other API failure (connection refused, 5xx, bad answer).
    #[error("listing {resource}{scope} failed: {message}")]
    Api {
        resource: &'static str,
        scope: String,
        message: String,
    },
}

/// A place that knows the locks.
pub trait LockSource: Send + Sync + 'static {
    /// The locks of `namespace`; `""` asks for the ClusterLocks.
    fn locks(&self, namespace: &str) -> BoxFuture<'_, Result<Arc<LockSet>, LookupError>>;

    /// The locks of `namespace` when they are at hand, in memory, with nothing to wait for: the
    /// same answer [`LockSource::locks`] would give at once, without a future or a timer for it.
    /// `None` when they must be asked for.
    fn locks_at_hand(&self, namespace: &str) -> Option<Arc<LockSet>> {
        let _ = namespace;
        None
    }

    /// True once the source has a complete view (the first watch list synced, the first scan
    /// of the directory done).
    fn is_ready(&self) -> bool;

    /// `Ok` when ready; otherwise why not, for `/readyz`.
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

    /// A short description for logs, e.g. `files in /etc/kube-object-lock/locks`.
    fn describe(&self) -> String;

    fn lock_counts(&self) -> LockCounts;

    /// The in-memory index lookups are answered from, when the source keeps one.
    fn index(&self) -> Option<Arc<index::LockIndex>> {
        None
    }

    /// Every lock set (every namespace's and the ClusterLocks), when all are at hand and fresh:
    /// what deleting a CustomResourceDefinition is decided on, as its objects may be in any
    /// namespace. `None` when they are not (the index stale or not listed yet).
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
