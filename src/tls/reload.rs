//! Certificate rotation without a restart: poll the files (and re-read on SIGHUP), swap in a pair
//! only when its bytes changed and it checks. Invariant: on failure the last good pair keeps
//! serving; `max_failures` failures in a row make `/healthz` unhealthy.

use std::path::PathBuf;
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tracing::{error, info, warn};

use super::{CertStore, TlsError, load_pair};

#[derive(Debug)]
pub enum Reload {
    /// The files hold the bytes already served.
    Unchanged,
    Replaced,
    /// The new files are unusable; the previous pair is still served.
    Failed(TlsError),
}

/// Watches a certificate and key file and keeps a [`CertStore`] up to date.
#[derive(Debug)]
pub struct Reloader {
    cert: PathBuf,
    key: PathBuf,
    store: Arc<CertStore>,
    /// The bytes of the pair being served.
    served: Mutex<(Vec<u8>, Vec<u8>)>,
    failures: AtomicU32,
    max_failures: u32,
}

impl Reloader {
    /// A reloader for the pair currently in `store`, read from these files.
    pub fn new(cert: PathBuf, key: PathBuf, store: Arc<CertStore>, max_failures: u32) -> Self {
        let served = (
            std::fs::read(&cert).unwrap_or_default(),
            std::fs::read(&key).unwrap_or_default(),
        );
        Reloader {
            cert,
            key,
            store,
            served: Mutex::new(served),
            failures: AtomicU32::new(0),
            max_failures,
        }
    }

    /// Reads the files and swaps the pair in when their bytes changed and they are usable.
    pub fn reload(&self) -> Reload {
        let read = |path: &PathBuf, what| {
            std::fs::read(path).map_err(|e| TlsError::Read {
                what,
                path: path.clone(),
                message: e.to_string(),
            })
        };
        let bytes =
            read(&self.cert, "certificate").and_then(|c| Ok((c, read(&self.key, "private key")?)));
        let mut served = self.served.lock().unwrap_or_else(|e| e.into_inner());
        let outcome = match bytes {
            Ok(bytes) if bytes == *served => Reload::Unchanged,
            Ok(bytes) => match load_pair(&self.cert, &self.key) {
                Ok(pair) => {
                    self.store.replace(pair);
                    *served = bytes;
                    Reload::Replaced
                }
                Err(e) => Reload::Failed(e),
            },
            Err(e) => Reload::Failed(e),
        };
        match &outcome {
            // The files hold what is served again (a bad rotation undone): nothing is failing.
            Reload::Unchanged => {
                if self.failures.swap(0, Ordering::SeqCst) > 0 {
                    info!(cert = %self.cert.display(), "the certificate files match the served pair again");
                }
            }
            Reload::Replaced => {
                self.failures.store(0, Ordering::SeqCst);
                info!(cert = %self.cert.display(), "serving certificate reloaded");
            }
            Reload::Failed(e) => {
                let failures = self.failures.fetch_add(1, Ordering::SeqCst) + 1;
                if failures >= self.max_failures {
                    error!(error = %e, failures, "serving certificate reload keeps failing; still serving the previous certificate");
                } else {
                    warn!(error = %e, failures, "serving certificate reload failed; still serving the previous certificate");
                }
            }
        }
        outcome
    }

    /// `Err` with the reason once `max_failures` reloads in a row have failed.
    pub fn health(&self) -> Result<(), String> {
        let failures = self.failures.load(Ordering::SeqCst);
        if failures >= self.max_failures {
            Err(format!(
                "the last {failures} reloads of {} failed",
                self.cert.display()
            ))
        } else {
            Ok(())
        }
    }

    /// Polls every `interval`, and at once whenever `nudge` yields (SIGHUP), until dropped;
    /// `report` sees every outcome (the systemd status line follows failures and recoveries).
    pub async fn run(
        self: Arc<Self>,
        interval: Duration,
        mut nudge: tokio::sync::mpsc::Receiver<()>,
        report: impl Fn(&Reload) + Send + Sync + 'static,
    ) {
        let report = Arc::new(report);
        let mut ticker = tokio::time::interval(interval);
        ticker.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        ticker.tick().await;
        loop {
            tokio::select! {
                _ = ticker.tick() => {}
                Some(()) = nudge.recv() => info!("reloading the serving certificate (SIGHUP)"),
            }
            let (this, report) = (self.clone(), report.clone());
            if let Err(e) = tokio::task::spawn_blocking(move || report(&this.reload())).await {
                error!(error = %e, "certificate reload task failed");
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cli::certs::{CertsRequest, generate};

    fn pair(dir: &std::path::Path) {
        generate(&CertsRequest {
            out: dir.to_owned(),
            sans: vec![],
            days: 1,
            ca_days: 1,
            force: true,
            client: false,
        })
        .expect("certs");
    }

    #[test]
    fn swaps_good_pairs_and_keeps_the_last_good_one() {
        let dir = tempfile::tempdir().expect("tempdir");
        pair(dir.path());
        let cert = dir.path().join("tls.crt");
        let key = dir.path().join("tls.key");
        let store = CertStore::new(load_pair(&cert, &key).expect("pair"));
        let reloader = Reloader::new(cert.clone(), key.clone(), store.clone(), 2);
        assert!(matches!(reloader.reload(), Reload::Unchanged));

        let first = store.current();
        pair(dir.path());
        assert!(matches!(reloader.reload(), Reload::Replaced));
        let second = store.current();
        assert_ne!(first.cert, second.cert);

        // A key from another pair: refused, the second pair keeps serving.
        std::fs::copy(dir.path().join("ca.key"), &key).expect("copy");
        assert!(matches!(
            reloader.reload(),
            Reload::Failed(TlsError::Pair { .. })
        ));
        assert_eq!(store.current().cert, second.cert);
        assert!(
            reloader.health().is_ok(),
            "one failure is not yet unhealthy"
        );
        std::fs::write(&cert, "garbage").expect("write");
        assert!(matches!(reloader.reload(), Reload::Failed(_)));
        let unhealthy = reloader.health().expect_err("two failures");
        assert!(unhealthy.contains("tls.crt"), "{unhealthy}");
        assert_eq!(store.current().cert, second.cert);

        pair(dir.path());
        assert!(matches!(reloader.reload(), Reload::Replaced));
        assert!(reloader.health().is_ok(), "a good reload heals");
    }

    #[test]
    fn putting_the_served_files_back_heals() {
        let dir = tempfile::tempdir().expect("tempdir");
        pair(dir.path());
        let cert = dir.path().join("tls.crt");
        let key = dir.path().join("tls.key");
        let store = CertStore::new(load_pair(&cert, &key).expect("pair"));
        let reloader = Reloader::new(cert.clone(), key.clone(), store.clone(), 1);
        let good = std::fs::read(&cert).expect("read");
        std::fs::write(&cert, "garbage").expect("write");
        assert!(matches!(reloader.reload(), Reload::Failed(_)));
        assert!(reloader.health().is_err());
        std::fs::write(&cert, good).expect("write");
        assert!(matches!(reloader.reload(), Reload::Unchanged));
        assert!(
            reloader.health().is_ok(),
            "the served pair is on disk again"
        );
    }
}
