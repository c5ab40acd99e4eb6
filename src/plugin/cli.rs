//! The command lines of `kubectl lock` and `kubectl unlock`, one binary: [`parse`] picks by the
//! file name it was started as, so `kubectl-unlock` can be a symlink or a copy of `kubectl-lock`.

use std::ffi::OsString;
use std::path::{Path, PathBuf};
use std::time::Duration;

use clap::error::ErrorKind;
use clap::{Args, CommandFactory, Parser, Subcommand};
use k8s_openapi::jiff::Timestamp;

use crate::api::LockOperation;
pub use crate::cli::generate::PluginShell;

pub const UNLOCK_BINARY: &str = "kubectl-unlock";

const LOCK_ABOUT: &str = "Lock a Kubernetes object against UPDATE and DELETE.";

const LOCK_LONG_ABOUT: &str = "\
Lock a Kubernetes object against UPDATE and DELETE.

Creates a Lock named like the object in the object's namespace (a ClusterLock for cluster-scoped
objects such as Namespaces or ClusterRoles). While it exists, the kube-object-lock admission
webhook refuses changes to that object. The lock covers the given resource only: locking
deployment/web does not lock the Service web. `kubectl unlock` deletes the lock.

You hold the lock (spec.holder names you, as `kubectl auth whoami` says): only you, or someone
granted the \"unlock\" verb on locks, may lift it. You may lock only what you may change and
delete yourself: the API server refuses the lock otherwise.

RESOURCE is what kubectl accepts: a plural (deployments), a singular (deployment), a short name
(deploy), a kind (Deployment), each optionally with its group (deployments.apps, Deployment.apps)
and version (deployments.v1.apps).

With a COMMAND after `--`, the lock is held while the command runs: created, confirmed in force,
then the command runs with this terminal and environment, and the lock is deleted when it ends,
whatever the way. SIGINT, SIGTERM and SIGHUP are passed to the command (unless the terminal sent
them to it already). While it runs, the lock's expiresAt is kept one --lease ahead, so that if
kubectl lock is killed the lock lapses by itself. --for and --until cannot be combined with it.
Exit status with a command:
  the command's own, or 128+N when a signal N killed it
  122  the command exited 0, but the lock could not be removed (the error says how to remove it)
  123  the command was not run: the object is already locked (a lock of its name exists)
  124  the command was not run: the lock was not in force within --timeout (it is removed)
  125  the command was not run: the lock could not be taken (refused, unreachable, bad flag...)
  126  the command cannot be executed; 127 the command was not found (the lock is removed)
  128+N also when signal N arrived before the command started (not run; the lock is removed)
  2    a bad command line";

const LOCK_EXAMPLES: &str = "\
Examples:
  # Lock the Deployment web in namespace prod for two hours, with a reason
  kubectl lock deploy/web -n prod --for 2h --reason 'release freeze'

  # Refuse deletion only, until a given time; let alice through
  kubectl lock configmap app-config --operations DELETE --until 2026-11-22T05:00:00Z --exempt-user alice

  # Lock a Namespace (a ClusterLock), warning instead of refusing
  kubectl lock namespace/prod --warn

  # Lock a PersistentVolumeClaim until the Job backup (same namespace) is deleted
  kubectl lock pvc/data -n prod --owner job/backup

  # Lock an object that does not exist yet
  kubectl lock secret/tls-cert --allow-missing

  # Reserve a name: nobody may create deployment/web in prod while the lock lives
  kubectl lock deploy/web -n prod --operations CREATE

  # Keep kubectl exec, attach and port-forward out of a pod (and its deletion)
  kubectl lock pod/db-0 --operations CONNECT,DELETE

  # A lock anyone allowed to delete Locks may lift (by default only you, its holder, may)
  kubectl lock configmap/app-config --no-holder

  # Do not wait for the webhook to confirm the lock (by default up to 10s)
  kubectl lock deploy/web --wait=false

  # Hold a lock on the Deployment web while a migration runs, released when it ends
  kubectl lock deploy/web -n prod --reason 'db migration' -- ./migrate.sh --apply

  # What is locked, here and everywhere
  kubectl lock list
  kubectl lock list -A";

const UNLOCK_LONG_ABOUT: &str = "\
Unlock a Kubernetes object locked with `kubectl lock`.

Deletes the Lock named like the object in the object's namespace (the ClusterLock for
cluster-scoped objects), if that lock covers the object's resource. Fails when there is no such
lock. RESOURCE is resolved as `kubectl lock` resolves it.

