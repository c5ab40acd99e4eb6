//! The lock index: every Lock and ClusterLock by namespace, as immutable `Arc` sets in a
//! persistent map, with each kind's watch health, published as one snapshot on a
//! `tokio::sync::watch`. Invariant: readers never wait on I/O; a namespace absent from a synced
//! index has no Locks; an unchanged namespace keeps its `Arc`, so followers [`diff`] snapshots.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant, SystemTime};

use imbl::ordmap::DiffItem;
use tokio::sync::watch;

use super::{LockCounts, LockKind, LockRef, LockSet};

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum WatchState {
    NotSynced,
    /// Listed, and a watch stream is open.
    Live,
    /// The watch ended cleanly and is being resumed; trusted for at most `stale_after`.
    Reconnecting,
    /// Lookups ask the API server until a fresh list and watch succeed.
    Stale,
}

impl WatchState {
    pub fn as_str(self) -> &'static str {
        match self {
            WatchState::NotSynced => "not_synced",
            WatchState::Live => "live",
            WatchState::Reconnecting => "reconnecting",
            WatchState::Stale => "stale",
        }
    }
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Health {
    pub state: WatchState,
    /// When the state began (monotonic, for the staleness bound; wall clock, for metrics).
    pub since: Instant,
    pub since_wall: SystemTime,
    /// The last error, when not `Live`.
    pub reason: Option<String>,
}

impl Health {
    fn new(state: WatchState, reason: Option<String>) -> Health {
        Health {
            state,
            since: Instant::now(),
            since_wall: SystemTime::now(),
            reason,
        }
    }

    /// True when the index may answer: live, or reconnecting for at most `stale_after`.
    pub fn is_fresh(&self, stale_after: Duration) -> bool {
        match self.state {
            WatchState::Live => true,
            WatchState::Reconnecting => self.since.elapsed() <= stale_after,
            WatchState::NotSynced | WatchState::Stale => false,
        }
    }
}

/// Lock sets by namespace (`""` holds the ClusterLocks); namespaces without locks are absent.
pub type Sets = imbl::OrdMap<String, Arc<LockSet>>;

#[derive(Clone, Debug)]
pub struct IndexSnapshot {
    /// The watch health of Locks, then of ClusterLocks.
    pub health: [Health; 2],
    pub sets: Sets,
    /// Whether Locks, and ClusterLocks, have been listed at least once (a first list that
    /// fails is `Stale` too).
    pub listed: (bool, bool),
    pub counts: LockCounts,
}

impl IndexSnapshot {
    pub fn health(&self, kind: LockKind) -> &Health {
        &self.health[kind as usize]
    }

    fn count_mut(&mut self, kind: LockKind) -> &mut u64 {
        match kind {
            LockKind::Lock => &mut self.counts.namespaced,
            LockKind::ClusterLock => &mut self.counts.cluster,
        }
    }

    /// True once both kinds have been listed at least once.
    pub fn is_listed(&self) -> bool {
        self.listed.0 && self.listed.1
    }
}

/// One lock's change between two [`Sets`].
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Change<'a> {
    /// New, or in a namespace whose set changed; with the lock of that name before, if any.
    Put(&'a LockRef, Option<&'a LockRef>),
    Gone(&'a LockRef),
}

/// What changed from `old` to `new`: visits only namespaces whose set is not shared.
pub fn diff<'a>(old: &'a Sets, new: &'a Sets) -> impl Iterator<Item = Change<'a>> {
    old.diff(new).flat_map(|item| {
        let (old, new) = match item {
            DiffItem::Add(_, new) => (None, Some(new)),
            DiffItem::Update {
                old: (_, old),
                new: (_, new),
            } => (Some(old), Some(new)),
            DiffItem::Remove(_, old) => (Some(old), None),
        };
        let put = (new.into_iter().flat_map(|set| set.iter()))
            .map(move |lock| Change::Put(lock, old.and_then(|old| old.get(&lock.name))));
        let gone = (old.into_iter().flat_map(|set| set.iter()))
            .filter(move |lock| new.is_none_or(|new| new.get(&lock.name).is_none()))
            .map(Change::Gone);
        put.chain(gone)
    })
}

#[derive(Debug)]
pub struct LockIndex {
    state: watch::Sender<IndexSnapshot>,
    stale_after: Duration,
    /// Bumped each time a kind becomes fresh: older fallback answers are never reused.
    stale_epoch: AtomicU64,
}

impl LockIndex {
    pub fn new(stale_after: Duration) -> LockIndex {
        let not_synced = Health::new(WatchState::NotSynced, Some("not listed yet".into()));
        LockIndex {
            state: watch::Sender::new(IndexSnapshot {
                health: [not_synced.clone(), not_synced],
                sets: Sets::new(),
                listed: (false, false),
                counts: LockCounts::default(),
            }),
            stale_after,
            stale_epoch: AtomicU64::new(0),
        }
    }

    pub fn stale_after(&self) -> Duration {
        self.stale_after
    }

