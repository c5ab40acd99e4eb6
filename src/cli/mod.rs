//! The command line: `serve`, `certs`, `crd`, `manifests`, `check`, `completion` and `man`.
//!
//! Flags of `serve` and `check` are the top layer of the settings: each maps to one settings
//! key, so `--lookup-timeout` and `kube.lookup_timeout` cannot disagree about what they mean.

pub mod certs;
pub mod check;
pub mod generate;
pub mod manifests;

use std::path::PathBuf;

use clap::{Args, Parser, Subcommand};

use crate::settings::Layers;

/// Locks Kubernetes objects: a validating admission webhook that refuses UPDATE and DELETE of
/// any object with a Lock (or, cluster-scoped, a ClusterLock) of the same name.
#[derive(Debug, Parser)]
#[command(name = "kube-object-lock", version = crate::VERSION, propagate_version = true)]
pub struct Cli {
    #[command(subcommand)]
    pub command: Command,
}

#[derive(Debug, Subcommand)]
pub enum Command {
    /// Run the webhook: HTTPS on --listen, answering AdmissionReviews on POST /validate.
    ///
    /// Locks come from the cluster (--kubeconfig, KUBECONFIG, ~/.kube/config or the in-cluster
    /// account) or, with --locks-dir, from YAML files. Stops on SIGTERM/SIGINT after finishing
    /// the requests in flight.
    Serve(ServeArgs),
    /// Write a CA (ca.crt, ca.key) and a serving certificate signed by it (tls.crt, tls.key).
    ///
    /// Put ca.crt into the webhook configuration's caBundle. Keys are written mode 0600;
    /// existing files are kept unless --force is given.
    Certs(CertsArgs),
    /// Print the Lock and ClusterLock CustomResourceDefinitions as YAML (for kubectl apply -f -).
    Crd,
    /// Print what registering the webhook needs: CRDs, RBAC and webhook configuration, the API
    /// server's mTLS files, or the static (manifest-based) webhook configuration; or the
    /// Prometheus alert rules watching it.
    #[command(subcommand)]
    Manifests(ManifestsCommand),
    /// Print the AdmissionReview response the server would give to a review read from a file.
    ///
    /// Exit status: 0 allowed, 1 denied, 2 bad input (the review, a flag or a setting), 3 could
    /// not decide: the locks could not be read (a lock file that does not read, a locks
    /// directory or API server that cannot be read; the source is named on stderr).
    Check(CheckArgs),
    /// Print the shell completion script of kube-object-lock.
    ///
    /// bash: `source <(kube-object-lock completion bash)`, or save it as
    /// /usr/share/bash-completion/completions/kube-object-lock; zsh: save it as
    /// `_kube-object-lock` in a directory of $fpath; fish: save it as
    /// ~/.config/fish/completions/kube-object-lock.fish.
    Completion(CompletionArgs),
    /// Write the man pages of kube-object-lock and its subcommands (kube-object-lock.1,
    /// kube-object-lock-serve.1, ...) into DIR, e.g. /usr/local/share/man/man1.
    Man(ManArgs),
}

#[derive(Debug, Args)]
pub struct CompletionArgs {
    /// The shell to complete in.
    #[arg(value_enum, value_name = "SHELL")]
    pub shell: generate::Shell,
}

#[derive(Debug, Args)]
pub struct ManArgs {
    /// The directory to write the pages into (created if missing).
    #[arg(value_name = "DIR")]
    pub dir: PathBuf,
}

#[derive(Debug, Args)]
pub struct ConfigArgs {
    /// TOML settings file (see deploy/kube-object-lock.toml); environment variables
    /// KUBE_OBJECT_LOCK__SECTION__KEY and flags override it.
    #[arg(long, value_name = "FILE")]
    pub config: Option<PathBuf>,
}

