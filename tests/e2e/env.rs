//! Where the suite's inputs come from: the cluster, kubectl, the binaries, the webhook mode.
//! Anything missing that a fresh machine lacks is a [`Skip`], never a failure.

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use crate::harness::Harness;
use crate::kubectl::Kubectl;

/// Why the suite does not run here; printed as `e2e: skipped: <reason>`.
pub struct Skip(pub String);

/// Who runs the webhook.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum WebhookMode {
    /// The suite starts `serve` and registers it (the default).
    Own,
    /// Already running and registered (`KOL_E2E_WEBHOOK=external`): lock checks only.
    External,
}

/// The resolved settings.
pub struct Config {
    pub kubeconfig: PathBuf,
    pub kubectl: Kubectl,
    pub server_bin: PathBuf,
    pub plugin_bin: PathBuf,
    pub mode: WebhookMode,
    /// Set when the cluster is the local control plane, whose scripts can restart it.
    pub harness: Option<Harness>,
    pub tries: usize,
    pub jobs: usize,
}

fn var(name: &str) -> Option<String> {
    std::env::var(name).ok().filter(|v| !v.is_empty())
}

fn home() -> Option<PathBuf> {
    var("HOME").map(PathBuf::from)
}

/// The control plane's directory (`$HARNESS` as its scripts read it, else the default).
pub fn harness_dir() -> Option<PathBuf> {
    var("HARNESS")
        .map(PathBuf::from)
        .or_else(|| home().map(|h| h.join(".cache/control-plane")))
}

fn on_path(name: &str) -> Option<PathBuf> {
    let path = std::env::var_os("PATH")?;
    std::env::split_paths(&path)
        .map(|dir| dir.join(name))
        .find(|p| p.is_file())
}

impl Config {
    /// Reads the environment; `Err` when the suite must skip (or, for a setting that names
    /// something absent, fail: that is a mistake, not a fresh machine).
    pub fn discover() -> Result<Result<Config, Skip>, String> {
        let default_kubeconfig = harness_dir().map(|d| d.join("kubeconfig"));
        let kubeconfig = match var("KOL_E2E_KUBECONFIG") {
            Some(path) => {
                let path = PathBuf::from(path);
                if !path.is_file() {
                    return Err(format!(
                        "KOL_E2E_KUBECONFIG={}: no such file",
                        path.display()
                    ));
                }
                path
            }
            None => match default_kubeconfig.filter(|p| p.is_file()) {
                Some(path) => path,
                None => {
                    return Ok(Err(Skip(
                        "no cluster: KOL_E2E_KUBECONFIG is unset and ~/.cache/control-plane/kubeconfig does not exist".into(),
                    )));
                }
            },
        };

        // The local control plane's own kubectl first when it is the cluster: kubectl supports
        // one minor version of skew, and the one on PATH may be older.
        let local_kubectl = Harness::detect(&kubeconfig)
            .map(|h| h.dir.join("bin/kubectl"))
            .filter(|p| p.is_file());
        let kubectl_bin = match var("KOL_E2E_KUBECTL") {
            Some(bin) => PathBuf::from(bin),
            None => match local_kubectl.or_else(|| on_path("kubectl")).or_else(|| {
                harness_dir()
                    .map(|d| d.join("bin/kubectl"))
                    .filter(|p| p.is_file())
            }) {
                Some(bin) => bin,
                None => {
                    return Ok(Err(Skip(
                        "no kubectl on PATH nor in ~/.cache/control-plane/bin (KOL_E2E_KUBECTL)"
                            .into(),
                    )));
                }
            },
        };

        let (server_bin, plugin_bin) = match var("KOL_E2E_BIN_DIR") {
            Some(dir) => {
                // Absolute: the plugin is reached through symlinks in another directory.
                let dir = std::path::absolute(PathBuf::from(dir))
                    .map_err(|e| format!("KOL_E2E_BIN_DIR: {e}"))?;
                let pair = (dir.join("kube-object-lock"), dir.join("kubectl-lock"));
                for bin in [&pair.0, &pair.1] {
                    if !bin.is_file() {
                        return Err(format!(
                            "KOL_E2E_BIN_DIR={}: {} is missing (cargo build --release)",
                            dir.display(),
                            bin.display()
                        ));
                    }
                }
                pair
            }
            None => (
                PathBuf::from(env!("CARGO_BIN_EXE_kube-object-lock")),
                PathBuf::from(env!("CARGO_BIN_EXE_kubectl-lock")),
            ),
        };
        let mode = match var("KOL_E2E_WEBHOOK").as_deref() {
            None => WebhookMode::Own,
            Some("external") => WebhookMode::External,
            Some(other) => {
                return Err(format!(
                    "KOL_E2E_WEBHOOK={other}: the only value is `external`"
                ));
            }
        };
        let number = |name: &str, default: usize| -> Result<usize, String> {
            match var(name) {
                None => Ok(default),
                Some(v) => v
                    .parse::<usize>()
                    .ok()
                    .filter(|n| *n > 0)
                    .ok_or_else(|| format!("{name}={v}: a positive number")),
            }
        };
        let tries = number("KOL_E2E_TRIES", 20)?;
        let jobs = number("KOL_E2E_JOBS", 4)?;

        let kubectl = Kubectl::new(kubectl_bin, kubeconfig.clone());
        if let Err(why) = ready(&kubectl, Duration::from_secs(5)) {
            return Ok(Err(Skip(format!(
                "the API server of {} does not answer /readyz: {why}",
                kubeconfig.display()
            ))));
        }
        let harness = Harness::detect(&kubeconfig);
        Ok(Ok(Config {
            kubeconfig,
            kubectl,
            server_bin,
            plugin_bin,
            mode,
            harness,
            tries,
            jobs,
        }))
    }
}

/// Waits up to `within` for `/readyz` to say `ok`.
pub fn ready(kubectl: &Kubectl, within: Duration) -> Result<(), String> {
    let deadline = Instant::now() + within;
    loop {
        let out = kubectl.run(&["get", "--raw", "/readyz", "--request-timeout=3s"]);
        if out.ok() && out.stdout.trim() == "ok" {
            return Ok(());
        }
        if Instant::now() >= deadline {
            let why = if out.stderr.trim().is_empty() {
                out.stdout.trim().to_owned()
            } else {
                out.stderr.trim().to_owned()
            };
            return Err(why.lines().last().unwrap_or("no answer").to_owned());
        }
        std::thread::sleep(Duration::from_millis(250));
    }
}

/// The canonical form of a path, or the path itself.
pub fn canonical(path: &Path) -> PathBuf {
    path.canonicalize().unwrap_or_else(|_| path.to_owned())
}
