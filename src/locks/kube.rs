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

use std::collections::HashSet;
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

use super::{LockCounts, LockRef, LockSet, LockSource, LookupError};
use crate::api::{CLUSTER_LOCKS, ClusterLock, LOCKS, Lock};
use crate::metrics::{ApiLabels, CacheLabels, KindLabels, SourceMetrics};

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

/// What the watch of one kind keeps.
#[derive(Default)]
struct KindState {
    synced: AtomicBool,
    known: AtomicU64,
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
    locks: KindState,
    cluster_locks: KindState,
    metrics: SourceMetrics,
}

/// The production lock source.
#[derive(Clone)]
pub struct KubeSource {
    shared: Arc<Shared>,
}

impl KubeSource {
    /// A source reading through `client`. Call [`KubeSource::watch`] to keep it fresh.
    pub fn new(client: Client, config: CacheConfig) -> Self {
        KubeSource::with_metrics(client, config, SourceMetrics::default())
    }

    /// Like [`KubeSource::new`], counting into `metrics`.
    pub fn with_metrics(client: Client, config: CacheConfig, metrics: SourceMetrics) -> Self {
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
                locks: KindState::default(),
                cluster_locks: KindState::default(),
                metrics,
            }),
        }
    }

    /// The source's metrics.
    pub fn metrics(&self) -> &SourceMetrics {
        &self.shared.metrics
    }

    /// Watches Locks and ClusterLocks until the returned future is dropped, invalidating the
    /// cache as they change. Errors are logged and retried with backoff, forever.
    pub fn watch(&self) -> impl Future<Output = ()> + Send + 'static {
        let locks = self.watch_kind::<Lock>("Lock", |s| &s.locks);
        let cluster_locks = self.watch_kind::<ClusterLock>("ClusterLock", |s| &s.cluster_locks);
        async move {
            futures::future::join(locks, cluster_locks).await;
        }
    }

    fn watch_kind<K>(
        &self,
        kind: &'static str,
        state: fn(&Shared) -> &KindState,
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
            let label = KindLabels { kind };
            let mut stream = watcher(api, watcher::Config::default())
                .default_backoff()
                .boxed();
            // Names of the locks in force, and of those being re-listed.
            let mut known: HashSet<String> = HashSet::new();
            let mut listing: HashSet<String> = HashSet::new();
            loop {
                let event = match stream.try_next().await {
                    Ok(Some(event)) => event,
                    Ok(None) => {
                        warn!(%kind, "lock watch ended");
                        return;
                    }
                    Err(error) => {
                        shared.metrics.watch_restarts.get_or_create(&label).inc();
                        warn!(%kind, %error, "lock watch failed; retrying with backoff");
                        // Keep polling: the backoff stream restarts the watch.
                        continue;
                    }
                };
                shared.metrics.watch_events.get_or_create(&label).inc();
                match &event {
                    watcher::Event::Apply(obj) => {
                        known.insert(key(obj));
                        shared
                            .invalidate(&obj.namespace().unwrap_or_default())
                            .await;
                        debug!(%kind, name = %obj.name_any(), "lock applied; namespace invalidated");
                    }
                    watcher::Event::Delete(obj) => {
                        known.remove(&key(obj));
                        shared
                            .invalidate(&obj.namespace().unwrap_or_default())
                            .await;
                        debug!(%kind, name = %obj.name_any(), "lock deleted; namespace invalidated");
                    }
                    watcher::Event::Init => listing.clear(),
                    watcher::Event::InitApply(obj) => {
                        listing.insert(key(obj));
                    }
                    watcher::Event::InitDone => {
                        known = std::mem::take(&mut listing);
                        // Events may have been missed while the watch was down: forget everything.
                        let generation = shared.generation.fetch_add(1, Ordering::SeqCst) + 1;
                        shared.relisted.store(generation, Ordering::SeqCst);
                        shared.cache.invalidate_all();
                        if state(&shared).synced.swap(true, Ordering::SeqCst) {
                            shared.metrics.watch_restarts.get_or_create(&label).inc();
                            info!(%kind, locks = known.len(), "lock watch re-listed; cache cleared");
                        } else {
                            info!(%kind, locks = known.len(), "lock watch synced");
                        }
                    }
                }
                state(&shared)
                    .known
                    .store(known.len() as u64, Ordering::Relaxed);
            }
        }
    }

    async fn load(shared: Arc<Shared>, namespace: String) -> Result<Arc<Entry>, LookupError> {
        let generation = shared.generation.load(Ordering::SeqCst);
        shared.metrics.cache_loads.inc();
        let client = shared.client.clone();
        let params = ListParams::default();
        let (resource, listed) = if namespace.is_empty() {
            let listed = Api::<ClusterLock>::all(client)
                .list(&params)
                .await
                .map(|list| {
                    list.items
                        .into_iter()
                        .map(|l| LockRef::cluster_lock(&l.name_any(), l.spec.into()))
                        .collect::<LockSet>()
                });
            (CLUSTER_LOCKS, listed)
        } else {
            let api = Api::<Lock>::namespaced(client, &namespace);
            let listed = api.list(&params).await.map(|list| {
                list.items
                    .into_iter()
                    .map(|l| LockRef::lock(&namespace, &l.name_any(), l.spec))
                    .collect::<LockSet>()
            });
            (LOCKS, listed)
        };
        let outcome = match &listed {
            Ok(_) => "success",
            Err(kube::Error::Api(s)) if s.code == 403 => "forbidden",
            Err(kube::Error::Api(s)) if s.code >= 500 => "server_error",
            Err(kube::Error::Api(_)) => "client_error",
            Err(_) => "connection",
        };
        let labels = ApiLabels {
            verb: "list",
            resource,
            outcome,
        };
        shared.metrics.api_requests.get_or_create(&labels).inc();
        let set = listed.map_err(|e| lookup_error(resource, &namespace, e))?;
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
    /// Marks `namespace` changed: drops its entry, and makes any LIST already in flight for it
    /// count as stale when it lands.
    async fn invalidate(&self, namespace: &str) {
        let generation = self.generation.fetch_add(1, Ordering::SeqCst) + 1;
        self.last_event.insert(namespace.to_owned(), generation);
        self.cache.invalidate(namespace).await;
    }

    fn is_current(&self, namespace: &str, entry: &Entry) -> bool {
        let last_event = self.last_event.get(namespace).unwrap_or(0);
        let relisted = self.relisted.load(Ordering::SeqCst);
        entry.generation >= last_event.max(relisted)
    }

    fn count(&self, result: &'static str) {
        self.metrics
            .cache_requests
            .get_or_create(&CacheLabels { result })
            .inc();
    }
}

impl LockSource for KubeSource {
    fn locks(&self, namespace: &str) -> BoxFuture<'_, Result<Arc<LockSet>, LookupError>> {
        let namespace = namespace.to_owned();
        Box::pin(async move {
            let shared = &self.shared;
            if let Some(entry) = shared.cache.get(&namespace).await
                && shared.is_current(&namespace, &entry)
            {
                shared.count("hit");
                return Ok(entry.locks.clone());
            }
            shared.count("miss");
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
        self.shared.locks.synced.load(Ordering::SeqCst)
            && self.shared.cluster_locks.synced.load(Ordering::SeqCst)
    }

    fn describe(&self) -> String {
        "the Kubernetes API".to_owned()
    }

    fn lock_counts(&self) -> LockCounts {
        LockCounts {
            namespaced: self.shared.locks.known.load(Ordering::Relaxed),
            cluster: self.shared.cluster_locks.known.load(Ordering::Relaxed),
        }
    }
}

/// `namespace/name` of a lock.
fn key<K: ResourceExt>(obj: &K) -> String {
    format!("{}/{}", obj.namespace().unwrap_or_default(), obj.name_any())
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
