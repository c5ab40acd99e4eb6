//! Wiring for `serve` and `check`: settings in, a running webhook out. Invariant: the lock
//! source is chosen once (a locks directory if set, else the cluster; a configured but unreachable
//! cluster never falls back to files), and start-up never waits for the API server.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use futures::FutureExt;
use tokio::net::TcpListener;
use tokio::sync::mpsc;
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;
use tokio_util::task::{AbortOnDropHandle, TaskTracker};
use tracing::{info, warn};

use crate::admission::Reviewer;
use crate::admission::labels::apiserver::KubeLabels;
use crate::events::Reporting;
use crate::kubeconfig::{self, KubeconfigError};
use crate::locks::LockSource;
use crate::locks::apiserver::{CacheConfig, KubeSource};
use crate::locks::files::{FilesError, FilesSource};
use crate::metrics::{Metrics, ScopeLabels, SourceMetrics};
use crate::registration::conditions::NarrowingBounds;
use crate::registration::writer::{Narrower, NarrowerConfig};
use crate::server::{self, Drain};
use crate::settings::Settings;
use crate::systemd;
use crate::tls::reload::{Reload, Reloader};
use crate::tls::{self, CertStore, TlsError};

/// A serving certificate closer than this to its end is warned about at start.
const EXPIRY_WARNING_DAYS: i64 = 30;

