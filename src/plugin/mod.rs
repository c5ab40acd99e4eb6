//! `kubectl lock` and `kubectl unlock` (one binary, told apart by the name it runs as): lock an
//! object by creating its `Lock` (or `ClusterLock`), unlock it by deleting that, list the locks.

pub mod cli;
mod collector;
mod confirm;
pub mod discovery;
mod error;
mod lease;
mod list;
mod lock;
mod owner;
mod run;
mod spec;

use clap::CommandFactory;
use kube::api::{Api, ApiResource, DynamicObject};

use crate::api::{self, LockKey};
use crate::kubeconfig::{self, KubeconfigError};
use cli::ConnectionArgs;
pub use cli::{Invocation, LockCommand, one_line, parse};
use discovery::{Discovered, ResolveError, ResourceArg, ResourceType};
pub use error::PluginError;

/// What a successful command prints: stdout, notes for stderr, and the exit status.
#[derive(Debug, Default, PartialEq, Eq)]
pub struct Report {
    pub stdout: String,
    pub notes: Vec<String>,
    pub exit_code: u8,
}

impl Report {
    fn ok(stdout: String, notes: Vec<String>) -> Result<Report, PluginError> {
        Ok(Report {
            stdout,
            notes,
            exit_code: 0,
        })
    }
}

pub async fn run(invocation: Invocation) -> Result<Report, PluginError> {
    match invocation {
        Invocation::Lock(cli) => match cli.command {
            Some(LockCommand::List(args)) => list::list(&cli.connection, &args).await,
            Some(LockCommand::Completion(args)) => Report::ok(completion(args.shell), vec![]),
            Some(LockCommand::Man(args)) => man_pages(&args.dir),
            None if cli.lock.command.is_empty() => {
                lock::take(&cli.connection, &cli.lock, None).await
            }
            None => run::run(&cli.connection, &cli.lock).await,
        },
        Invocation::Unlock(cli) => lock::unlock(&cli.connection, &cli.target, cli.no_nudge).await,
    }
}

fn completion(shell: cli::PluginShell) -> String {
    use crate::cli::generate::{self, Shell};
    let (lock, unlock) = (cli::LockCli::command(), cli::UnlockCli::command());
    let shell = match shell {
        cli::PluginShell::Kubectl => return generate::kubectl_complete(&lock, &unlock),
        cli::PluginShell::Bash => Shell::Bash,
        cli::PluginShell::Zsh => Shell::Zsh,
        cli::PluginShell::Fish => Shell::Fish,
    };
    let mut script = generate::completion(lock, "kubectl-lock", shell);
    script.extend(generate::completion(unlock, cli::UNLOCK_BINARY, shell));
    String::from_utf8_lossy(&script).into_owned()
}

fn man_pages(dir: &std::path::Path) -> Result<Report, PluginError> {
    use crate::cli::generate::write_man_pages;
    write_man_pages(cli::LockCli::command(), dir)
        .and_then(|()| write_man_pages(cli::UnlockCli::command(), dir))
        .map_err(|e| {
            PluginError::Message(format!(
                "cannot write the man pages into {}: {e}",
                dir.display()
            ))
        })?;
    Ok(Report::default())
}

/// A client for the cluster the flags, the kubeconfig or the in-cluster account name.
struct Cluster {
    client: kube::Client,
    url: String,
    default_namespace: String,
}

impl Cluster {
    async fn connect(args: &ConnectionArgs) -> Result<Cluster, PluginError> {
        let config = kubeconfig::load(args.kubeconfig.as_deref(), args.context.as_deref())
            .await
            .map_err(|e| {
                PluginError::Message(match e {
                    KubeconfigError::NoConfig(m) => format!("no cluster configured (--kubeconfig, KUBECONFIG, ~/.kube/config or in-cluster): {m}"),
                    KubeconfigError::File { .. } => format!("cannot load the kubeconfig {e}"),
                    KubeconfigError::Context(m) => format!("cannot load the kubeconfig: {m}"),
                })
            })?;
        let url = config.cluster_url.to_string();
        let url = url.strip_suffix('/').unwrap_or(&url).to_owned();
        let default_namespace = config.default_namespace.clone();
        let client = kubeconfig::client(config, error::detail)
            .map_err(|m| PluginError::Message(format!("cannot load the kubeconfig: {m}")))?;
        Ok(Cluster {
            client,
            url,
            default_namespace,
        })
    }

    fn namespace(&self, args: &ConnectionArgs) -> String {
        (args.namespace.clone()).unwrap_or_else(|| self.default_namespace.clone())
    }

