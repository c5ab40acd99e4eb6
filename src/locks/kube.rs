//! Locks from the API server, through a moka cache kept fresh by a watch.
//!
//! The cache is keyed by namespace (`""` for ClusterLocks) and holds all of that namespace's
//! locks, so one LIST answers every object in it; concurrent misses for one key share that LIST
//! (moka's `try_get_with`). Entries expire after the TTL and the cache is bounded in namespaces.
//!
//! The watch makes the TTL a backstop, not the freshness guarantee: every Lock event
//! invalidates its namespace, and a re-list invalidates everything. A LIST that was already in
//! flight when an event arrived could still land in the cache after the invalidation and hide
//! the change for a whole TTL, so each entry remembers the event generation it was loaded at and
//! a read that finds an entry older than its namespace's last event loads it again.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::Duration;

use futures::future::BoxFuture;
use futures::{StreamExt, TryStreamExt};
use kube::api::{Api, ListParams};
use kube::runtime::{WatchStreamExt, watcher};
use kube::{Client, ResourceExt};
use moka::future::Cache;
use tracing::{debug, info, warn};

use super::{LockRef, LockSet, LockSource, LookupError};
use crate::api::{CLUSTER_LOCKS, ClusterLock, LOCKS, Lock};

/// How many times a read reloads an entry that events keep overtaking before it settles for
/// the freshest load it has.
const MAX_RELOADS: usize = 3;

/// Cache settings.
#[derive(Debug, Clone, Copy)]
pub struct CacheConfig {
    /// How long a namespace's locks are served without asking again.
    pub ttl: Duration,
    /// How many namespaces are kept at most.
    pub max_namespaces: u64,
}

#[derive(Debug)]
struct Entry {
    locks: Arc<LockSet>,
    /// The event generation when the LIST started.
    generation: u64,
}

/// Counters a test or benchmark can read.
#[derive(Debug, Default)]
pub struct Stats {
    /// LIST calls made by lookups (the watch's own lists are not counted).
    pub lists: AtomicU64,
    /// Lookups asked of the source.
    pub lookups: AtomicU64,
    /// Watch events received.
    pub events: AtomicU64,
    /// Watch errors (each one is retried with backoff).
    pub watch_errors: AtomicU64,
}

struct Shared {
    client: Client,
    cache: Cache<String, Arc<Entry>>,
    /// The generation of the last event per namespace (bounded like the cache).
    last_event: moka::sync::Cache<String, u64>,
    /// Bumped on every event.
    generation: AtomicU64,
    /// The generation of the last completed re-list.
    relisted: AtomicU64,
    locks_synced: AtomicBool,
    cluster_locks_synced: AtomicBool,
    stats: Stats,
}

/// The production lock source.
#[derive(Clone)]
pub struct KubeSource {
    shared: Arc<Shared>,
}

impl KubeSource {
    /// A source reading through `client`. Call [`KubeSource::watch`] to keep it fresh.
    pub fn new(client: Client, config: CacheConfig) -> Self {
        let cache = Cache::builder()
            .max_capacity(config.max_namespaces)
            .time_to_live(config.ttl)
            .build();
        let last_event = moka::sync::Cache::builder()
            .max_capacity(config.max_namespaces.max(10_000))
            .time_to_live(config.ttl)
            .build();
        KubeSource {
            shared: Arc::new(Shared {
                client,
                cache,
                last_event,
                generation: AtomicU64::new(0),
                relisted: AtomicU64::new(0),
                locks_synced: AtomicBool::new(false),
                cluster_locks_synced: AtomicBool::new(false),
                stats: Stats::default(),
            }),
        }
    }

    /// Counters for tests and benchmarks.
    pub fn stats(&self) -> &Stats {
        &self.shared.stats
    }