#[derive(Debug, thiserror::Error)]
pub enum StartError {
    #[error(
        "no lock source: no cluster is configured ({0}) and no locks directory is set; pass --kubeconfig FILE (or set KUBECONFIG) to read Locks from a cluster, or --locks-dir DIR to read them from files"
    )]
    NoSource(String),
    #[error("--kubeconfig (kube.kubeconfig) and --locks-dir (locks.dir) are alternatives: set one")]
    TwoSources,
    #[error("cannot use kubeconfig{path}: {message}")]
    Kubeconfig { path: String, message: String },
    #[error(transparent)]
    Files(#[from] FilesError),
    #[error(
        "no serving certificate: pass --tls-cert FILE --tls-key FILE (or set tls.cert and tls.key); `kube-object-lock certs --out DIR` makes a pair"
    )]
    NoCertificate,
    #[error(transparent)]
    Tls(#[from] TlsError),
    #[error("instance.name: {0}")]
    Instance(String),
    #[error(transparent)]
    PassedSocket(#[from] systemd::PassedSocketError),
    #[error("cannot listen on {addr} (set by {key}{})", crate::settings::flag_of(key).map(|f| format!(" or {f}")).unwrap_or_default())]
    Bind {
        key: &'static str,
        addr: SocketAddr,
        source: std::io::Error,
    },
}

/// How long withdrawing from lock status and writing the last events may delay the exit.
const REPORTING_GRACE: Duration = Duration::from_secs(2);

/// A lock source and the task keeping it fresh.
pub struct Source {
    pub source: Arc<dyn LockSource>,
    /// The watch or poll task, if any; abort it to stop.
    pub refresh: Option<JoinHandle<()>>,
    pub client: Option<kube::Client>,
}

/// Builds the configured lock source. `refresh: false` skips the watch (one-shot `check`).
pub async fn lock_source(
    settings: &Settings,
    refresh: bool,
    metrics: SourceMetrics,
) -> Result<Source, StartError> {
    if let Some(dir) = &settings.locks.dir {
        if settings.kube.kubeconfig.is_some() {
            return Err(StartError::TwoSources);
        }
        let (files, report) = FilesSource::open(dir.clone())?;
        info!(dir = %dir.display(), locks = report.locks, "reading locks from files");
        let files = Arc::new(files);
        let refresh =
            refresh.then(|| tokio::spawn(files.clone().watch(settings.locks.poll_interval)));
        return Ok(Source {
            source: files,
            refresh,
            client: None,
        });
    }
    let client = kube_client(settings).await?;
    let source = KubeSource::new(
        client.clone(),
        CacheConfig {
            ttl: settings.cache.ttl,
            max_namespaces: settings.cache.max_namespaces,
            stale_after: settings.kube.stale_after,
        },
        metrics,
    );
    let refresh = refresh.then(|| tokio::spawn(source.watch()));
    Ok(Source {
        source: Arc::new(source),
        refresh,
        client: Some(client),
    })
}

impl From<KubeconfigError> for StartError {
    fn from(error: KubeconfigError) -> Self {
        let (path, message) = match error {
            KubeconfigError::NoConfig(message) => return StartError::NoSource(message),
            KubeconfigError::File { path, message } => (format!(" {}", path.display()), message),
            KubeconfigError::Context(message) => (String::new(), message),
        };
        StartError::Kubeconfig { path, message }
    }
}

async fn kube_client(settings: &Settings) -> Result<kube::Client, StartError> {
    let (path, context) = (&settings.kube.kubeconfig, &settings.kube.context);
    let config = kubeconfig::load(path.as_deref(), context.as_deref()).await?;
    info!(cluster = %config.cluster_url, "reading locks from the cluster");
    kubeconfig::client(config, ToString::to_string).map_err(|message| StartError::Kubeconfig {
        path: (path.as_ref().map(|path| format!(" {}", path.display()))).unwrap_or_default(),
        message,
    })
}

/// A webhook bound to its address, ready to run.
pub struct Webhook {
    listener: TcpListener,
    tls: Arc<rustls::ServerConfig>,
    certs: Arc<CertStore>,
    reloader: Arc<Reloader>,
    source: Source,
    settings: Settings,
    metrics: Arc<Metrics>,
    metrics_listener: Option<TcpListener>,
    reporting: Option<Reporting>,
    narrower: Option<Narrower>,
}

impl Webhook {
    /// Fails fast on every configuration problem, before any request is served. With `given`
    /// (the caller's lock source) nothing is written to the cluster.
    pub async fn bind(
        settings: Settings,
        given: Option<Source>,
        metrics: Arc<Metrics>,
    ) -> Result<Webhook, StartError> {
        let (Some(cert), Some(key)) = (&settings.tls.cert, &settings.tls.key) else {
            return Err(StartError::NoCertificate);
        };
        // The certificate first: it fails faster and more often than the source.
        let pair = tls::load_pair(cert, key)?;
        let info = tls::check_covers_url(&pair, &settings.webhook.url)?;
        let days_left =
            (info.not_after - time::OffsetDateTime::now_utc().unix_timestamp()) / 86_400;
        if days_left < EXPIRY_WARNING_DAYS {
            warn!(cert = %cert.display(), days_left, "the serving certificate expires soon; replace the files (they are reloaded without a restart)");
        }
        let certs = CertStore::new(pair);
        let tls = tls::server_config(certs.clone(), settings.tls.client_ca.as_deref())?;
        let reloader = Arc::new(Reloader::new(
            cert.clone(),
            key.clone(),
            certs.clone(),
            settings.tls.max_reload_failures,
        ));
        let built = given.is_none();
        let source = match given {
            Some(source) => source,
            None => lock_source(&settings, true, metrics.source.clone()).await?,
        };
        let addr = settings.server.listen;
        let bind_error = |key, addr| move |source| StartError::Bind { key, addr, source };
        let listener = match systemd::passed_listener(addr)? {
            Some(passed) => TcpListener::from_std(passed),
            None => TcpListener::bind(addr).await,
        }
        .map_err(bind_error("server.listen", addr))?;
        let metrics_listener = match settings.metrics.addr() {
            Some(addr) => Some(
                TcpListener::bind(addr)
                    .await
                    .map_err(bind_error("metrics.listen", addr))?,
            ),
            None => None,
        };
        let (mut narrower, mut reporting) = (None, None);
        match source.client.clone().zip(source.source.index()) {
            Some((client, index)) if built => {
                let config = NarrowerConfig {
                    name: settings.registration.name.clone(),
                    limits: NarrowingBounds {
                        max_names: settings.registration.max_names,
                        ..NarrowingBounds::default()
                    },
                };
                narrower = (settings.registration.narrow)
                    .then(|| Narrower::new(client.clone(), config, metrics.registration.clone()));
                if narrower.is_none() {
                    info!(
                        "the webhook configuration is not narrowed (registration.narrow = false)"
                    );
                }
                let registered = narrower.as_ref().map(Narrower::registered);
                let instance = crate::settings::instance_name(&settings.instance.name)
                    .map_err(StartError::Instance)?;
                info!(%instance, "writing lock status and refusal events as this instance");
                let enforcement = metrics.enforcement.clone();
                reporting = Some(Reporting::start(
                    client,
                    instance,
                    enforcement,
                    index,
                    registered,
                ));
            }
            _ if built => info!(
                "the webhook configuration is not narrowed, and no lock status or events are written (a locks directory)"
            ),
            _ => {}
        }
        Ok(Webhook {
            listener,
            tls,
            certs,
            reloader,
            source,
            settings,
            metrics,
            metrics_listener,
            reporting,
            narrower,
        })
    }

    pub fn local_addr(&self) -> SocketAddr {
        self.listener
            .local_addr()
            .unwrap_or(self.settings.server.listen)
    }

    /// The address metrics are served on, if any.
    pub fn metrics_addr(&self) -> Option<SocketAddr> {
        self.metrics_listener
            .as_ref()
            .and_then(|l| l.local_addr().ok())
    }

    /// Serves until `shutdown` completes, then drains both listeners; reloads the certificate
    /// on its interval and on `reload` (SIGHUP).
    pub async fn run(
        self,
        shutdown: impl Future<Output = ()>,
        reload: mpsc::Receiver<()>,
    ) -> Drain {
        let addr = self.local_addr();
        let Webhook {
            listener,
            tls,
            certs,
            reloader,
            source,
            settings,
            metrics,
            metrics_listener,
            reporting,
            narrower,
        } = self;
        // Background tasks run until serving ends; `serving` ends both listeners at once.
        let (tasks, stop, serving) = (
            TaskTracker::new(),
            CancellationToken::new(),
            CancellationToken::new(),
        );
        let spawn = |task: futures::future::BoxFuture<'static, ()>| {
            tasks.spawn(stop.clone().run_until_cancelled_owned(task));
        };
        if let Some(refresh) = source.refresh {
            // Dropped when cancelled, which aborts it.
            spawn(Box::pin(AbortOnDropHandle::new(refresh).map(drop)));
        }
        if let Some((narrower, index)) = narrower.zip(source.source.index()) {
            spawn(Box::pin(narrower.run(index)));
        }
        let mut reviewer = Reviewer::new(source.source.clone(), settings.review_policy())
            .with_metrics(metrics.admission.clone());
        if let Some(reporting) = &reporting {
            reviewer = reviewer.with_events(reporting.events.clone());
        }
        if let Some(client) = &source.client {
            reviewer = reviewer.with_labels(Arc::new(KubeLabels::new(client.clone())));
        }
        let checked = reloader.clone();
        let health: crate::http::HealthCheck = Arc::new(move || checked.health());
        let probes = crate::http::Probes {
            health: vec![health],
            source: source.source.clone(),
        };
        let state = Arc::new(crate::http::State {
            reviewer,
            max_body_bytes: settings.server.max_body_bytes,
            body_timeout: settings.server.body_timeout,
            probes: probes.clone(),
            invalid: metrics.invalid.clone(),
        });
        let limits = &settings.server;
        let metrics_served = async {
            let Some(listener) = metrics_listener else {
                return Drain::Complete;
            };
            let lock_source = source.source.clone();
            let render: Arc<dyn Fn() -> String + Send + Sync> = Arc::new(move || {
                let counts = lock_source.lock_counts();
                for (scope, count) in [
                    ("namespaced", counts.namespaced),
                    ("cluster", counts.cluster),
                ] {
                    let gauge = metrics.locks.get_or_create(&ScopeLabels { scope });
                    gauge.set(i64::try_from(count).unwrap_or(i64::MAX));
                }
                metrics.certificate_expiry.set(certs.not_after());
                metrics.encode()
            });
            let service = warp::service(crate::http::metrics_routes(render, probes));
            server::serve(listener, None, service, limits, serving.cancelled()).await
        };
        let status = Arc::new(systemd::Status::default());
        let reported = status.clone();
        spawn(Box::pin(reloader.run(
            settings.tls.reload_interval,
            reload,
            move |outcome| match outcome {
                Reload::Failed(e) => reported.problem(Some(format!(
                    "certificate reload failed, still serving the previous certificate: {e}"
                ))),
                Reload::Replaced | Reload::Unchanged => reported.problem(None),
            },
        )));
        spawn(Box::pin(systemd::watchdog()));
        let service = warp::service(crate::http::routes(state));
        let served = server::serve(listener, Some(tls), service, limits, serving.cancelled());
        let described = source.source.describe();
        info!(listen = %addr, source = %described, "serving");
        status.ready(&format!("serving on {addr}, locks from {described}"));
        let signalled = async {
            shutdown.await;
            systemd::stopping();
            serving.cancel();
        };
        let ((), served, metrics_served) = tokio::join!(signalled, served, metrics_served);
        if let Some(reporting) = reporting {
            reporting.stop(REPORTING_GRACE).await;
        }
        stop.cancel();
        tasks.close();
        tasks.wait().await;
        if served == Drain::Complete && metrics_served == Drain::Complete {
            Drain::Complete
        } else {
            Drain::TimedOut
        }
    }
}

