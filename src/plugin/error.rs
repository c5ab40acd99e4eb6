//! Errors of the plugin: each is one line, naming the flag, object or lock concerned.

/// Why `kubectl lock` or `kubectl unlock` failed.
#[derive(Debug, thiserror::Error)]
pub enum PluginError {
    /// The lock was created but is not confirmed in force; `waited` is ` after 10s` or empty.
    #[error(
        "{lock} was created but is not in force{waited} (it stays; kubectl unlock removes it): {reason}"
    )]
    NotInForce {
        lock: String,
        waited: String,
        reason: String,
    },
    /// `" FILE: why"` or `": why"`.
    #[error("cannot load the kubeconfig{0}")]
    Kubeconfig(String),
    #[error("no cluster configured (--kubeconfig, KUBECONFIG, ~/.kube/config or in-cluster): {0}")]
    NoConfig(String),
    #[error("cannot reach the API server at {url}: {detail}")]
    Unreachable { url: String, detail: String },
    #[error(
        "{lock} is held by {holder}: only its holder, or someone granted the \"unlock\" verb on it, may lift it (kubectl auth whoami says who you are): {detail}"
    )]
    Held {
        lock: String,
        holder: String,
        detail: String,
    },
    /// `action`: what was attempted ("cannot create Lock prod/web").
    #[error("{action}: {detail}")]
    Api { action: String, detail: String },
    #[error("{0}")]
    Usage(String),
    #[error("cannot write the man pages into {dir}: {error}")]
    ManPages { dir: String, error: std::io::Error },
    /// `hint`: the discovery documents that could not be read, if any.
    #[error("the server doesn't have a resource type \"{resource}\"{hint}")]
    UnknownResource { resource: String, hint: String },
    #[error("resource type \"{resource}\" is ambiguous: it may be {candidates}; name one of them")]
    Ambiguous {
        resource: String,
        candidates: String,
    },
    #[error(
        "{resource} cannot be locked: locks are never locked, so unlocking never waits on the webhook"
    )]
    LockingALock { resource: String },
    #[error("{target} does not exist (lock it anyway with --allow-missing)")]
    TargetMissing { target: String },
    #[error("{lock} would never be enforced: {why} (pass --force-unenforced to create it anyway)")]
    Unenforced { lock: String, why: String },
    /// `scope`: ` -n prod`, or empty for a ClusterLock.
    #[error("{lock} already exists (see kubectl lock list{scope}; kubectl unlock removes it)")]
    AlreadyLocked { lock: String, scope: String },
    /// `kubectl lock ... -- COMMAND` did not run the command; `code` is the exit status.
    #[error("{error}; the command was not run")]
    NotRun { code: u8, error: Box<PluginError> },
    #[error("interrupted by {0}")]
    Interrupted(String),
    #[error("cannot run {command}: {detail}")]
    CannotRun { command: String, detail: String },
    /// `why`: why a lock of that name does not count, if there is one.
    #[error("no lock on {target}{why}")]
    NoLock { target: String, why: String },
}

impl PluginError {
    /// The exit status of `kubectl lock` for this error: 1, or the code of `NotRun`.
    pub fn exit_code(&self) -> u8 {
        match self {
            PluginError::NotRun { code, .. } => *code,
            _ => 1,
        }
    }

    /// `Unreachable` when the request never got an answer, else `Api` with the server's message.
    pub fn api(error: &kube::Error, url: &str, action: impl Into<String>) -> PluginError {
        match error {
            kube::Error::HyperError(_) | kube::Error::Service(_) => {
                // The deepest cause: "Connection refused (os error 111)", not "client error".
                let mut e: &dyn std::error::Error = error;
                while let Some(source) = e.source() {
                    e = source;
                }
                PluginError::Unreachable {
                    url: url.to_owned(),
                    detail: one_line(&e.to_string()),
                }
            }
            _ => PluginError::Api {
                action: action.into(),
                detail: detail(error),
            },
        }
    }
}

pub fn status_code(error: &kube::Error) -> Option<u16> {
    match error {
        kube::Error::Api(status) => Some(status.code),
        _ => None,
    }
}

/// A kube error as one line: the server's message for an error response, else the chain of
/// causes, each written once.
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

fn one_line(text: &str) -> String {
    text.split_whitespace().collect::<Vec<_>>().join(" ")
}

#[cfg(test)]
mod tests {
    use super::*;
    use kube::core::Status;

    #[test]
    fn errors_are_one_line() {
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
        let io = std::io::Error::other("inner\ncause");
        let e = kube::Error::ReadEvents(io);
        assert_eq!(detail(&e), "Error reading events stream: inner cause");
    }
}
