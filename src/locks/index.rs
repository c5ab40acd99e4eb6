//! The lock index: every Lock and ClusterLock by namespace, as immutable `Arc` sets, with each
//! kind's watch health published under the same lock. Invariant: readers never wait on I/O; a
//! namespace absent from a synced index has no Locks.

use std::collections::{HashMap, VecDeque};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, RwLock, RwLockReadGuard, RwLockWriteGuard};
use std::time::{Duration, Instant, SystemTime};

use super::{LockCounts, LockKind, LockRef, LockSet};

/// What the watch of one kind is doing.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum WatchState {
    /// Nothing listed yet: the index knows nothing.
    NotSynced,
    /// Listed, and a watch stream is open: the index is current.
    Live,
    /// The watch stream ended cleanly (server timeout, a proxy closing it) and is being resumed
    /// from where it stopped; the index is trusted for at most `stale_after`.
    Reconnecting,
    /// The watch failed (or did not come back within `stale_after`): lookups ask the API server
    /// until a fresh list and watch succeed.
    Stale,
}

impl WatchState {
    /// `not_synced`, `live`, `reconnecting` or `stale`.
    pub fn as_str(self) -> &'static str {
        match self {
            WatchState::NotSynced => "not_synced",
            WatchState::Live => "live",
            WatchState::Reconnecting => "reconnecting",
            WatchState::Stale => "stale",
        }
    }
}

/// The health of one kind's watch.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Health {
    pub state: WatchState,
    /// When the state began (monotonic, for the staleness bound).
    pub since: Instant,
    /// When the state began (wall clock, for metrics and status).
    pub since_wall: SystemTime,
    /// Why, when the state is not `Live` (the last error).
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

/// One kind's published state.
#[derive(Clone, Debug)]
struct Published {
    health: Health,
    /// By namespace (`""` for ClusterLocks); namespaces without locks are absent.
    sets: HashMap<String, Arc<LockSet>>,
    count: u64,
    /// A list has completed at least once: `sets` is knowledge, not emptiness by default.
    listed: bool,
}

impl Default for Published {
    fn default() -> Self {
        Published {
            health: Health::new(WatchState::NotSynced, Some("not listed yet".into())),
            sets: HashMap::new(),
            count: 0,
            listed: false,
        }
    }
}

/// What the index holds at one moment, for a status writer or a test.
#[derive(Clone, Debug)]
pub struct IndexSnapshot {
    /// Health of the Lock watch.
    pub locks: Health,
    /// Health of the ClusterLock watch.
    pub cluster_locks: Health,
    /// Lock sets by namespace (`""` holds the ClusterLocks).
    pub sets: HashMap<String, Arc<LockSet>>,
    /// Whether Locks, and ClusterLocks, have been listed at least once. Until then their sets
    /// are empty for want of knowledge (health alone does not say: a first list that fails is
    /// `Stale` too).
    pub listed: (bool, bool),
    /// The change counter this snapshot reflects (see [`LockIndex::subscribe`]).
    pub version: u64,
}

/// One lock's change, as a [`Follower`] learns it.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Change<'a> {
    /// Present now: new, or in a namespace whose set changed; with the lock of that name the
    /// follower saw before, if any.
    Put(&'a LockRef, Option<&'a LockRef>),
    /// Gone since.
    Gone(&'a LockRef),
}

/// A reader's place in the index: the sets it last took in, and the change counter then. A
/// reader that follows the index (the status view, the registration writer) catches up with
/// [`LockIndex::catch_up`], at a cost in proportion to what changed since, not to the number
/// of locks: during a first start with 10,000 Locks, every status write is a change.
#[derive(Debug, Default)]
pub struct Follower {
    seen: HashMap<String, Arc<LockSet>>,
    version: u64,
    listed: (bool, bool),
}

impl Follower {
    /// Whether Locks, and ClusterLocks, had been listed at the last catch-up.
    pub fn listed(&self) -> (bool, bool) {
        self.listed
    }

    /// The locks as of the last catch-up, sets shared with the index (no copy).
    pub fn locks(&self) -> impl Iterator<Item = &LockRef> {
        self.seen.values().flat_map(|set| set.iter())
    }
}

/// The namespaces changed at each version, so that followers need not compare every set.
#[derive(Debug, Default)]
struct Journal {
    /// (version, namespace), oldest first.
    entries: VecDeque<(u64, String)>,
    /// Changes up to this version are not in `entries` (a re-list, or the bound): a follower
    /// older than this compares every set.
    horizon: u64,
}