/// Forwards SIGHUP; installed before returning, as a SIGHUP's default action ends the process.
pub fn reload_signal() -> mpsc::Receiver<()> {
    use tokio::signal::unix::{SignalKind, signal};
    let (tx, rx) = mpsc::channel(1);
    match signal(SignalKind::hangup()) {
        Ok(mut hup) => {
            tokio::spawn(async move {
                while hup.recv().await.is_some() {
                    // A reload already queued covers this one too.
                    let _ = tx.try_send(());
                }
            });
        }
        Err(e) => {
            warn!(error = %e, "cannot listen for SIGHUP; certificates still reload on their interval")
        }
    }
    rx
}

/// Completes on SIGTERM or SIGINT; installed at the call, so a SIGTERM right after READY=1 drains.
pub fn shutdown_signal() -> impl Future<Output = ()> {
    use tokio::signal::unix::{SignalKind, signal};
    let received = |kind, name: &'static str| {
        let handler = signal(kind);
        Box::pin(async move {
            let Ok(mut handler) = handler.inspect_err(|e| {
                warn!(error = %e, "cannot listen for {name}; only the other signal stops the server")
            }) else {
                return std::future::pending().await;
            };
            handler.recv().await;
            info!("{name} received");
        })
    };
    let (term, int) = (
        received(SignalKind::terminate(), "SIGTERM"),
        received(SignalKind::interrupt(), "SIGINT"),
    );
    futures::future::select(term, int).map(drop)
}