If the garbage collector was waiting to delete the object (its owner is gone, or is being deleted
in the foreground), the lock kept it, and the collector would only look again at its next
retry, up to about 17 minutes later: unlock prompts it to look at once (--no-nudge does not).";

const UNLOCK_EXAMPLES: &str = "\
Examples:
  kubectl unlock deploy/web -n prod
  kubectl unlock namespace prod";

#[derive(Clone, Debug, Default, Args)]
pub struct ConnectionArgs {
    /// Path to the kubeconfig file [default: KUBECONFIG, else ~/.kube/config, else the
    /// in-cluster service account].
    #[arg(long, value_name = "FILE", global = true)]
    pub kubeconfig: Option<PathBuf>,
    /// The kubeconfig context to use [default: the current context].
    #[arg(long, value_name = "NAME", global = true)]
    pub context: Option<String>,
    /// The namespace of the object, or of the locks to list [default: the context's namespace,
    /// else "default"]. Ignored, with a note, for cluster-scoped objects.
    #[arg(short = 'n', long, value_name = "NAMESPACE", global = true)]
    pub namespace: Option<String>,
}

#[derive(Debug, Parser)]
#[command(
    name = "kubectl-lock",
    bin_name = "kubectl lock",
    version = crate::VERSION,
    about = LOCK_ABOUT,
    long_about = LOCK_LONG_ABOUT,
    after_help = LOCK_EXAMPLES,
    args_conflicts_with_subcommands = true,
    subcommand_negates_reqs = true,
    disable_help_subcommand = true
)]
pub struct LockCli {
    #[command(subcommand)]
    pub command: Option<LockCommand>,
    #[command(flatten)]
    pub lock: LockArgs,
    #[command(flatten)]
    pub connection: ConnectionArgs,
}

#[derive(Debug, Subcommand)]
pub enum LockCommand {
    /// List the locks: what each covers, whether its target exists, the time left.
    ///
    /// Lists the Locks of the namespace (of every namespace with -A) and every ClusterLock, with
    /// what each covers, whether its target exists (exists, missing, or - when it cannot be
    /// told: several resources, a selector), its mode, the time left and the reason.
    List(ListArgs),
    /// Print the completion of kubectl-lock and kubectl-unlock for a shell, or (kubectl) the
    /// program kubectl runs to complete `kubectl lock` and `kubectl unlock`.
    ///
    /// kubectl: `kubectl lock completion kubectl > DIR/kubectl_complete-lock`, made executable,
    /// with `kubectl_complete-unlock` a link to it, DIR on PATH (kubectl 1.26+ then completes
    /// the plugin's flags, resource types and object names). bash: `source <(kubectl lock
    /// completion bash)`; zsh: save it as `_kubectl-lock` in a directory of $fpath; fish: save
    /// it in ~/.config/fish/completions/kubectl-lock.fish.
    Completion(CompletionArgs),
    /// Write the man pages of kubectl-lock (and its subcommands) and kubectl-unlock into DIR,
    /// e.g. ~/.local/share/man/man1.
    Man(ManArgs),
}

#[derive(Debug, Args)]
pub struct CompletionArgs {
    /// What to print the completion for.
    #[arg(value_enum, value_name = "SHELL")]
    pub shell: PluginShell,
}

#[derive(Debug, Args)]
pub struct ManArgs {
    /// The directory to write the pages into (created if missing).
    #[arg(value_name = "DIR")]
    pub dir: PathBuf,
}

#[derive(Debug, Args)]
pub struct ListArgs {
    /// List the Locks of every namespace, with a NAMESPACE column.
    #[arg(short = 'A', long, conflicts_with = "namespace")]
    pub all_namespaces: bool,
}