/// Journal entries kept at most; a follower further behind compares every set once.
const JOURNAL: usize = 1024;

/// The index. Share it with `Arc`; see the module docs.
#[derive(Debug)]
pub struct LockIndex {
    locks: RwLock<Published>,
    cluster_locks: RwLock<Published>,
    stale_after: Duration,
    /// Bumped each time a kind becomes fresh: fallback answers cached before are never reused
    /// when the index stops being fresh again (they may predate what the watch had shown).
    stale_epoch: AtomicU64,
    changes: tokio::sync::watch::Sender<u64>,
    journal: Mutex<Journal>,
}

impl LockIndex {
    /// An empty, not yet synced index that trusts a reconnecting watch for `stale_after`.
    pub fn new(stale_after: Duration) -> LockIndex {
        LockIndex {
            locks: RwLock::default(),
            cluster_locks: RwLock::default(),
            stale_after,
            stale_epoch: AtomicU64::new(0),
            changes: tokio::sync::watch::channel(0).0,
            journal: Mutex::default(),
        }
    }

    pub fn stale_after(&self) -> Duration {
        self.stale_after
    }

    /// The locks of `namespace` (`""`: ClusterLocks) when the index may answer; `None` when the
    /// API server must be asked.
    pub fn get(&self, namespace: &str) -> Option<Arc<LockSet>> {
        let published = self.read(LockKind::for_namespace(namespace));
        if !published.health.is_fresh(self.stale_after) {
            return None;
        }
        Some(
            published
                .sets
                .get(namespace)
                .cloned()
                .unwrap_or_else(LockSet::empty),
        )
    }

    /// The health of one kind's watch.
    pub fn health(&self, kind: LockKind) -> Health {
        self.read(kind).health.clone()
    }

    /// True when both kinds may be answered from the index.
    pub fn is_fresh(&self) -> bool {
        [LockKind::Lock, LockKind::ClusterLock]
            .into_iter()
            .all(|kind| self.read(kind).health.is_fresh(self.stale_after))
    }

    /// True once both kinds have been listed at least once.
    pub fn listed(&self) -> bool {
        self.read(LockKind::Lock).listed && self.read(LockKind::ClusterLock).listed
    }

    /// The change counter (see [`LockIndex::subscribe`]).
    pub fn version(&self) -> u64 {
        *self.changes.borrow()
    }

    /// Locks known by scope.
    pub fn counts(&self) -> LockCounts {
        LockCounts {
            namespaced: self.read(LockKind::Lock).count,
            cluster: self.read(LockKind::ClusterLock).count,
        }
    }

    /// Everything the index holds now.
    pub fn snapshot(&self) -> IndexSnapshot {
        let version = *self.changes.borrow();
        let locks = self.read(LockKind::Lock);
        let cluster = self.read(LockKind::ClusterLock);
        let mut sets = locks.sets.clone();
        sets.extend(cluster.sets.iter().map(|(k, v)| (k.clone(), v.clone())));
        IndexSnapshot {
            locks: locks.health.clone(),
            cluster_locks: cluster.health.clone(),
            sets,
            listed: (locks.listed, cluster.listed),
            version,
        }
    }

    /// A receiver that changes whenever a lock or a watch state changes.
    pub fn subscribe(&self) -> tokio::sync::watch::Receiver<u64> {
        self.changes.subscribe()
    }

    /// Bumped each time a kind becomes fresh.
    pub(crate) fn stale_epoch(&self) -> u64 {
        self.stale_epoch.load(Ordering::SeqCst)
    }

    /// Adds or replaces one lock (writer only).
    pub(crate) fn apply(&self, kind: LockKind, lock: LockRef) {
        let namespace = lock.namespace.clone().unwrap_or_default();
        let mut published = self.write(kind);
        let mut set = published
            .sets
            .get(&namespace)
            .map(|s| LockSet::clone(s))
            .unwrap_or_default();
        if set.get(&lock.name) == Some(&lock) {
            return;
        }
        let before = set.len();
        set.insert(lock);
        set.shrink_to_fit();
        published.count += (set.len() - before) as u64;
        published.sets.insert(namespace.clone(), Arc::new(set));
        drop(published);
        self.changed(Some(namespace));
    }