    /// The locks of `namespace` (`""`: ClusterLocks); `None` when the API server must be asked.
    pub fn get(&self, namespace: &str) -> Option<Arc<LockSet>> {
        let state = self.state.borrow();
        let health = state.health(LockKind::for_namespace(namespace));
        if !health.is_fresh(self.stale_after) {
            return None;
        }
        Some(
            state
                .sets
                .get(namespace)
                .cloned()
                .unwrap_or_else(LockSet::empty),
        )
    }

    pub fn health(&self, kind: LockKind) -> Health {
        self.state.borrow().health(kind).clone()
    }

    /// True when both kinds may be answered from the index.
    pub fn is_fresh(&self) -> bool {
        let state = self.state.borrow();
        (state.health.iter()).all(|health| health.is_fresh(self.stale_after))
    }

    pub fn listed(&self) -> bool {
        self.state.borrow().is_listed()
    }

    pub fn counts(&self) -> LockCounts {
        self.state.borrow().counts
    }

    pub fn snapshot(&self) -> IndexSnapshot {
        self.state.borrow().clone()
    }

    pub fn subscribe(&self) -> watch::Receiver<IndexSnapshot> {
        self.state.subscribe()
    }

    pub(crate) fn stale_epoch(&self) -> u64 {
        self.stale_epoch.load(Ordering::SeqCst)
    }

    pub(crate) fn apply(&self, kind: LockKind, lock: LockRef) {
        self.state.send_if_modified(|state| {
            let namespace = lock.namespace.clone().unwrap_or_default();
            let mut set =
                (state.sets.get(&namespace)).map_or_else(LockSet::default, |s| LockSet::clone(s));
            if set.get(&lock.name) == Some(&lock) {
                return false;
            }
            let before = set.len();
            set.insert(lock);
            set.shrink_to_fit();
            *state.count_mut(kind) += (set.len() - before) as u64;
            state.sets.insert(namespace, Arc::new(set));
            true
        });
    }

    pub(crate) fn delete(&self, kind: LockKind, namespace: &str, name: &str) {
        self.state.send_if_modified(|state| {
            let Some(old) = state
                .sets
                .get(namespace)
                .filter(|set| set.get(name).is_some())
            else {
                return false;
            };
            let mut set = LockSet::clone(old);
            set.remove(name);
            set.shrink_to_fit();
            let count = state.count_mut(kind);
            *count = count.saturating_sub(1);
            if set.is_empty() {
                state.sets.remove(namespace);
            } else {
                state.sets.insert(namespace.to_owned(), Arc::new(set));
            }
            true
        });
    }

    /// Replaces every lock of `kind` with a fresh list (writer only). Namespaces whose locks did
    /// not change keep their `Arc`, so followers can tell what really changed.
    pub(crate) fn reset(&self, kind: LockKind, locks: Vec<LockRef>) {
        let count = locks.len() as u64;
        let mut grouped: std::collections::HashMap<String, LockSet> = Default::default();
        for lock in locks {
            let namespace = lock.namespace.clone().unwrap_or_default();
            grouped.entry(namespace).or_default().insert(lock);
        }
        self.state.send_modify(|state| {
            let gone: Vec<String> = (state.sets.keys())
                .filter(|ns| LockKind::for_namespace(ns) == kind && !grouped.contains_key(*ns))
                .cloned()
                .collect();
            for namespace in gone {
                state.sets.remove(&namespace);
            }
            for (namespace, mut set) in grouped {
                set.shrink_to_fit();
                if state.sets.get(&namespace).is_none_or(|old| **old != set) {
                    state.sets.insert(namespace, Arc::new(set));
                }
            }
            *state.count_mut(kind) = count;
            match kind {
                LockKind::Lock => state.listed.0 = true,
                LockKind::ClusterLock => state.listed.1 = true,
            }
        });
    }

