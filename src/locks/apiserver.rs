//! Lock lookups from the API server: from the watch-fed index while it is trusted, else a LIST of
//! the namespace through a moka cache. Invariant: a fallback answer is reused only by lookups that
//! arrived at most `cache.ttl` after its LIST started, and never across a return of the index to
//! fresh.

use std::sync::Arc;
use std::time::{Duration, Instant};

use futures::future::BoxFuture;
use kube::Client;
use kube::api::{Api, DynamicObject, ListParams};
use moka::future::Cache;
use tracing::debug;

use super::index::LockIndex;
use super::liveness;
use super::watch::KindWatch;
use super::{LockCounts, LockKind, LockSet, LockSource, LookupError, parse};
use crate::api::{CLUSTER_LOCKS, LOCKS};
use crate::metrics::{ApiLabels, CacheLabels, SourceMetrics};

/// How many times a read reloads an entry that keeps landing too old.
const MAX_RELOADS: usize = 3;
/// How long fallback entries stay in memory when `cache.ttl` is zero; they are not reused then,
/// except by lookups that arrived while their LIST ran.
const MIN_RETENTION: Duration = Duration::from_secs(1);

#[derive(Debug, Clone, Copy)]
pub struct CacheConfig {
    /// How long after a fallback LIST of a namespace started a lookup may still reuse it; zero:
    /// only lookups that arrived before it started.
    pub ttl: Duration,
    pub max_namespaces: u64,
    /// How long the index is trusted while its watch reconnects after a clean end.
    pub stale_after: Duration,
}

#[derive(Debug)]
struct Entry {
    locks: Arc<LockSet>,
    /// The index's freshness epoch when the LIST started.
    epoch: u64,
    /// When the LIST was sent.
    started: Instant,
}

struct Shared {
    client: Client,
    index: Arc<LockIndex>,
    cache: Cache<String, Arc<Entry>>,
    ttl: Duration,
    metrics: SourceMetrics,
}

/// The production lock source.
#[derive(Clone)]
pub struct KubeSource {
    shared: Arc<Shared>,
}

impl KubeSource {
    /// A source reading through `client`. Call [`KubeSource::watch`] to feed the index; until
    /// then every lookup LISTs.
    pub fn new(client: Client, config: CacheConfig, metrics: SourceMetrics) -> Self {
        let cache = Cache::builder()
            .max_capacity(config.max_namespaces)
            .time_to_live(config.ttl.max(MIN_RETENTION))
            .build();
        KubeSource {
            shared: Arc::new(Shared {
                client,
                index: Arc::new(LockIndex::new(config.stale_after)),
                cache,
                ttl: config.ttl,
                metrics,
            }),
        }
    }

    pub fn metrics(&self) -> &SourceMetrics {
        &self.shared.metrics
    }

    pub fn index(&self) -> &Arc<LockIndex> {
        &self.shared.index
    }