    fn failed(&self, error: &kube::Error, action: impl Into<String>) -> PluginError {
        PluginError::api(error, &self.url, action)
    }

    async fn discover(
        &self,
        groups: Option<&std::collections::BTreeSet<String>>,
        all_versions: bool,
    ) -> Result<Discovered, PluginError> {
        discovery::discover(&self.client, groups, all_versions)
            .await
            .map_err(|e| self.failed(&e, "cannot read the API resources (discovery)"))
    }

    async fn resolve(&self, arg: &ResourceArg) -> Result<ResourceType, PluginError> {
        let discovered = self
            .discover(arg.groups().as_ref(), arg.has_version())
            .await?;
        let failures: Vec<_> = discovered
            .failures
            .iter()
            .map(|(_, m)| m.as_str())
            .collect();
        let text = &arg.text;
        discovery::resolve(arg, &discovered.types)
            .cloned()
            .map_err(|e| PluginError::Resource(match e {
                ResolveError::Ambiguous(candidates) => format!(
                    "resource type \"{text}\" is ambiguous: it may be {}; name one of them",
                    candidates.join(", ")
                ),
                ResolveError::Unknown if failures.is_empty() => {
                    format!("the server doesn't have a resource type \"{text}\"")
                }
                ResolveError::Unknown => format!(
                    "the server doesn't have a resource type \"{text}\" (discovery failed for {})",
                    failures.join("; ")
                ),
            }))
    }

    fn api(&self, resource: &ApiResource, namespace: Option<&str>) -> Api<DynamicObject> {
        match namespace {
            Some(ns) => Api::namespaced_with(self.client.clone(), ns, resource),
            None => Api::all_with(self.client.clone(), resource),
        }
    }
}

/// One object; `namespace` is `None` when it is cluster-scoped. Displayed as
/// `deployments.apps "web" in namespace "prod"`.
struct Target {
    resource: ResourceType,
    name: String,
    namespace: Option<String>,
}

impl Target {
    async fn resolve(
        cluster: &Cluster,
        args: &ConnectionArgs,
        words: &[String],
        notes: &mut Vec<String>,
    ) -> Result<Target, PluginError> {
        let (resource, name) = parse_target(words)?;
        let resource = cluster.resolve(&resource).await?;
        if resource.is_lock() {
            return Err(PluginError::Message(format!(
                "{} cannot be locked: locks are never locked, so unlocking never waits on the webhook",
                resource.qualified()
            )));
        }
        let namespace = if resource.namespaced {
            Some(cluster.namespace(args))
        } else {
            if let Some(ns) = &args.namespace {
                notes.push(format!(
                    "{} are cluster-scoped: --namespace {ns} is ignored",
                    resource.qualified()
                ));
            }
            None
        };
        Ok(Target {
            resource,
            name,
            namespace,
        })
    }

    /// Why a lock on it is never enforced: it is in (or is) a namespace the registration leaves out.
    fn unenforced(&self) -> Option<String> {
        let is_namespace = self.resource.group.is_empty() && self.resource.plural == "namespaces";
        let namespace = match &self.namespace {
            Some(ns) => ns,
            None if is_namespace => &self.name,
            None => return None,
        };
        api::is_excluded_namespace(namespace).then(|| format!(
            "the webhook registration leaves out namespace \"{namespace}\" (nothing in {} is sent to the webhook)",
            api::EXCLUDED_NAMESPACES.join(" or ")
        ))
    }

    fn lock(&self) -> LockKey {
        LockKey {
            name: self.name.clone(),
            namespace: self.namespace.clone(),
        }
    }
}

impl std::fmt::Display for Target {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{} \"{}\"", self.resource.qualified(), self.name)?;
        match &self.namespace {
            Some(ns) => write!(f, " in namespace \"{ns}\""),
            None => Ok(()),
        }
    }
}

fn parse_target(words: &[String]) -> Result<(ResourceArg, String), PluginError> {
    let (resource, name) = match words {
        [one] => one.split_once('/').unwrap_or((one, "")),
        [resource, name] if !resource.contains('/') => (resource.as_str(), name.as_str()),
        _ => ("", ""),
    };
    if resource.is_empty() || name.is_empty() || name.contains('/') {
        return Err(PluginError::Message(format!(
            "expected RESOURCE/NAME or RESOURCE NAME (such as deploy/web), got \"{}\"",
            words.join(" ")
        )));
    }
    Ok((ResourceArg::parse(resource), name.to_owned()))
}
