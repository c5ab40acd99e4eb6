//! The status and event writers' view of the locks, followed from the admission path's lock
//! index by diffing its snapshots. Healthy while both kinds are listed and the index may answer
//! ([`LockIndex::is_fresh`]); otherwise the instance cannot vouch for the locks.

use std::sync::Arc;
use std::time::Duration;

use tokio::sync::watch;

use super::LockSnapshot;
use crate::api::LockKey;
use crate::locks::LockRef;
use crate::locks::index::{self, Change, LockIndex, Sets};

/// How often health is looked at again when nothing changes: a reconnecting watch becomes
/// stale by the passing of time alone.
const RECHECK: Duration = Duration::from_secs(1);

/// Follows `index`: the receiver sees a new snapshot on every change; the future runs until
/// dropped.
pub fn follow(
    index: Arc<LockIndex>,
) -> (
    watch::Receiver<LockSnapshot>,
    impl Future<Output = ()> + Send + 'static,
) {
    let (tx, rx) = watch::channel(LockSnapshot::default());
    let run = async move {
        let mut changes = index.subscribe();
        let mut view = View::default();
        loop {
            if view.update(&index) {
                tx.send_replace(view.snapshot());
            }
            tokio::select! {
                changed = changes.changed() => {
                    if changed.is_err() {
                        return;
                    }
                }
                () = tokio::time::sleep(RECHECK) => {}
                () = tx.closed() => return,
            }
        }
    };
    (rx, run)
}

#[derive(Default)]
struct View {
    healthy: bool,
    locks: imbl::OrdMap<LockKey, Arc<LockRef>>,
    /// The index's sets last taken in; `None` until it has first been complete and current.
    seen: Option<Sets>,
}

impl View {
    /// Applies what changed in the index; true when the snapshot changed.
    fn update(&mut self, index: &LockIndex) -> bool {
        let now = index.snapshot();
        // Until the index has first been complete and current there is nothing to say: half a
        // list would have the writer mark locks unenforced that are merely not seen yet.
        let healthy = index.is_fresh() && now.is_listed();
        if !healthy && self.seen.is_none() {
            return false;
        }
        let mut changed = healthy != self.healthy;
        self.healthy = healthy;
        let seen = self.seen.get_or_insert_default();
        for change in index::diff(seen, &now.sets) {
            match change {
                Change::Put(lock, _) => {
                    let key = lock.key();
                    if self.locks.get(&key).is_none_or(|known| **known != *lock) {
                        self.locks.insert(key, Arc::new(lock.clone()));
                        changed = true;
                    }
                }
                Change::Gone(lock) => changed |= self.locks.remove(&lock.key()).is_some(),
            }
        }
        *seen = now.sets;
        changed
    }

    fn snapshot(&self) -> LockSnapshot {
        LockSnapshot {
            healthy: self.healthy,
            locks: self.locks.clone(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::api::LockKind;
    use crate::api::LockSpec;
    use crate::locks::index::WatchState;

    fn lock(ns: &str, name: &str, reason: &str) -> LockRef {
        LockRef::lock(
            ns,
            name,
            LockSpec {
                reason: Some(reason.into()),
                ..LockSpec::default()
            },
        )
    }

    fn live(index: &LockIndex) {
        index.reset(LockKind::ClusterLock, vec![]);
        for kind in [LockKind::Lock, LockKind::ClusterLock] {
            index.set_state(kind, WatchState::Live, None);
        }
    }

    #[test]
    fn follows_the_index_once_complete_and_its_health() {
        let index = LockIndex::new(Duration::from_secs(5));
        let mut view = View::default();
        assert!(!view.update(&index), "nothing listed: nothing to say");
        let mut odd = lock("b", "y", "1");
        odd.problem = Some("spec.mode: unknown variant".into());
        index.reset(LockKind::Lock, vec![lock("a", "x", "1"), odd]);
        live(&index);
        assert!(view.update(&index));
        assert!(view.snapshot().healthy);
        let known = &view.snapshot().locks[&LockKey::lock("b", "y")];
        assert_eq!(known.problem.as_deref(), Some("spec.mode: unknown variant"));
        assert!(!view.update(&index), "nothing new");

        index.apply(LockKind::Lock, lock("a", "x", "2"));
        index.delete(LockKind::Lock, "b", "y");
        index.apply(LockKind::Lock, lock("c", "z", "1"));
        assert!(view.update(&index));
        let snapshot = view.snapshot();
        let keys: Vec<String> = snapshot.locks.keys().map(|k| k.to_string()).collect();
        assert_eq!(keys, ["Lock a/x", "Lock c/z"]);
        let x = &snapshot.locks[&LockKey::lock("a", "x")];
        assert_eq!(x.spec.reason.as_deref(), Some("2"));

        index.set_state(LockKind::Lock, WatchState::Stale, Some("403".into()));
        assert!(view.update(&index), "health is a change");
        assert!(!view.snapshot().healthy);
    }
}
