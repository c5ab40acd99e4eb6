//! A [`LockSnapshot`] feed from a watch on Locks and ClusterLocks.
//!
//! Objects are read as `DynamicObject`s and each spec is parsed on its own, so one lock this
//! version cannot parse is reported as such instead of breaking the feed. The feed is healthy
//! once both kinds are listed and until a watch fails; a failed watch is started over with a
//! fresh list (so health comes back only with a complete, current view), after the delays of
//! every watch on Locks (at most a second, see [`crate::retry::watch`]).
//!
//! This is a stand-in: a lock index fed by the same watch can publish the same snapshot, and
//! then this second watch goes away.

use std::collections::BTreeMap;
use std::sync::Arc;

use futures::{FutureExt, StreamExt, TryStreamExt};
use kube::api::{Api, DynamicObject};
use kube::runtime::utils::Backoff;
use kube::runtime::watcher;
use tokio::sync::watch;
use tracing::{debug, warn};

use super::{KnownLock, LockKey, LockSnapshot};
use crate::api::{LockSpec, LockStatus};
use crate::retry::LastError;

/// Starts watching: the receiver sees a new snapshot on every change; the future runs the
/// watches until dropped.
pub fn watch_locks(
    client: kube::Client,
) -> (
    watch::Receiver<LockSnapshot>,
    impl Future<Output = ()> + Send + 'static,
) {
    let (tx, rx) = watch::channel(LockSnapshot::default());
    let tx = Arc::new(tx);
    let namespaced = LockKey {
        namespace: Some(String::new()),
        name: String::new(),
    };
    let cluster = LockKey {
        namespace: None,
        name: String::new(),
    };
    let state = Arc::new(std::sync::Mutex::new(FeedState::default()));
    let run = {
        let locks = watch_kind(client.clone(), namespaced, 0, tx.clone(), state.clone());
        let cluster_locks = watch_kind(client, cluster, 1, tx, state);
        async move {
            futures::future::join(locks, cluster_locks).await;
        }
    };
    (rx, run)
}

#[derive(Default)]
struct FeedState {
    /// Shared with the published snapshots (a persistent map: publishing copies nothing).
    locks: imbl::OrdMap<LockKey, Arc<KnownLock>>,
    /// Per kind (Lock, ClusterLock): listed, and not failing since.
    healthy: [bool; 2],
}

impl FeedState {
    fn publish(&self, tx: &watch::Sender<LockSnapshot>) {
        tx.send_replace(LockSnapshot {
            healthy: self.healthy.iter().all(|h| *h),
            locks: self.locks.clone(),
        });
    }
}

