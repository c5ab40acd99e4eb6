//! The status and event writers' view of the locks, followed from the admission path's lock
//! index by diffing its snapshots. Healthy while both kinds are listed and the index may answer
//! ([`LockIndex::is_fresh`]); otherwise the instance cannot vouch for the locks.

use std::sync::Arc;
use std::time::Duration;

use tokio::sync::watch;

use super::LockSnapshot;
use crate::locks::index::LockIndex;

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
        let mut started = false;
        loop {
            tx.send_if_modified(|published| update(published, &mut started, &index));
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

/// Takes in the index as it stands; true when `published` changed. Nothing is published until
/// the index has first been complete and current (`started`): half a list would have the writer
/// mark locks unenforced that are merely not seen yet.
fn update(published: &mut LockSnapshot, started: &mut bool, index: &LockIndex) -> bool {
    let now = index.snapshot();
    let healthy = index.is_fresh() && now.is_listed();
    *started |= healthy;
    if !*started || (published.healthy == healthy && published.sets.ptr_eq(&now.sets)) {
        return false;
    }
    *published = LockSnapshot {
        healthy,
        sets: now.sets,
    };
    true
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::api::LockSpec;
    use crate::api::{LockKey, LockKind};
    use crate::locks::LockRef;
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
        let (mut view, mut started) = (LockSnapshot::default(), false);
        let mut update = |view: &mut LockSnapshot| update(view, &mut started, &index);
        assert!(!update(&mut view), "nothing listed: nothing to say");
        let mut odd = lock("b", "y", "1");
        odd.problem = Some("spec.mode: unknown variant".into());
        index.reset(LockKind::Lock, vec![lock("a", "x", "1"), odd]);
        live(&index);
        assert!(update(&mut view));
        assert!(view.healthy);
        let known = view.get(&LockKey::lock("b", "y")).expect("known");
        assert_eq!(known.problem.as_deref(), Some("spec.mode: unknown variant"));
        assert!(!update(&mut view), "nothing new");

        index.apply(LockKind::Lock, lock("a", "x", "2"));
        index.delete(LockKind::Lock, "b", "y");
        index.apply(LockKind::Lock, lock("c", "z", "1"));
        assert!(update(&mut view));
        let keys: Vec<String> = view.locks().map(|l| l.key().to_string()).collect();
        assert_eq!(keys, ["Lock a/x", "Lock c/z"]);
        let x = view.get(&LockKey::lock("a", "x")).expect("known");
        assert_eq!(x.spec.reason.as_deref(), Some("2"));

        index.set_state(LockKind::Lock, WatchState::Stale, Some("403".into()));
        assert!(update(&mut view), "health is a change");
        assert!(!view.healthy);
    }
}
