//! Finding the cluster as kubectl does (a kubeconfig file, `KUBECONFIG`, `~/.kube/config`, the
//! in-cluster account), for `serve` and the `kubectl lock` plugin alike.

use std::path::{Path, PathBuf};

use kube::config::{KubeConfigOptions, Kubeconfig};

/// Why no client configuration could be made.
#[derive(Debug, thiserror::Error)]
pub enum KubeconfigError {
    #[error("{}: {message}", path.display())]
    File { path: PathBuf, message: String },
    #[error("{0}")]
    Context(String),
    #[error("{0}")]
    NoConfig(String),
}

/// The client configuration for `kubeconfig` (else the usual places) and `context` (else the
/// current one).
pub async fn load(
    kubeconfig: Option<&Path>,
    context: Option<&str>,
) -> Result<kube::Config, KubeconfigError> {
    let options = KubeConfigOptions {
        context: context.map(str::to_owned),
        ..KubeConfigOptions::default()
    };
    match (kubeconfig, context) {
        (Some(path), _) => {
            let error = |message: String| KubeconfigError::File {
                path: path.to_owned(),
                message,
            };
            let file = Kubeconfig::read_from(path).map_err(|e| error(e.to_string()))?;
            kube::Config::from_custom_kubeconfig(file, &options)
                .await
                .map_err(|e| error(e.to_string()))
        }
        (None, Some(_)) => kube::Config::from_kubeconfig(&options)
            .await
            .map_err(|e| KubeconfigError::Context(e.to_string())),
        (None, None) => kube::Config::infer()
            .await
            .map_err(|e| KubeconfigError::NoConfig(e.to_string())),
    }
}

/// The client for `config`. A refused client certificate is explained by naming the
/// certificate (kube reports every such refusal as "invalid private key"); any other error
/// is written by `describe`.
pub fn client(
    config: kube::Config,
    describe: impl Fn(&kube::Error) -> String,
) -> Result<kube::Client, String> {
    let auth = config.auth_info.clone();
    kube::Client::try_from(config).map_err(|e| {
        crate::tls::identity::explain_kube_error(&auth, &e).unwrap_or_else(|| describe(&e))
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    const KUBECONFIG: &str = "apiVersion: v1\nkind: Config\nclusters:\n- name: c\n  cluster:\n    server: https://127.0.0.1:6443\ncontexts:\n- name: one\n  context:\n    cluster: c\n    namespace: prod\n- name: two\n  context:\n    cluster: c\ncurrent-context: one\n";

    #[tokio::test]
    async fn a_file_and_a_context() {
        let file = tempfile::NamedTempFile::new().expect("temp");
        std::fs::write(file.path(), KUBECONFIG).expect("write");
        let config = load(Some(file.path()), None).await.expect("loads");
        assert_eq!(config.default_namespace, "prod");
        let config = load(Some(file.path()), Some("two")).await.expect("loads");
        assert_eq!(config.default_namespace, "default");
        let err = load(Some(file.path()), Some("three"))
            .await
            .expect_err("no such context");
        assert!(
            matches!(&err, KubeconfigError::File { path, .. } if path == file.path()),
            "{err:?}"
        );
        assert!(err.to_string().contains("three"), "{err}");
        let missing = Path::new("/nonexistent/kubeconfig");
        let err = load(Some(missing), None).await.expect_err("missing");
        assert!(
            err.to_string().starts_with("/nonexistent/kubeconfig: "),
            "{err}"
        );
    }
}
