//! The command line: `serve`, `certs`, `crd` and `check`.
//!
//! Flags of `serve` and `check` are the top layer of the settings: each maps to one settings
//! key, so `--lookup-timeout` and `kube.lookup_timeout` cannot disagree about what they mean.

pub mod certs;
pub mod check;

use std::path::PathBuf;

use clap::{Args, Parser, Subcommand};

use crate::settings::Layers;

/// Locks Kubernetes objects: a validating admission webhook that refuses UPDATE and DELETE of
/// any object with a Lock (or, cluster-scoped, a ClusterLock) of the same name.
#[derive(Debug, Parser)]
#[command(name = "kube-object-lock", version, propagate_version = true)]
pub struct Cli {
    /// What to do.
    #[command(subcommand)]
    pub command: Command,
}

/// The subcommands.
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
    /// Print the AdmissionReview response the server would give to a review read from a file.
    ///
    /// Exit status: 0 allowed, 1 denied, 2 bad input or no lock source.
    Check(CheckArgs),
}

/// Where settings come from.
#[derive(Debug, Args)]
pub struct ConfigArgs {
    /// TOML settings file (see deploy/kube-object-lock.toml); environment variables
    /// KUBE_OBJECT_LOCK__SECTION__KEY and flags override it.
    #[arg(long, value_name = "FILE")]
    pub config: Option<PathBuf>,
}

/// Flags of `serve`.
#[derive(Debug, Args)]
pub struct ServeArgs {
    #[command(flatten)]
    /// Settings file.
    pub config: ConfigArgs,
    /// Address to listen on [settings: server.listen; default 127.0.0.1:8443].
    #[arg(long, value_name = "ADDR")]
    pub listen: Option<String>,
    /// PEM serving certificate [settings: tls.cert].
    #[arg(long, value_name = "FILE", requires = "tls_key")]
    pub tls_cert: Option<PathBuf>,
    /// PEM private key of the serving certificate [settings: tls.key].
    #[arg(long, value_name = "FILE", requires = "tls_cert")]
    pub tls_key: Option<PathBuf>,
    #[command(flatten)]
    /// Lock source.
    pub source: SourceArgs,
}

/// Where locks come from.
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

/// Flags of `certs`.
#[derive(Debug, Args)]
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

/// Flags of `check`.
#[derive(Debug, Args)]
pub struct CheckArgs {
    #[command(flatten)]
    /// Settings file.
    pub config: ConfigArgs,
    #[command(flatten)]
    /// Lock source.
    pub source: SourceArgs,
    /// The AdmissionReview JSON file; `-` reads stdin.
    #[arg(value_name = "REVIEW_JSON")]
    pub review: PathBuf,
}

impl SourceArgs {
    fn flags(&self, out: &mut Vec<(String, String)>) {
        push_path(out, "kube.kubeconfig", &self.kubeconfig);
        if let Some(context) = &self.context {
            out.push(("kube.context".into(), context.clone()));
        }
        push_path(out, "locks.dir", &self.locks_dir);
    }
}

impl ServeArgs {
    /// The settings layers these flags describe.
    pub fn layers(&self) -> Layers {
        let mut flags = Vec::new();
        if let Some(listen) = &self.listen {
            flags.push(("server.listen".into(), listen.clone()));
        }
        push_path(&mut flags, "tls.cert", &self.tls_cert);
        push_path(&mut flags, "tls.key", &self.tls_key);
        self.source.flags(&mut flags);
        Layers {
            file: self.config.config.clone(),
            env: None,
            flags,
        }
    }
}

impl CheckArgs {
    /// The settings layers these flags describe.
    pub fn layers(&self) -> Layers {
        let mut flags = Vec::new();
        self.source.flags(&mut flags);
        Layers {
            file: self.config.config.clone(),
            env: None,
            flags,
        }
    }
}

fn push_path(out: &mut Vec<(String, String)>, key: &str, path: &Option<PathBuf>) {
    if let Some(path) = path {
        out.push((key.to_owned(), path.display().to_string()));
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
