//! Lock status: each instance's entry in `status.enforcedBy`, `status.enforcedCount` and the
//! `Enforced` condition, written with server-side apply under the instance's own field manager.
//! Invariant: a lock counts as enforced from the same index the admissions are decided from, and
//! only once the registration names it; an instance that cannot vouch withdraws its entries.

pub mod enforcement;
pub mod namespaces;
pub mod view;
pub mod writer;

use std::collections::BTreeMap;
use std::sync::Arc;

use crate::api::{LockKey, LockSpec};
use crate::locks::{LockMeta, LockRef};

pub const CONDITION: &str = "Enforced";
pub const FIELD_MANAGER_PREFIX: &str = "kube-object-lock/";

/// One lock as the lock index last saw it.
#[derive(Clone, Debug, PartialEq)]
pub struct KnownLock {
    pub key: LockKey,
    pub generation: i64,
    /// The spec as enforced: for an unreadable one, the index parser's fail-closed reading.
    pub spec: LockSpec,
    /// Why the stored spec cannot be read, when it cannot: the status says so.
    pub problem: Option<String>,
    /// uid, resourceVersion and status, shared with the index.
    pub meta: Arc<LockMeta>,
}

impl From<&LockRef> for KnownLock {
    fn from(lock: &LockRef) -> KnownLock {
        KnownLock {
            key: lock.key(),
            generation: lock.generation.unwrap_or(0),
            spec: lock.spec.clone(),
            problem: lock.problem.clone(),
            meta: lock.meta.clone(),
        }
    }
}

/// The locks known, and whether that knowledge is current.
#[derive(Clone, Debug, Default)]
pub struct LockSnapshot {
    /// True while the source has a complete, current view (synced, watch not failing).
    pub healthy: bool,
    /// Every known lock. A persistent map: publishing a snapshot per change costs no copy, and
    /// the diff of two snapshots visits only the parts that changed.
    pub locks: imbl::OrdMap<LockKey, Arc<KnownLock>>,
}

/// The labels of every namespace, as the namespace watch last listed them.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct NamespaceLabels {
    /// True once the first list is in: until then no namespace is known.
    pub listed: bool,
    /// Each namespace's labels, by name. A persistent map: the status writer diffs two of them
    /// to find the namespaces whose labels changed.
    pub labels: imbl::OrdMap<String, Arc<BTreeMap<String, String>>>,
}
