//! Errors of the plugin: each is one line, naming the flag, object or lock concerned.

/// Why `kubectl lock` or `kubectl unlock` failed, worded already; variants are those a caller
/// tells apart.
#[derive(Debug, thiserror::Error)]
pub enum PluginError {
    #[error("{0}")]
    Message(String),
    /// A resource type that names none, or several.
    #[error("{0}")]
    Resource(String),
    #[error("{0}")]
    AlreadyLocked(String),
    #[error("{0}")]
    NotInForce(String),
    /// `kubectl lock ... -- COMMAND` did not run the command; `code` is the exit status.
    #[error("{error}; the command was not run")]
    NotRun { code: u8, error: String },
}

impl PluginError {
    /// The exit status of `kubectl lock` for this error: 1, or the code of `NotRun`.
    pub fn exit_code(&self) -> u8 {
        match self {
            PluginError::NotRun { code, .. } => *code,
            _ => 1,
        }
    }

    /// `action` ("cannot create Lock prod/web") and the server's message, or that the API server
    /// never answered.
    pub fn api(error: &kube::Error, url: &str, action: impl Into<String>) -> PluginError {
        match error {
            kube::Error::HyperError(_) | kube::Error::Service(_) => {
                // The deepest cause: "Connection refused (os error 111)", not "client error".
                let causes =
                    std::iter::successors(Some(error as &dyn std::error::Error), |e| e.source());
                let detail = one_line(&causes.last().map(ToString::to_string).unwrap_or_default());
                PluginError::Message(format!("cannot reach the API server at {url}: {detail}"))
            }
            _ => PluginError::Message(format!("{}: {}", action.into(), detail(error))),
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

pub fn one_line(text: &str) -> String {
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