    /// Lists and watches Locks and ClusterLocks into the index, beside the liveness probe
    /// ([`super::liveness`]), until dropped.
    pub fn watch(&self) -> impl Future<Output = ()> + Send + 'static + use<> {
        let (probe, silence) = liveness::probe(self.shared.client.clone());
        let watch = |kind| KindWatch {
            api: KindWatch::api(self.shared.client.clone(), kind),
            kind,
            index: self.shared.index.clone(),
            metrics: self.shared.metrics.clone(),
            silence: silence.clone(),
        };
        let locks = watch(LockKind::Lock).run();
        let cluster_locks = watch(LockKind::ClusterLock).run();
        async move {
            futures::future::join3(locks, cluster_locks, probe.run()).await;
        }
    }

    async fn load(shared: Arc<Shared>, namespace: String) -> Result<Arc<Entry>, LookupError> {
        let epoch = shared.index.stale_epoch();
        let started = Instant::now();
        shared.metrics.cache_loads.inc();
        let (kind, resource, api) = if namespace.is_empty() {
            let ar = LockKind::ClusterLock.api_resource();
            let api = Api::<DynamicObject>::all_with(shared.client.clone(), &ar);
            (LockKind::ClusterLock, CLUSTER_LOCKS, api)
        } else {
            let ar = LockKind::Lock.api_resource();
            let api = Api::<DynamicObject>::namespaced_with(shared.client.clone(), &namespace, &ar);
            (LockKind::Lock, LOCKS, api)
        };
        let listed = api.list(&ListParams::default()).await.map(|list| {
            list.items
                .iter()
                .filter_map(|object| parse::lock_ref(kind, object))
                .collect::<LockSet>()
        });
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
        debug!(%namespace, locks = set.len(), "listed locks (fallback)");
        Ok(Arc::new(Entry {
            locks: if set.is_empty() {
                LockSet::empty()
            } else {
                Arc::new(set)
            },
            epoch,
            started,
        }))
    }

    /// A lookup while the index cannot answer: LIST through the cache.
    async fn fallback(&self, namespace: String) -> Result<Arc<LockSet>, LookupError> {
        let shared = &self.shared;
        let arrived = Instant::now();
        // Recent enough for this lookup: started at most `ttl` before it arrived (with a zero
        // TTL, after), and since the index was last fresh.
        let current = |entry: &Entry| {
            entry.epoch == shared.index.stale_epoch()
                && arrived.saturating_duration_since(entry.started) <= shared.ttl
        };
        if let Some(entry) = shared.cache.get(&namespace).await
            && current(&entry)
        {
            shared.count("hit");
            return Ok(entry.locks.clone());
        }
        let mut counted = false;
        for _ in 0..MAX_RELOADS {
            let entry = shared
                .cache
                .entry(namespace.clone())
                .or_try_insert_with(KubeSource::load(shared.clone(), namespace.clone()))
                .await
                .map_err(|e| (*e).clone())?;
            let fresh = entry.is_fresh();
            let entry = entry.into_value();
            if current(&entry) {
                if !counted {
                    // Another lookup's LIST, started after this one arrived: shared.
                    shared.count(if fresh { "miss" } else { "hit" });
                }
                return Ok(entry.locks.clone());
            }
            if !counted {
                shared.count("miss");
                counted = true;
            }
            shared.cache.invalidate(&namespace).await;
        }
        // The index keeps changing state under the loads: serve a load that is fresh as of now.
        KubeSource::load(shared.clone(), namespace)
            .await
            .map(|e| e.locks.clone())
    }
}

impl Shared {
    fn count(&self, result: &'static str) {
        self.metrics
            .cache_requests
            .get_or_create(&CacheLabels { result })
            .inc();
    }
}

impl LockSource for KubeSource {
    fn locks(&self, namespace: &str) -> BoxFuture<'_, Result<Arc<LockSet>, LookupError>> {
        if let Some(set) = self.shared.index.get(namespace) {
            return Box::pin(std::future::ready(Ok(set)));
        }
        Box::pin(self.fallback(namespace.to_owned()))
    }

    fn locks_at_hand(&self, namespace: &str) -> Option<Arc<LockSet>> {
        self.shared.index.get(namespace)
    }

    fn is_ready(&self) -> bool {
        self.shared.index.is_fresh()
    }

    fn readiness(&self) -> Result<(), String> {
        if self.is_ready() {
            return Ok(());
        }
        let mut why = Vec::new();
        for (label, kind) in [
            ("Lock", LockKind::Lock),
            ("ClusterLock", LockKind::ClusterLock),
        ] {
            let health = self.shared.index.health(kind);
            if !health.is_fresh(self.shared.index.stale_after()) {
                why.push(format!(
                    "{label} watch {} for {:.1?}{}",
                    health.state.as_str(),
                    health.since.elapsed(),
                    health.reason.map(|r| format!(" ({r})")).unwrap_or_default()
                ));
            }
        }
        Err(format!(
            "lock index is stale, lookups LIST the API server: {}",
            why.join("; ")
        ))
    }

    fn describe(&self) -> String {
        "the Kubernetes API".to_owned()
    }

    fn lock_counts(&self) -> LockCounts {
        self.shared.index.counts()
    }

    fn index(&self) -> Option<Arc<LockIndex>> {
        Some(self.shared.index.clone())
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
