//! Lock status: each running instance records, in the status of every Lock and ClusterLock, that
//! it enforces it (or why it does not).
//!
//! A holder of a lock cannot see the webhook; the status is how it learns that the lock is in
//! force. Every instance writes with server-side apply under its own field manager
//! (`kube-object-lock/<instance>`), to the `status` subresource only:
//! - its own entry of `status.enforcedBy` (a list keyed by instance name, so instances never
//!   overwrite each other), with the generation it enforces and since when;
//! - `status.enforcedCount`, the number of entries, for the `ENFORCED` printer column (a
//!   printer column shows only the first match of a JSONPath, so it cannot count a list). Every
//!   instance computes it from the list as it last saw it and writes it with `force`; they agree
//!   once the list settles;
//! - the condition `Enforced` (True/Enforcing, or False with Expired, WarnMode,
//!   NotSentToWebhook, NamespaceNotSelected or NotYetRegistered). Every instance writes the
//!   same condition, so it carries no time.
//!
//! With a self-narrowing registration ([`crate::registration::writer`]), a lock counts as
//! enforced only once the configuration that names it has been written and read back (for a
//! lock asking for CREATE or CONNECT, the entries of those operations too): before that, the
//! API server does not send its object's writes to the webhook at all. When the operator
//! limits that configuration to some namespaces, a lock elsewhere is never sent either: the
//! namespaces' labels ([`namespaces`]) say which.
//!
//! Writes happen only when the result changes (a lock appears, changes generation, expires,
//! the source turns unhealthy...), never per admission. While the lock source is unhealthy the
//! instance withdraws its entries: it cannot vouch for locks it may not see.
//!
//! The input is deliberately simple: a [`tokio::sync::watch`] channel of [`LockSnapshot`]s, the
//! locks known and whether that knowledge is current. [`view`] provides one from the admission
//! path's lock index, so a lock counts as enforced from what the admissions are decided from.

pub mod enforcement;
pub mod namespaces;
pub mod view;
pub mod writer;

use std::collections::BTreeMap;
use std::sync::Arc;

use crate::api::{LockKey, LockSpec};
use crate::locks::{LockMeta, LockRef};

/// The condition type written by every instance.
pub const CONDITION: &str = "Enforced";
/// Prefix of each instance's field manager.
pub const FIELD_MANAGER_PREFIX: &str = "kube-object-lock/";

/// One lock as the lock index last saw it.
#[derive(Clone, Debug, PartialEq)]
pub struct KnownLock {
    /// Which lock.
    pub key: LockKey,
    /// `metadata.generation`.
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