    /// Watches Locks and ClusterLocks until the returned future is dropped, invalidating the
    /// cache as they change. Errors are logged and retried with backoff, forever.
    pub fn watch(&self) -> impl Future<Output = ()> + Send + 'static {
        let locks = self.watch_kind::<Lock>(|s| &s.locks_synced);
        let cluster_locks = self.watch_kind::<ClusterLock>(|s| &s.cluster_locks_synced);
        async move {
            futures::future::join(locks, cluster_locks).await;
        }
    }

    fn watch_kind<K>(
        &self,
        synced: fn(&Shared) -> &AtomicBool,
    ) -> impl Future<Output = ()> + Send + 'static
    where
        K: kube::Resource<DynamicType = ()>
            + Clone
            + std::fmt::Debug
            + serde::de::DeserializeOwned
            + Send
            + Sync
            + 'static,
    {
        // Lock is namespaced; Api::all lists it across namespaces, as it does ClusterLocks.
        let api: Api<K> = Api::all(self.shared.client.clone());
        let shared = self.shared.clone();
        async move {
            let kind = K::kind(&());
            let mut stream = watcher(api, watcher::Config::default())
                .default_backoff()
                .boxed();
            loop {
                match stream.try_next().await {
                    Ok(Some(event)) => shared.on_event(&event, synced(&shared), &kind).await,
                    Ok(None) => {
                        warn!(%kind, "lock watch ended");
                        return;
                    }
                    Err(error) => {
                        shared.stats.watch_errors.fetch_add(1, Ordering::Relaxed);
                        warn!(%kind, %error, "lock watch failed; retrying with backoff");
                        // Keep polling: the backoff stream restarts the watch.
                        continue;
                    }
                }
            }
        }
    }

    async fn load(shared: Arc<Shared>, namespace: String) -> Result<Arc<Entry>, LookupError> {
        let generation = shared.generation.load(Ordering::SeqCst);
        shared.stats.lists.fetch_add(1, Ordering::Relaxed);
        let client = shared.client.clone();
        let params = ListParams::default();
        let set: LockSet = if namespace.is_empty() {
            Api::<ClusterLock>::all(client)
                .list(&params)
                .await
                .map_err(|e| lookup_error(CLUSTER_LOCKS, "", e))?
                .items
                .into_iter()
                .map(|l| LockRef::cluster_lock(&l.name_any(), l.spec.into()))
                .collect()
        } else {
            Api::<Lock>::namespaced(client, &namespace)
                .list(&params)
                .await
                .map_err(|e| lookup_error(LOCKS, &namespace, e))?
                .items
                .into_iter()
                .map(|l| LockRef::lock(&namespace, &l.name_any(), l.spec))
                .collect()
        };
        debug!(%namespace, locks = set.len(), "loaded locks");
        Ok(Arc::new(Entry {
            locks: if set.is_empty() {
                LockSet::empty()
            } else {
                Arc::new(set)
            },
            generation,
        }))
    }
}

impl Shared {
    async fn on_event<K: kube::Resource + ResourceExt>(
        &self,
        event: &watcher::Event<K>,
        synced: &AtomicBool,
        kind: &str,
    ) {
        self.stats.events.fetch_add(1, Ordering::Relaxed);
        match event {
            watcher::Event::Apply(obj) | watcher::Event::Delete(obj) => {
                let namespace = obj.namespace().unwrap_or_default();
                let generation = self.generation.fetch_add(1, Ordering::SeqCst) + 1;
                self.last_event.insert(namespace.clone(), generation);
                self.cache.invalidate(&namespace).await;
                debug!(%kind, %namespace, name = %obj.name_any(), "lock changed; namespace invalidated");
            }
            watcher::Event::Init | watcher::Event::InitApply(_) => {}
            watcher::Event::InitDone => {
                // Events may have been missed while the watch was down: forget everything.
                let generation = self.generation.fetch_add(1, Ordering::SeqCst) + 1;
                self.relisted.store(generation, Ordering::SeqCst);
                self.cache.invalidate_all();
                if !synced.swap(true, Ordering::SeqCst) {
                    info!(%kind, "lock watch synced");
                } else {
                    info!(%kind, "lock watch re-listed; cache cleared");
                }
            }
        }
    }

    fn is_current(&self, namespace: &str, entry: &Entry) -> bool {
        let last_event = self.last_event.get(namespace).unwrap_or(0);
        let relisted = self.relisted.load(Ordering::SeqCst);
        entry.generation >= last_event.max(relisted)
    }
}

impl LockSource for KubeSource {
    fn locks(&self, namespace: &str) -> BoxFuture<'_, Result<Arc<LockSet>, LookupError>> {
        let namespace = namespace.to_owned();
        Box::pin(async move {
            let shared = &self.shared;
            shared.stats.lookups.fetch_add(1, Ordering::Relaxed);
            for _ in 0..MAX_RELOADS {
                let entry = shared
                    .cache
                    .try_get_with(
                        namespace.clone(),
                        KubeSource::load(shared.clone(), namespace.clone()),
                    )
                    .await
                    .map_err(|e| (*e).clone())?;
                if shared.is_current(&namespace, &entry) {
                    return Ok(entry.locks.clone());
                }
                shared.cache.invalidate(&namespace).await;
            }
            // Events keep overtaking the loads: serve a load that is fresh as of now.
            KubeSource::load(shared.clone(), namespace)
                .await
                .map(|e| e.locks.clone())
        })
    }

    fn is_ready(&self) -> bool {
        self.shared.locks_synced.load(Ordering::SeqCst)
            && self.shared.cluster_locks_synced.load(Ordering::SeqCst)
    }

    fn describe(&self) -> String {
        "the Kubernetes API".to_owned()
    }
}

fn lookup_error(resource: &'static str, namespace: &str, error: kube::Error) -> LookupError {
    let scope = if namespace.is_empty() {
        String::new()
    } else {
        format!(" in namespace \"{namespace}\"")
    };
    match error {
        kube::Error::Api(status) if status.code == 403 => LookupError::Forbidden {
            resource,
            scope,
            message: status.message.clone(),
        },
        kube::Error::Api(status) => LookupError::Api {
            resource,
            scope,
            message: format!("{} ({}): {}", status.code, status.reason, status.message),
        },
        other => LookupError::Api {
            resource,
            scope,
            message: other.to_string(),
        },
    }
}