    /// Removes one lock (writer only).
    pub(crate) fn delete(&self, kind: LockKind, namespace: &str, name: &str) {
        let mut published = self.write(kind);
        let Some(old) = published.sets.get(namespace) else {
            return;
        };
        if old.get(name).is_none() {
            return;
        }
        let mut set = LockSet::clone(old);
        set.remove(name);
        set.shrink_to_fit();
        published.count = published.count.saturating_sub(1);
        if set.is_empty() {
            published.sets.remove(namespace);
        } else {
            published.sets.insert(namespace.to_owned(), Arc::new(set));
        }
        drop(published);
        self.changed(Some(namespace.to_owned()));
    }

    /// Replaces every lock of `kind` with a fresh list (writer only). Namespaces whose locks did
    /// not change keep their `Arc`, so snapshots can tell what really changed.
    pub(crate) fn reset(&self, kind: LockKind, locks: Vec<LockRef>) {
        let count = locks.len() as u64;
        let mut grouped: HashMap<String, LockSet> = HashMap::with_capacity(locks.len().min(1024));
        for lock in locks {
            let namespace = lock.namespace.clone().unwrap_or_default();
            grouped.entry(namespace).or_default().insert(lock);
        }
        let mut published = self.write(kind);
        let sets = grouped
            .into_iter()
            .map(|(namespace, mut set)| {
                set.shrink_to_fit();
                let set = match published.sets.get(&namespace) {
                    Some(old) if **old == set => old.clone(),
                    _ => Arc::new(set),
                };
                (namespace, set)
            })
            .collect();
        published.sets = sets;
        published.count = count;
        published.listed = true;
        drop(published);
        // Followers compare every set once: cheaper than a journal entry per namespace.
        let mut journal = self.journal();
        self.changes.send_modify(|v| *v += 1);
        journal.entries.clear();
        journal.horizon = *self.changes.borrow();
    }

    /// Sets the watch state of `kind`; returns the previous health when the state changed.
    pub(crate) fn set_state(
        &self,
        kind: LockKind,
        state: WatchState,
        reason: Option<String>,
    ) -> Option<Health> {
        let mut published = self.write(kind);
        let was_fresh = published.health.is_fresh(self.stale_after);
        if published.health.state == state {
            if state != WatchState::Live {
                published.health.reason = reason;
            }
            return None;
        }
        let previous = std::mem::replace(&mut published.health, Health::new(state, reason));
        if !was_fresh && published.health.is_fresh(self.stale_after) {
            self.stale_epoch.fetch_add(1, Ordering::SeqCst);
        }
        drop(published);
        self.changed(None);
        Some(previous)
    }

    /// Bumps the change counter, noting which namespace's set changed, if one did.
    fn changed(&self, namespace: Option<String>) {
        let mut journal = self.journal();
        self.changes.send_modify(|v| *v += 1);
        if let Some(namespace) = namespace {
            let version = *self.changes.borrow();
            journal.entries.push_back((version, namespace));
            if journal.entries.len() > JOURNAL
                && let Some((dropped, _)) = journal.entries.pop_front()
            {
                journal.horizon = dropped;
            }
        }
    }

