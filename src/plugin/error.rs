//! Errors of the plugin: each is one line, naming the flag, object or lock concerned.

/// Why `kubectl lock` or `kubectl unlock` failed.
#[derive(Debug, thiserror::Error)]
pub enum PluginError {
    /// The lock was created but is not confirmed in force.
    #[error(transparent)]
    NotInForce(#[from] NotInForce),
    /// The kubeconfig could not be read or has no usable context.
    #[error("cannot load the kubeconfig{path}: {message}")]
    Kubeconfig {
        /// `" FILE"` when one was named.
        path: String,
        /// What is wrong with it.
        message: String,
    },
    /// No kubeconfig and not in a cluster.
    #[error("no cluster configured (--kubeconfig, KUBECONFIG, ~/.kube/config or in-cluster): {0}")]
    NoConfig(String),
    /// The API server did not answer.
    #[error("cannot reach the API server at {url}: {detail}")]
    Unreachable {
        /// The server of the kubeconfig.
        url: String,
        /// The innermost cause (connection refused, certificate, ...).
        detail: String,
    },
    /// Someone else holds the lock.
    #[error(
        "{lock} is held by {holder}: only its holder, or someone granted the \"unlock\" verb on it, may lift it (kubectl auth whoami says who you are): {detail}"
    )]
    Held {
        /// `Lock prod/web`.
        lock: String,
        /// `user "alice"`.
        holder: String,
        /// The API server's refusal.
        detail: String,
    },
    /// The API server refused a request.
    #[error("{action}: {detail}")]
    Api {
        /// What was attempted ("cannot create Lock prod/web").
        action: String,
        detail: String,
    },
    /// A value the command line cannot carry out.
    #[error("{0}")]
    Usage(String),
    /// `kubectl lock man DIR` could not write a page.
    #[error("cannot write the man pages into {dir}: {error}")]
    ManPages { dir: String, error: std::io::Error },
    /// Discovery knows no such resource.
    #[error("the server doesn't have a resource type \"{resource}\"{hint}")]
    UnknownResource {
        /// What the user wrote.
        resource: String,
        /// Discovery documents that could not be read, if any.
        hint: String,
    },
    /// Several resources match the name.
    #[error("resource type \"{resource}\" is ambiguous: it may be {candidates}; name one of them")]
    Ambiguous {
        /// What the user wrote.
        resource: String,
        /// The qualified names of the matches.
        candidates: String,
    },
    /// Locks are never locked: the webhook lets every change of them through.
    #[error(
        "{resource} cannot be locked: locks are never locked, so unlocking never waits on the webhook"
    )]
    LockingALock {
        /// `locks.objectlock.dev` or `clusterlocks.objectlock.dev`.
        resource: String,
    },
    /// The object to lock does not exist.
    #[error("{target} does not exist (lock it anyway with --allow-missing)")]
    TargetMissing {
        /// `deployments.apps "web" in namespace "prod"`.
        target: String,
    },
    /// The lock would be in a namespace the webhook never hears of.
    #[error("{lock} would never be enforced: {why} (pass --force-unenforced to create it anyway)")]
    Unenforced {
        /// `Lock kube-system/coredns`.
        lock: String,
        /// Which namespace is left out, and why.
        why: String,
    },
    /// A lock with the object's name exists already.
    #[error("{lock} already exists (see kubectl lock list{scope}; kubectl unlock removes it)")]
    AlreadyLocked {
        /// `Lock prod/web`.
        lock: String,
        /// ` -n prod`, or empty for a ClusterLock.
        scope: String,
    },
    /// `kubectl lock ... -- COMMAND` did not run the command; `code` is the exit status that
    /// says why.
    #[error("{error}; the command was not run")]
    NotRun {
        code: u8,
        /// Why (not a `source`: the message says it already).
        error: Box<PluginError>,
    },
    /// A signal ended `kubectl lock` before the command ran.
    #[error("interrupted by {0}")]
    Interrupted(String),
    /// The command after `--` could not be started.
    #[error("cannot run {command}: {detail}")]
    CannotRun {
        /// `'./migrate.sh'`.
        command: String,
        /// Why (not found, permission denied).
        detail: String,
    },
    /// There is no lock to delete.
    #[error("no lock on {target}{why}")]
    NoLock {
        /// `deployments.apps "web" in namespace "prod"`.
        target: String,
        /// Why a lock of that name does not count, if there is one.
        why: String,
    },
}