#[derive(Debug, Args)]
pub struct LockArgs {
    /// The object to lock: RESOURCE/NAME, or RESOURCE NAME.
    #[arg(value_name = "RESOURCE/NAME", required = true, num_args = 1..=2)]
    pub target: Vec<String>,
    /// Why the object is locked; shown to whoever is refused.
    #[arg(long, value_name = "TEXT")]
    pub reason: Option<String>,
    /// Unlock by itself after this long (2h, 30m, 1d 12h, ...).
    #[arg(long = "for", value_name = "DURATION", value_parser = parse_duration, conflicts_with_all = ["until", "command"])]
    pub duration: Option<Duration>,
    /// Unlock by itself at this RFC 3339 time (2026-11-22T05:00:00Z); must be in the future.
    #[arg(long, value_name = "TIME", value_parser = parse_time, conflicts_with = "command")]
    pub until: Option<Timestamp>,
    /// Lock only these operations: UPDATE, DELETE, CREATE, CONNECT (repeat or separate with
    /// commas) [default: UPDATE,DELETE].
    #[arg(
        long,
        value_name = "OPERATION",
        value_enum,
        value_delimiter = ',',
        ignore_case = true
    )]
    pub operations: Vec<LockOperation>,
    /// Let this user change the object anyway; repeat for more users.
    #[arg(long = "exempt-user", value_name = "USER")]
    pub exempt_users: Vec<String>,
    /// Lock only this field: UPDATEs that change other fields pass (spec.template,
    /// metadata.annotations['example.com/key']; a list is compared whole). Repeat for more.
    #[arg(long = "fields", value_name = "PATH", value_parser = parse_field_path,
        conflicts_with = "except_fields")]
    pub fields: Vec<String>,
    /// Lock everything but this field (metadata.annotations, spec.replicas). Repeat for more.
    #[arg(long = "except-fields", value_name = "PATH", value_parser = parse_field_path)]
    pub except_fields: Vec<String>,
    /// Warn instead of refusing: changes go through with a warning (mode Warn).
    #[arg(long)]
    pub warn: bool,
    /// Do not hold the lock: anyone allowed to delete Locks may lift it. By default you hold it
    /// (spec.holder), and only you, or someone granted the "unlock" verb, may lift it.
    #[arg(long)]
    pub no_holder: bool,
    /// Make this object the lock's owner (KIND/NAME, in the locked object's namespace or
    /// cluster-scoped): the Kubernetes garbage collector deletes the lock when it is deleted.
    /// A ClusterLock takes cluster-scoped owners only.
    #[arg(long, value_name = "KIND/NAME")]
    pub owner: Option<String>,
    /// Lock even if the object does not exist (yet); without it a missing object is an error,
    /// unless the lock refuses CREATE (it reserves the name).
    #[arg(long)]
    pub allow_missing: bool,
    /// Create the lock even in a namespace the webhook registration leaves out (kube-system,
    /// kube-node-lease), where it is never enforced; without it such a lock is refused.
    #[arg(long)]
    pub force_unenforced: bool,
    /// Wait until the lock is in force: an instance of the webhook reports it in the lock's
    /// status and a server-side dry run of the guarded operation is refused by it.
    /// --wait=false returns as soon as the Lock exists.
    #[arg(long, value_name = "BOOL", default_value_t = true, num_args = 0..=1,
        default_missing_value = "true", action = clap::ArgAction::Set)]
    pub wait: bool,
    /// How long to wait for the lock to be in force (30s, 1m); then exit 1, leaving the Lock.
    #[arg(long, value_name = "DURATION", value_parser = parse_duration, default_value = "10s")]
    pub timeout: Duration,
    /// With a COMMAND: keep the lock's expiresAt this far ahead while the command runs, renewed
    /// every third of it, so that the lock lapses within this long if kubectl lock is killed.
    /// [default: 60s]
    #[arg(long, value_name = "DURATION", value_parser = parse_lease)]
    pub lease: Option<Duration>,
    /// The command to run while the lock is held, after `--`.
    #[arg(last = true, value_name = "COMMAND")]
    pub command: Vec<OsString>,
}

#[derive(Debug, Parser)]
#[command(
    name = UNLOCK_BINARY,
    bin_name = "kubectl unlock",
    version = crate::VERSION,
    about = "Unlock a Kubernetes object locked with `kubectl lock`.",
    long_about = UNLOCK_LONG_ABOUT,
    after_help = UNLOCK_EXAMPLES
)]
pub struct UnlockCli {
    /// The object to unlock: RESOURCE/NAME, or RESOURCE NAME.
    #[arg(value_name = "RESOURCE/NAME", required = true, num_args = 1..=2)]
    pub target: Vec<String>,
    /// Do not prompt the garbage collector when the object is waiting for it (its owner gone or
    /// being deleted in the foreground): it then goes at the collector's next retry.
    #[arg(long)]
    pub no_nudge: bool,
    #[command(flatten)]
    pub connection: ConnectionArgs,
}

#[derive(Debug)]
pub enum Invocation {
    Lock(Box<LockCli>),
    Unlock(UnlockCli),
}