#[derive(Debug, Args)]
pub struct ServeArgs {
    #[command(flatten)]
    pub config: ConfigArgs,
    /// Address to listen on, an IP address and port [settings: server.listen; default
    /// 127.0.0.1:8443].
    #[arg(long, value_name = "ADDR")]
    pub listen: Option<String>,
    /// Address of the plain-HTTP /metrics listener, an IP address and port; empty turns it off
    /// (a second instance on one host needs its own) [settings: metrics.listen; default
    /// 127.0.0.1:9464].
    #[arg(long, value_name = "ADDR")]
    pub metrics_listen: Option<String>,
    /// PEM serving certificate [settings: tls.cert].
    #[arg(long, value_name = "FILE", requires = "tls_key")]
    pub tls_cert: Option<PathBuf>,
    /// PEM private key of the serving certificate [settings: tls.key].
    #[arg(long, value_name = "FILE", requires = "tls_cert")]
    pub tls_key: Option<PathBuf>,
    #[command(flatten)]
    pub source: SourceArgs,
}

#[derive(Debug, Args)]
pub struct SourceArgs {
    /// Kubeconfig of the webhook's identity [settings: kube.kubeconfig].
    #[arg(long, value_name = "FILE", conflicts_with = "locks_dir")]
    pub kubeconfig: Option<PathBuf>,
    /// Kubeconfig context [settings: kube.context].
    #[arg(long, value_name = "NAME")]
    pub context: Option<String>,
    /// Read locks from the Lock/ClusterLock YAML files in DIR instead of a cluster
    /// [settings: locks.dir].
    #[arg(long, value_name = "DIR")]
    pub locks_dir: Option<PathBuf>,
}

#[derive(Debug, Clone, Args)]
pub struct CertsArgs {
    /// Directory to write ca.crt, ca.key, tls.crt and tls.key into (created if missing).
    #[arg(long, value_name = "DIR")]
    pub out: PathBuf,
    /// A DNS name or IP address of the serving certificate; repeat for more
    /// [default: 127.0.0.1, ::1, localhost].
    #[arg(long = "san", value_name = "NAME_OR_IP")]
    pub sans: Vec<String>,
    /// Validity of the serving certificate, in days.
    #[arg(long, default_value_t = 365, value_name = "DAYS")]
    pub days: u32,
    /// Validity of the CA, in days.
    #[arg(long, default_value_t = 3650, value_name = "DAYS")]
    pub ca_days: u32,
    /// Overwrite existing files.
    #[arg(long)]
    pub force: bool,
    /// Also write a client CA (client-ca.crt, client-ca.key) and a client certificate for the
    /// API server (apiserver-client.crt, apiserver-client.key), for tls.client_ca (mTLS).
    #[arg(long)]
    pub client: bool,
}

#[derive(Debug, Subcommand)]
pub enum ManifestsCommand {
    /// Everything for `kubectl apply -f -`: the CRDs; the webhook's ClusterRole (read locks,
    /// write their status, record refusal events, read labels, and keep its own webhook
    /// configuration narrowed unless --broad) and its binding; the lock policy (a
    /// ValidatingAdmissionPolicy on who may lock what) and its binding; the
    /// ValidatingWebhookConfiguration; and the unlock ClusterRole, bound to no one.
    Cluster(ClusterArgs),
    /// The API server's side of mTLS: an AdmissionConfiguration (for
    /// --admission-control-config-file) and the kubeconfig holding its client certificate, whose
    /// users[].name is the URL's host:port.
    Apiserver(ApiServerArgs),
    /// The manifest-based webhook configuration to place in the API server's
    /// staticManifestsDir: active before the API serves, not deletable through it (Kubernetes
    /// 1.37: beta, on by default; 1.36: alpha, behind the ManifestBasedAdmissionControlConfig
    /// feature gate).
    Static(RegistrationArgs),
    /// Prometheus alert rules over the webhook's metrics (a rule file), or with
    /// --prometheus-operator the same groups as a PrometheusRule.
    Alerts(AlertsArgs),
}