    /// Sets the watch state of `kind`; returns the previous health when the state changed.
    pub(crate) fn set_state(
        &self,
        kind: LockKind,
        state: WatchState,
        reason: Option<String>,
    ) -> Option<Health> {
        let mut previous = None;
        self.state.send_if_modified(|snapshot| {
            let health = &mut snapshot.health[kind as usize];
            if health.state == state {
                if state != WatchState::Live {
                    health.reason = reason.clone();
                }
                return false;
            }
            let was_fresh = health.is_fresh(self.stale_after);
            let old = std::mem::replace(health, Health::new(state, reason.clone()));
            if !was_fresh && health.is_fresh(self.stale_after) {
                self.stale_epoch.fetch_add(1, Ordering::SeqCst);
            }
            previous = Some(old);
            true
        });
        previous
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::api::LockSpec;

    fn lock(ns: &str, name: &str) -> LockRef {
        LockRef::lock(ns, name, LockSpec::default())
    }

    fn live(index: &LockIndex) {
        for kind in [LockKind::Lock, LockKind::ClusterLock] {
            index.set_state(kind, WatchState::Live, None);
        }
    }

    #[test]
    fn answers_only_once_synced_and_live() {
        let index = LockIndex::new(Duration::from_secs(60));
        assert_eq!(index.get("prod"), None, "not synced: ask the API server");
        index.reset(LockKind::Lock, vec![lock("prod", "a")]);
        index.reset(LockKind::ClusterLock, vec![]);
        assert_eq!(index.get("prod"), None, "listed but no watch yet");
        live(&index);
        assert_eq!(index.get("prod").map(|s| s.len()), Some(1));
        assert_eq!(
            index.get("other").map(|s| s.len()),
            Some(0),
            "a namespace without Locks is known to have none"
        );
        assert_eq!(index.get("").map(|s| s.len()), Some(0));
        index.set_state(LockKind::Lock, WatchState::Stale, Some("403".into()));
        assert_eq!(index.get("prod"), None, "a failed watch is stale at once");
        assert!(index.get("").is_some(), "ClusterLocks have their own watch");
        assert!(!index.is_fresh());
    }

    #[test]
    fn a_reconnecting_watch_is_trusted_for_the_bound_only() {
        let index = LockIndex::new(Duration::from_millis(0));
        index.reset(LockKind::Lock, vec![lock("prod", "a")]);
        live(&index);
        index.set_state(LockKind::Lock, WatchState::Reconnecting, None);
        std::thread::sleep(Duration::from_millis(2));
        assert_eq!(index.get("prod"), None);
        let index = LockIndex::new(Duration::from_secs(3600));
        index.reset(LockKind::Lock, vec![lock("prod", "a")]);
        live(&index);
        index.set_state(LockKind::Lock, WatchState::Reconnecting, None);
        assert!(index.get("prod").is_some());
    }

    #[test]
    fn events_and_resets_replace_whole_sets() {
        let index = LockIndex::new(Duration::from_secs(60));
        live(&index);
        index.reset(
            LockKind::Lock,
            vec![lock("prod", "a"), lock("prod", "b"), lock("dev", "c")],
        );
        let before = index.get("prod").expect("fresh");
        index.apply(LockKind::Lock, lock("prod", "d"));
        assert_eq!(before.len(), 2, "readers keep the set they took");
        assert_eq!(index.get("prod").map(|s| s.len()), Some(3));
        index.delete(LockKind::Lock, "dev", "c");
        assert_eq!(index.get("dev").map(|s| s.len()), Some(0));
        assert_eq!(index.counts().namespaced, 3);
        let dev_before = index.snapshot();
        assert!(
            !dev_before.sets.contains_key("dev"),
            "empty namespaces are dropped"
        );
        let prod = index.get("prod").expect("fresh");
        index.reset(
            LockKind::Lock,
            vec![lock("prod", "a"), lock("prod", "b"), lock("prod", "d")],
        );
        assert!(
            Arc::ptr_eq(&prod, &index.get("prod").expect("fresh")),
            "an unchanged namespace keeps its set"
        );
    }

    #[test]
    fn subscribers_see_changes_and_freshness_bumps_the_epoch() {
        let index = LockIndex::new(Duration::from_secs(60));
        let mut changes = index.subscribe();
        changes.borrow_and_update();
        live(&index);
        assert!(changes.has_changed().unwrap_or(false));
        let epoch = index.stale_epoch();
        index.set_state(LockKind::ClusterLock, WatchState::Stale, None);
        index.set_state(LockKind::ClusterLock, WatchState::Live, None);
        assert_eq!(index.stale_epoch(), epoch + 1);
        index.set_state(LockKind::ClusterLock, WatchState::Stale, None);
        assert_eq!(index.snapshot().health[1].state, WatchState::Stale);
        assert_eq!(
            index.set_state(LockKind::ClusterLock, WatchState::Stale, None),
            None,
            "no transition"
        );
    }

    #[test]
    fn diff_tells_what_changed_between_two_snapshots() {
        let told = |old: &IndexSnapshot, new: &IndexSnapshot| -> Vec<String> {
            let mut told: Vec<String> = (diff(&old.sets, &new.sets))
                .map(|change| match change {
                    Change::Put(l, None) => format!("new {}", l.key()),
                    Change::Put(l, Some(_)) => format!("put {}", l.key()),
                    Change::Gone(l) => format!("gone {}", l.key()),
                })
                .collect();
            told.sort();
            told
        };
        let index = LockIndex::new(Duration::from_secs(5));
        let empty = index.snapshot();
        index.reset(LockKind::Lock, vec![lock("a", "x"), lock("b", "y")]);
        let first = index.snapshot();
        assert_eq!(told(&empty, &first), ["new Lock a/x", "new Lock b/y"]);
        assert!(told(&first, &index.snapshot()).is_empty(), "nothing new");
        index.apply(LockKind::Lock, lock("a", "z"));
        index.delete(LockKind::Lock, "b", "y");
        index.set_state(LockKind::Lock, WatchState::Live, None);
        assert_eq!(
            told(&first, &index.snapshot()),
            ["gone Lock b/y", "new Lock a/z", "put Lock a/x"]
        );
        index.reset(LockKind::Lock, vec![lock("a", "x"), lock("a", "z")]);
        index.reset(LockKind::ClusterLock, vec![]);
        let relisted = index.snapshot();
        assert_eq!(relisted.listed, (true, true));
        assert!(
            told(&first, &relisted).contains(&"gone Lock b/y".to_owned()),
            "a re-list without a namespace removes its locks"
        );
    }
}