/// Parses the whole command line, `argv[0]` included: `kubectl-unlock` unlocks, anything else
/// locks. Help and version requests come back as the `clap::Error` that prints them.
pub fn parse<I, T>(args: I) -> Result<Invocation, clap::Error>
where
    I: IntoIterator<Item = T>,
    T: Into<OsString>,
{
    let mut args: Vec<OsString> = args.into_iter().map(Into::into).collect();
    if args.get(1).is_some_and(|word| word == "help") {
        args.remove(1);
        args.push("--help".into());
    }
    let unlock = args
        .first()
        .and_then(|argv0| Path::new(argv0).file_stem())
        .is_some_and(|stem| stem == UNLOCK_BINARY);
    let usage = |message: String| clap::Error::raw(ErrorKind::InvalidValue, message + "\n");
    if unlock {
        let cli = UnlockCli::try_parse_from(args)?;
        super::parse_target(&cli.target).map_err(|e| usage(e.to_string()))?;
        return Ok(Invocation::Unlock(cli));
    }
    let cli = LockCli::try_parse_from(args)?;
    if cli.lock.lease.is_some() && cli.lock.command.is_empty() {
        let message =
            "--lease applies to a lock held while a command runs: give the COMMAND after --\n";
        return Err(LockCli::command().error(ErrorKind::MissingRequiredArgument, message));
    }
    if cli.command.is_some() {
        return Ok(Invocation::Lock(Box::new(cli)));
    }
    if let [first, rest @ ..] = cli.lock.target.as_slice()
        && first == "unlock"
    {
        let target = rest.first().map_or("RESOURCE/NAME", String::as_str);
        return Err(usage(format!(
            "to unlock, run `kubectl unlock {target}` (kubectl-unlock is this binary under another name: \
             if it is missing, link it beside kubectl-lock with `ln -s kubectl-lock kubectl-unlock`)"
        )));
    }
    super::parse_target(&cli.lock.target).map_err(|e| usage(e.to_string()))?;
    Ok(Invocation::Lock(Box::new(cli)))
}

/// A usage error as one line, without clap's usage and tips.
pub fn one_line(error: &clap::Error) -> String {
    let rendered = error.render().to_string();
    let line = rendered
        .lines()
        .take_while(|line| !line.starts_with("Usage:"))
        .map(str::trim)
        .filter(|line| {
            !line.is_empty()
                && !line.starts_with("tip:")
                && !line.starts_with("For more information")
        })
        .collect::<Vec<_>>()
        .join(" ");
    format!("{line} (see --help)")
}

fn parse_duration(text: &str) -> Result<Duration, String> {
    humantime::parse_duration(text)
        .map_err(|e| format!("{e} (expected a duration such as 2h, 30m or 1d 12h)"))
}

fn parse_lease(text: &str) -> Result<Duration, String> {
    let lease = parse_duration(text)?;
    if lease < super::lease::MIN_LEASE {
        return Err(format!(
            "must be at least {}",
            humantime::format_duration(super::lease::MIN_LEASE)
        ));
    }
    Ok(lease)
}

fn parse_field_path(text: &str) -> Result<String, String> {
    crate::fieldpath::FieldPath::parse(text)
        .map(|_| text.to_owned())
        .map_err(|e| e.to_string())
}