#[derive(Debug, Args)]
pub struct AlertsArgs {
    /// Print a PrometheusRule (monitoring.coreos.com/v1) instead of a rule file.
    #[arg(long)]
    pub prometheus_operator: bool,
    /// The job label Prometheus gives the webhook's targets.
    #[arg(long, value_name = "NAME", default_value = manifests::alerts::DEFAULT_JOB)]
    pub job: String,
    /// The webhook configuration's timeoutSeconds (as given to manifests cluster): reviews
    /// slower than half of it alert.
    #[arg(long, value_name = "SECONDS", default_value_t = 5)]
    pub timeout_seconds: i32,
    /// The operations guide each alert's runbook_url points into (URL#alert-name).
    #[arg(long, value_name = "URL", default_value = manifests::alerts::DEFAULT_RUNBOOK_URL)]
    pub runbook_url: String,
}

#[derive(Debug, Args)]
pub struct ClusterArgs {
    #[command(flatten)]
    pub registration: RegistrationArgs,
    /// Send every UPDATE and DELETE to the webhook, and do not let it write its configuration
    /// (default: narrowed to the locked names, kept up to date by the webhook).
    #[arg(long)]
    pub broad: bool,
}

#[derive(Debug, Args)]
pub struct RegistrationArgs {
    /// PEM of the CA that signed the serving certificate (the caBundle).
    #[arg(long, value_name = "FILE")]
    pub ca_file: PathBuf,
    /// The URL the API server calls.
    #[arg(long, value_name = "URL", default_value = manifests::DEFAULT_URL)]
    pub url: String,
    /// What the API server does when the webhook cannot be called.
    #[arg(long, value_enum, default_value_t = manifests::FailurePolicy::Fail)]
    pub failure_policy: manifests::FailurePolicy,
    /// How long the API server waits for an answer (1-30); keep it above kube.lookup_timeout.
    #[arg(long, value_name = "SECONDS", default_value_t = 5)]
    pub timeout_seconds: i32,
    /// The webhook's identity is this user (client certificate CN or token user).
    #[arg(long, value_name = "NAME", default_value = manifests::NAME, conflicts_with = "service_account")]
    pub user: String,
    /// The webhook's identity is this ServiceAccount.
    #[arg(long, value_name = "NAMESPACE/NAME")]
    pub service_account: Option<String>,
    /// Lock only in the namespaces this label selector selects (e.g. lockable=true; `a!=b`,
    /// `k in (x,y)`, `k notin (x)`, `k`, `!k`, comma = and), besides kube-system and
    /// kube-node-lease, which are always left out.
    #[arg(long, value_name = "SELECTOR")]
    pub namespace_selector: Option<String>,
}

#[derive(Debug, Args)]
pub struct ApiServerArgs {
    /// The client certificate the API server presents (apiserver-client.crt from `certs --client`).
    #[arg(long, value_name = "FILE")]
    pub client_cert: PathBuf,
    /// Its private key.
    #[arg(long, value_name = "FILE")]
    pub client_key: PathBuf,
    /// The URL the API server calls; its host:port names the kubeconfig user.
    #[arg(long, value_name = "URL", default_value = manifests::DEFAULT_URL)]
    pub url: String,
    /// Write admission-config.yaml and webhook-kubeconfig.yaml into DIR instead of printing them.
    #[arg(long, value_name = "DIR")]
    pub dir: Option<PathBuf>,
    /// The directory as the API server sees it (inside its pod) [default: --dir, or
    /// /etc/kubernetes/kube-object-lock].
    #[arg(long, value_name = "DIR")]
    pub apiserver_dir: Option<PathBuf>,
    /// Also load webhook configurations from this directory (staticManifestsDir: Kubernetes
    /// 1.37, or 1.36 with the ManifestBasedAdmissionControlConfig feature gate).
    #[arg(long, value_name = "DIR")]
    pub static_manifests_dir: Option<PathBuf>,
}

