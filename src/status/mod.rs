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

use crate::api::LockKey;
use crate::locks::LockRef;
use crate::locks::index::Sets;

pub const CONDITION: &str = "Enforced";
pub const FIELD_MANAGER_PREFIX: &str = "kube-object-lock/";

/// The locks known, and whether that knowledge is current.
#[derive(Clone, Debug, Default)]
pub struct LockSnapshot {
    /// True while the source has a complete, current view (synced, watch not failing).
    pub healthy: bool,
    /// The lock index's: the diff of two snapshots visits only the namespaces that changed.
    pub sets: Sets,
}

impl LockSnapshot {
    pub fn get(&self, key: &LockKey) -> Option<&LockRef> {
        (self.sets.get(key.namespace.as_deref().unwrap_or_default()))?.get(&key.name)
    }

    pub fn locks(&self) -> impl Iterator<Item = &LockRef> {
        self.sets.values().flat_map(|set| set.iter())
    }
}

/// The labels of every namespace, as the namespace watch last listed them.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct NamespaceLabels {
    /// True once the first list is in: until then no namespace is known.
    pub listed: bool,
    pub labels: imbl::OrdMap<String, Arc<BTreeMap<String, String>>>,
}