fn parse_time(text: &str) -> Result<Timestamp, String> {
    text.parse::<Timestamp>()
        .map_err(|e| format!("{e} (expected an RFC 3339 time such as 2026-11-22T05:00:00Z)"))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn lock(args: &[&str]) -> Result<LockCli, clap::Error> {
        match parse(std::iter::once("kubectl-lock").chain(args.iter().copied()))? {
            Invocation::Lock(cli) => Ok(*cli),
            Invocation::Unlock(_) => panic!("parsed as unlock"),
        }
    }

    #[test]
    fn the_command_lines_are_consistent() {
        LockCli::command().debug_assert();
        UnlockCli::command().debug_assert();
    }

    #[test]
    fn argv0_picks_the_command() {
        let unlock = parse(["/usr/local/bin/kubectl-unlock", "deploy/web"]).expect("parses");
        assert!(matches!(unlock, Invocation::Unlock(cli) if cli.target == ["deploy/web"]));
        for argv0 in ["kubectl-lock", "/tmp/kubectl-lock", "anything"] {
            let lock = parse([argv0, "deploy/web"]).expect("parses");
            assert!(matches!(lock, Invocation::Lock(_)), "{argv0}");
        }
    }

    #[test]
    fn lock_flags() {
        let flags = "deploy web -n prod --for 1h30m --operations delete,UPDATE --operations DELETE \
                     --exempt-user alice --exempt-user bob --warn";
        let cli = lock(&flags.split_whitespace().collect::<Vec<_>>()).expect("parses");
        assert!(cli.command.is_none());
        assert_eq!(cli.lock.target, ["deploy", "web"]);
        assert_eq!(cli.connection.namespace.as_deref(), Some("prod"));
        assert_eq!(cli.lock.duration, Some(Duration::from_secs(5400)));
        let (update, delete) = (LockOperation::Update, LockOperation::Delete);
        assert_eq!(cli.lock.operations, [delete, update, delete]);
        assert_eq!(cli.lock.exempt_users, ["alice", "bob"]);
        assert!(cli.lock.warn && !cli.lock.allow_missing);
        assert!(cli.lock.wait, "waits by default");
        assert_eq!(cli.lock.timeout, Duration::from_secs(10));
        let quick = lock(&["deploy/web", "--wait=false", "--timeout", "1m"]).expect("parses");
        assert!(!quick.lock.wait);
        assert_eq!(quick.lock.timeout, Duration::from_secs(60));
        assert!(lock(&["deploy/web", "--wait"]).expect("parses").lock.wait);
    }

    #[test]
    fn field_flags_and_commands() {
        let cli = lock(&[
            "deploy/web",
            "--fields",
            "spec.template",
            "--fields",
            "metadata.annotations['example.com/key']",
        ])
        .expect("valid");
        assert_eq!(
            cli.lock.fields,
            ["spec.template", "metadata.annotations['example.com/key']"]
        );
        let cli = lock(&[
            "deploy/web",
            "--lease",
            "6s",
            "--",
            "sh",
            "-c",
            "exit 3",
            "--for",
        ])
        .expect("parses");
        assert_eq!(cli.lock.target, ["deploy/web"]);
        assert_eq!(cli.lock.command, ["sh", "-c", "exit 3", "--for"]);
        assert_eq!(cli.lock.lease, Some(Duration::from_secs(6)));
    }

    #[test]
    fn list_takes_the_common_flags() {
        let cli = lock(&["list", "-A", "--context", "c", "--kubeconfig", "k"]).expect("parses");
        let Some(LockCommand::List(list)) = cli.command else {
            panic!("list")
        };
        assert!(list.all_namespaces);
        assert_eq!(cli.connection.context.as_deref(), Some("c"));
        assert_eq!(cli.connection.kubeconfig, Some(PathBuf::from("k")));
    }

    #[test]
    fn flag_errors_are_one_line_naming_the_flag() {
        let until = "2030-01-01T00:00:00Z";
        for (args, flags) in [
            (
                &["deploy/web", "--operations", "PATCH"][..],
                &["--operations"][..],
            ),
            (&["deploy/web", "--for", "soon"], &["--for"]),
            (&["deploy/web", "--timeout", "soon"], &["--timeout"]),
            (&["deploy/web", "--until", "tomorrow"], &["--until"]),
            (
                &["deploy/web", "--for", "1h", "--until", until],
                &["--until"],
            ),
            (&["deploy/web", "--bogus"], &["--bogus"]),
            (&[], &["RESOURCE/NAME"]),
            (
                &["deploy/web", "--fields", "spec..template"],
                &["--fields", "\"spec..template\" is not a field path"],
            ),
            (
                &[
                    "deploy/web",
                    "--fields",
                    "spec",
                    "--except-fields",
                    "status",
                ],
                &["--except-fields"],
            ),
            (
                &["deploy/web", "--for", "1h", "--", "true"],
                &["--for", "COMMAND"],
            ),
            (
                &["deploy/web", "--until", until, "--", "true"],
                &["--until", "COMMAND"],
            ),
            (&["deploy/web", "--lease", "1m"], &["--lease", "COMMAND"]),
            (
                &["deploy/web", "--lease", "2s", "--", "true"],
                &["--lease", "at least 3s"],
            ),
            // Flags come after `list`, as after a plugin's name in kubectl.
            (&["--context", "c", "list", "-A"], &["-A"]),
            (&["list", "-A", "-n", "prod"], &["--namespace"]),
        ] {
            let line = one_line(&lock(args).expect_err("refused"));
            assert!(line.starts_with("error: "), "{line}");
            assert!(flags.iter().all(|f| line.contains(f)), "{args:?}: {line}");
            assert!(!line.contains('\n') && !line.contains("For more"), "{line}");
        }
    }

    #[test]
    fn help_is_not_an_error() {
        let err = lock(&["--help"]).expect_err("help");
        assert!(!err.use_stderr());
        let text = err.render().to_string();
        for documented in [
            "--owner <KIND/NAME>",
            "--lease <DURATION>",
            "[COMMAND]...",
            "123  the command was not run",
        ] {
            assert!(text.contains(documented), "{documented}: {text}");
        }
    }
}