impl RegistrationArgs {
    pub fn registration(&self) -> Result<manifests::Registration, manifests::ManifestsError> {
        let identity = match &self.service_account {
            Some(sa) => manifests::Identity::service_account(sa)?,
            None => manifests::Identity::User(self.user.clone()),
        };
        let registration = manifests::Registration::new(
            &self.url,
            &self.ca_file,
            self.failure_policy,
            self.timeout_seconds,
            identity,
        )?;
        match &self.namespace_selector {
            Some(selector) => registration.with_namespace_selector(selector),
            None => Ok(registration),
        }
    }
}

#[derive(Debug, Args)]
pub struct CheckArgs {
    #[command(flatten)]
    pub config: ConfigArgs,
    #[command(flatten)]
    pub source: SourceArgs,
    /// The AdmissionReview JSON file; `-` reads stdin.
    #[arg(value_name = "REVIEW_JSON")]
    pub review: PathBuf,
}

impl SourceArgs {
    fn flags(&self) -> [(&'static str, Option<String>); 3] {
        [
            ("kube.kubeconfig", display(&self.kubeconfig)),
            ("kube.context", self.context.clone()),
            ("locks.dir", display(&self.locks_dir)),
        ]
    }
}

impl ServeArgs {
    pub fn layers(&self) -> Layers {
        let flags = [
            ("server.listen", self.listen.clone()),
            ("metrics.listen", self.metrics_listen.clone()),
            ("tls.cert", display(&self.tls_cert)),
            ("tls.key", display(&self.tls_key)),
        ];
        self.config
            .layers(flags.into_iter().chain(self.source.flags()))
    }
}

impl CheckArgs {
    pub fn layers(&self) -> Layers {
        self.config.layers(self.source.flags())
    }
}

fn display(path: &Option<PathBuf>) -> Option<String> {
    path.as_ref().map(|path| path.display().to_string())
}

impl ConfigArgs {
    /// The settings' layers: the file `--config` names, then the flags given, by settings key.
    fn layers(&self, flags: impl IntoIterator<Item = (&'static str, Option<String>)>) -> Layers {
        let flags = flags.into_iter();
        Layers {
            file: self.config.clone(),
            env: None,
            flags: (flags.filter_map(|(key, value)| Some((key.to_owned(), value?)))).collect(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::CommandFactory;

    #[test]
    fn the_command_line_is_consistent() {
        Cli::command().debug_assert();
    }

    #[test]
    fn serve_flags_become_settings_keys() {
        let cli = Cli::try_parse_from([
            "kube-object-lock",
            "serve",
            "--listen",
            "0.0.0.0:9443",
            "--tls-cert",
            "c.pem",
            "--tls-key",
            "k.pem",
            "--locks-dir",
            "locks",
        ])
        .expect("parses");
        let Command::Serve(args) = cli.command else {
            panic!("serve")
        };
        let layers = args.layers();
        assert_eq!(
            layers.flags,
            vec![
                ("server.listen".to_owned(), "0.0.0.0:9443".to_owned()),
                ("tls.cert".to_owned(), "c.pem".to_owned()),
                ("tls.key".to_owned(), "k.pem".to_owned()),
                ("locks.dir".to_owned(), "locks".to_owned()),
            ]
        );
    }

    #[test]
    fn flag_errors_name_the_flag() {
        let err = Cli::try_parse_from(["kube-object-lock", "serve", "--tls-cert", "c.pem"])
            .expect_err("key missing");
        assert!(err.to_string().contains("--tls-key"), "{err}");
        let err = Cli::try_parse_from([
            "kube-object-lock",
            "check",
            "--kubeconfig",
            "k",
            "--locks-dir",
            "d",
            "r.json",
        ])
        .expect_err("two sources");
        assert!(err.to_string().contains("--locks-dir"), "{err}");
        let err = Cli::try_parse_from(["kube-object-lock", "certs", "--out", "d", "--days", "x"])
            .expect_err("bad days");
        assert!(err.to_string().contains("--days"), "{err}");
    }
}