/// The lock was created, but nothing shows it in force.
#[derive(Debug, thiserror::Error)]
#[error(
    "{lock} was created but is not in force{waited} (it stays; kubectl unlock removes it): {reason}"
)]
pub struct NotInForce {
    /// `Lock prod/web`.
    pub lock: String,
    /// ` after 10s`, or empty when it can never be.
    pub waited: String,
    /// Why: no instance has seen it, it is not sent to the webhook, another webhook...
    pub reason: String,
}

impl PluginError {
    /// The exit status of `kubectl lock` for this error: 1, or the code of
    /// [`PluginError::NotRun`].
    pub fn exit_code(&self) -> u8 {
        match self {
            PluginError::NotRun { code, .. } => *code,
            _ => 1,
        }
    }

    /// The error for a failed API call: [`PluginError::Unreachable`] when the request never got
    /// an answer, else [`PluginError::Api`] with the server's message.
    pub fn api(error: &kube::Error, url: &str, action: impl Into<String>) -> PluginError {
        match error {
            kube::Error::HyperError(_) | kube::Error::Service(_) => PluginError::Unreachable {
                url: url.to_owned(),
                detail: innermost(error),
            },
            _ => PluginError::Api {
                action: action.into(),
                detail: detail(error),
            },
        }
    }
}

/// The status code of an API error response, if the error is one.
pub fn status_code(error: &kube::Error) -> Option<u16> {
    match error {
        kube::Error::Api(status) => Some(status.code),
        _ => None,
    }
}

/// A kube error as one line: the server's message for an error response, else the chain of
/// causes (kube repeats a cause in its own message; each is written once).
pub fn detail(error: &kube::Error) -> String {
    if let kube::Error::Api(status) = error {
        return match (status.message.as_str(), status.reason.as_str()) {
            ("", "") => format!("HTTP {}", status.code),
            ("", reason) => reason.to_owned(),
            (message, _) => one_line(message),
        };
    }
    one_line(&crate::retry::error_chain(error))
}

/// The deepest cause: "Connection refused (os error 111)" rather than "client error (Connect)".
fn innermost(error: &kube::Error) -> String {
    let mut e: &dyn std::error::Error = error;
    while let Some(source) = e.source() {
        e = source;
    }
    one_line(&e.to_string())
}

fn one_line(text: &str) -> String {
    text.split_whitespace().collect::<Vec<_>>().join(" ")
}

#[cfg(test)]
mod tests {
    use super::*;
    use kube::core::Status;

    #[test]
    fn api_errors_carry_the_server_message() {
        let status = Status::failure("configmaps \"x\" is\nforbidden", "Forbidden").with_code(403);
        let e = kube::Error::Api(status.boxed());
        assert_eq!(status_code(&e), Some(403));
        let err = PluginError::api(&e, "https://k:6443", "cannot get configmaps \"x\"");
        assert_eq!(
            err.to_string(),
            "cannot get configmaps \"x\": configmaps \"x\" is forbidden"
        );
        let bare = kube::Error::Api(Status::failure("", "").with_code(500).boxed());
        assert_eq!(detail(&bare), "HTTP 500");
    }

    #[test]
    fn other_errors_are_one_line_without_repeats() {
        let io = std::io::Error::other("inner\ncause");
        let e = kube::Error::ReadEvents(io);
        assert_eq!(detail(&e), "Error reading events stream: inner cause");
    }
}