async fn watch_kind(
    client: kube::Client,
    kind: LockKey,
    slot: usize,
    tx: Arc<watch::Sender<LockSnapshot>>,
    state: Arc<std::sync::Mutex<FeedState>>,
) {
    let resource = kind.api_resource();
    let api: Api<DynamicObject> = Api::all_with(client, &resource);
    let is_kind = |key: &LockKey| key.namespace.is_some() == kind.namespace.is_some();
    // The same retry delays as every other watch on Locks (at most a second).
    let mut backoff = crate::retry::watch();
    let mut delay = backoff.next().unwrap_or(crate::retry::MAX_WAIT);
    let mut last_error = LastError::default();
    loop {
        let mut stream = watcher(api.clone(), watcher::Config::default()).boxed();
        let mut listing: BTreeMap<LockKey, Arc<KnownLock>> = BTreeMap::new();
        'stream: loop {
            let mut next = match stream.try_next().await {
                Ok(Some(event)) => Some(event),
                Ok(None) => break,
                Err(error) => {
                    report(&mut last_error, &resource.kind, &error, delay);
                    break;
                }
            };
            let mut st = state.lock().unwrap_or_else(|e| e.into_inner());
            // Every event already received is applied before one snapshot is published: the
            // snapshot copies the map, and a burst (every instance's status writes on every
            // lock) would otherwise cost a copy per event.
            let mut changed = false;
            let mut ended = false;
            while let Some(event) = next.take() {
                match event {
                    // A list in progress is published whole, at its end.
                    watcher::Event::Init => listing.clear(),
                    watcher::Event::InitApply(obj) => {
                        if let Some(lock) = known(obj, kind.namespace.is_some()) {
                            listing.insert(lock.key.clone(), Arc::new(lock));
                        }
                    }
                    watcher::Event::InitDone => {
                        // Only what the list changed is replaced, so that a re-list keeps the
                        // snapshots' shared structure (and their diff small).
                        let gone: Vec<LockKey> = (st.locks.keys())
                            .filter(|key| is_kind(key) && !listing.contains_key(*key))
                            .cloned()
                            .collect();
                        for key in gone {
                            st.locks.remove(&key);
                        }
                        for (key, lock) in std::mem::take(&mut listing) {
                            if st.locks.get(&key).is_none_or(|old| **old != *lock) {
                                st.locks.insert(key, lock);
                            }
                        }
                        st.healthy[slot] = true;
                        last_error.clear();
                        backoff.reset();
                        delay = backoff.next().unwrap_or(crate::retry::MAX_WAIT);
                        changed = true;
                        debug!(kind = %resource.kind, "lock status feed listed");
                    }
                    watcher::Event::Apply(obj) => {
                        if let Some(lock) = known(obj, kind.namespace.is_some()) {
                            st.locks.insert(lock.key.clone(), Arc::new(lock));
                            changed = true;
                        }
                    }
                    watcher::Event::Delete(obj) => {
                        if let Some(lock) = known(obj, kind.namespace.is_some()) {
                            st.locks.remove(&lock.key);
                            changed = true;
                        }
                    }
                }
                next = match stream.try_next().now_or_never() {
                    Some(Ok(Some(event))) => Some(event),
                    Some(Ok(None)) => {
                        ended = true;
                        None
                    }
                    Some(Err(error)) => {
                        report(&mut last_error, &resource.kind, &error, delay);
                        ended = true;
                        None
                    }
                    None => None,
                };
            }
            if changed {
                st.publish(&tx);
            }
            if ended {
                break 'stream;
            }
        }
        {
            let mut st = state.lock().unwrap_or_else(|e| e.into_inner());
            st.healthy[slot] = false;
            st.publish(&tx);
        }
        tokio::time::sleep(delay).await;
        delay = backoff.next().unwrap_or(crate::retry::MAX_WAIT);
    }
}

/// A lock as the status writer needs it; `None` for an object without a name.
pub fn known(obj: DynamicObject, namespaced: bool) -> Option<KnownLock> {
    let name = obj.metadata.name.clone()?;
    let namespace = if namespaced {
        Some(obj.metadata.namespace.clone()?)
    } else {
        None
    };
    let spec = match obj.data.get("spec") {
        None | Some(serde_json::Value::Null) => Ok(LockSpec::default()),
        Some(spec) => serde_json::from_value::<LockSpec>(spec.clone()).map_err(|e| e.to_string()),
    };
    // A status this version cannot read is treated as empty: the writer then writes its part.
    let status = obj
        .data
        .get("status")
        .and_then(|s| serde_json::from_value::<LockStatus>(s.clone()).ok())
        .unwrap_or_default();
    Some(KnownLock {
        key: LockKey { namespace, name },
        uid: obj.metadata.uid.clone().unwrap_or_default(),
        generation: obj.metadata.generation.unwrap_or(0),
        resource_version: obj.metadata.resource_version.clone().unwrap_or_default(),
        spec,
        status,
    })
}

/// Logs a failed watch once per distinct error (it is retried every second at most), and each
/// repeat at debug.
fn report(
    last: &mut LastError,
    kind: &str,
    error: &kube::runtime::watcher::Error,
    retry_in: std::time::Duration,
) {
    let error = error.to_string();
    if last.is_new(&error) {
        warn!(kind, %error, ?retry_in, "lock status feed: watch failed; listing again");
    } else {
        debug!(kind, %error, ?retry_in, "lock status feed: watch failed again");
    }
}