    /// Brings `follower` up to date, telling `change` of every lock put or gone since its
    /// last catch-up; kinds not listed yet are left out (their sets are empty for want of
    /// knowledge). Costs the namespaces changed since, or one comparison per namespace when
    /// the follower is older than the journal (its first catch-up, after a re-list).
    pub fn catch_up(&self, follower: &mut Follower, mut change: impl FnMut(Change<'_>)) {
        let (version, namespaces) = {
            let journal = self.journal();
            let version = *self.changes.borrow();
            let namespaces: Option<Vec<String>> =
                (follower.version >= journal.horizon).then(|| {
                    (journal.entries.iter())
                        .filter(|(v, _)| *v > follower.version)
                        .map(|(_, ns)| ns.clone())
                        .collect()
                });
            (version, namespaces)
        };
        let listed = (
            self.read(LockKind::Lock).listed,
            self.read(LockKind::ClusterLock).listed,
        );
        let is_listed = |ns: &str| match LockKind::for_namespace(ns) {
            LockKind::Lock => listed.0,
            LockKind::ClusterLock => listed.1,
        };
        let namespaces = namespaces.unwrap_or_else(|| {
            let mut all: Vec<String> = follower.seen.keys().cloned().collect();
            for kind in [LockKind::Lock, LockKind::ClusterLock] {
                all.extend(self.read(kind).sets.keys().cloned());
            }
            all.sort_unstable();
            all.dedup();
            all
        });
        for namespace in namespaces {
            let now = (is_listed(&namespace))
                .then(|| {
                    self.read(LockKind::for_namespace(&namespace))
                        .sets
                        .get(&namespace)
                        .cloned()
                })
                .flatten();
            let old = follower.seen.get(&namespace);
            if let (Some(old), Some(now)) = (old, &now)
                && Arc::ptr_eq(old, now)
            {
                continue;
            }
            if let Some(now) = &now {
                for lock in now.iter() {
                    change(Change::Put(lock, old.and_then(|old| old.get(&lock.name))));
                }
            }
            for lock in old.into_iter().flat_map(|old| old.iter()) {
                if now.as_ref().is_none_or(|now| now.get(&lock.name).is_none()) {
                    change(Change::Gone(lock));
                }
            }
            match now {
                Some(now) => follower.seen.insert(namespace, now),
                None => follower.seen.remove(&namespace),
            };
        }
        follower.version = version;
        follower.listed = listed;
    }

    fn journal(&self) -> std::sync::MutexGuard<'_, Journal> {
        self.journal
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    fn read(&self, kind: LockKind) -> RwLockReadGuard<'_, Published> {
        // A writer never panics while holding the lock; recover the data if one ever did.
        self.slot(kind)
            .read()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    fn write(&self, kind: LockKind) -> RwLockWriteGuard<'_, Published> {
        self.slot(kind)
            .write()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    fn slot(&self, kind: LockKind) -> &RwLock<Published> {
        match kind {
            LockKind::Lock => &self.locks,
            LockKind::ClusterLock => &self.cluster_locks,
        }
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
        assert_eq!(index.snapshot().cluster_locks.state, WatchState::Stale);
        assert_eq!(
            index.set_state(LockKind::ClusterLock, WatchState::Stale, None),
            None,
            "no transition"
        );
    }

    /// What a follower is told is told of, as "put ns/name" / "gone ns/name".
    fn catch_up(index: &LockIndex, follower: &mut Follower) -> Vec<String> {
        let mut seen = Vec::new();
        index.catch_up(follower, |change| {
            seen.push(match change {
                Change::Put(l, _) => format!("put {}", l.key()),
                Change::Gone(l) => format!("gone {}", l.key()),
            })
        });
        seen.sort();
        seen
    }

    #[test]
    fn a_follower_is_told_what_changed_since_its_last_catch_up() {
        let index = LockIndex::new(Duration::from_secs(5));
        let mut follower = Follower::default();
        assert!(catch_up(&index, &mut follower).is_empty(), "nothing listed");
        index.reset(LockKind::Lock, vec![lock("a", "x"), lock("b", "y")]);
        assert_eq!(
            catch_up(&index, &mut follower),
            ["put Lock a/x", "put Lock b/y"]
        );
        assert_eq!(follower.listed(), (true, false));
        assert!(catch_up(&index, &mut follower).is_empty(), "nothing new");
        index.apply(LockKind::Lock, lock("a", "z"));
        index.delete(LockKind::Lock, "b", "y");
        index.set_state(LockKind::Lock, WatchState::Live, None);
        assert_eq!(
            catch_up(&index, &mut follower),
            ["gone Lock b/y", "put Lock a/x", "put Lock a/z"]
        );
        // A second follower, new, is told everything.
        let mut late = Follower::default();
        assert_eq!(
            catch_up(&index, &mut late),
            ["put Lock a/x", "put Lock a/z"]
        );
    }

    #[test]
    fn a_follower_further_behind_than_the_journal_compares_every_set() {
        let index = LockIndex::new(Duration::from_secs(5));
        index.reset(LockKind::Lock, vec![lock("gone", "x")]);
        let mut follower = Follower::default();
        assert_eq!(catch_up(&index, &mut follower), ["put Lock gone/x"]);
        index.delete(LockKind::Lock, "gone", "x");
        for i in 0..JOURNAL + 10 {
            index.apply(LockKind::Lock, lock(&format!("ns-{i}"), "x"));
        }
        let told = catch_up(&index, &mut follower);
        assert_eq!(told.len(), JOURNAL + 11, "every new lock and the one gone");
        assert!(told.contains(&"gone Lock gone/x".to_owned()));
        assert!(catch_up(&index, &mut follower).is_empty());
    }
}
