//! `kube-object-lock manifests`: what registering the webhook needs (CRDs, RBAC, webhook
//! configuration, the API server's mTLS files), generated from the types the webhook uses.
//! Invariant: the API server never sends the lock resources, leases, events, requests from
//! nodes or itself, or anything in `kube-system` and `kube-node-lease`: with
//! `failurePolicy: Fail`, everything sent here stops when the webhook stops.

use std::path::{Path, PathBuf};

use base64::Engine;
use k8s_openapi::ByteString;
use k8s_openapi::api::admissionregistration::v1::ValidatingWebhookConfiguration;
use k8s_openapi::api::rbac::v1::{ClusterRole, ClusterRoleBinding};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::LabelSelector;
use rustls_pki_types::CertificateDer;
use rustls_pki_types::pem::PemObject;
use serde::Serialize;
use serde::de::DeserializeOwned;
use serde_json::{Value, json};

use crate::admission::subresources;
use crate::{api, registration};

pub mod alerts;
pub mod policy;
mod selector;

/// Name of the webhook configuration, the ClusterRole and its binding.
pub const NAME: &str = "kube-object-lock";
pub const STATIC_NAME: &str = "kube-object-lock.static.k8s.io";
/// The default URL: the webhook next to each API server.
pub const DEFAULT_URL: &str = "https://127.0.0.1:8443/validate";
/// Where the API server reads its side of mTLS by default.
pub const DEFAULT_APISERVER_DIR: &str = "/etc/kubernetes/kube-object-lock";

#[derive(Debug, thiserror::Error)]
pub enum ManifestsError {
    #[error("--ca-file {path}: {message}")]
    CaFile { path: PathBuf, message: String },
    #[error("--url {0:?} must be an https:// URL with a host, e.g. {DEFAULT_URL}")]
    Url(String),
    #[error("--namespace-selector {selector:?}: {message}")]
    NamespaceSelector { selector: String, message: String },
    #[error("--timeout-seconds {0} must be between 1 and 30")]
    Timeout(i32),
    #[error("--service-account {0:?} must be NAMESPACE/NAME")]
    ServiceAccount(String),
    #[error("{flag} {path}: {message}")]
    ClientFile {
        flag: &'static str,
        path: PathBuf,
        message: String,
    },
    #[error("cannot write {path}: {source}")]
    Write {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("cannot render YAML: {0}")]
    Yaml(String),
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum FailurePolicy {
    /// Refuse the request when the webhook cannot be called (the default: locks hold).
    #[value(name = "Fail", alias = "fail")]
    Fail,
    /// Let the request through when the webhook cannot be called.
    #[value(name = "Ignore", alias = "ignore")]
    Ignore,
}

/// Whom the ClusterRoleBinding names: the webhook's own identity.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Identity {
    /// A user (client certificate CN or token user).
    User(String),
    ServiceAccount {
        namespace: String,
        name: String,
    },
}

impl Identity {
    pub fn service_account(text: &str) -> Result<Identity, ManifestsError> {
        match text.split_once('/') {
            Some((ns, name)) if !ns.is_empty() && !name.is_empty() && !name.contains('/') => {
                Ok(Identity::ServiceAccount {
                    namespace: ns.to_owned(),
                    name: name.to_owned(),
                })
            }
            _ => Err(ManifestsError::ServiceAccount(text.to_owned())),
        }
    }
}

#[derive(Debug, Clone)]
pub struct Registration {
    pub url: String,
    /// PEM of the CA that signed the serving certificate.
    pub ca_bundle: Vec<u8>,
    pub failure_policy: FailurePolicy,
    pub timeout_seconds: i32,
    pub identity: Identity,
    /// The operator's requirements on namespaces (`--namespace-selector`): locks apply only in
    /// the namespaces they select. Empty: every namespace but the excluded ones.
    pub namespaces: LabelSelector,
}

impl Registration {
    /// Checks the options and reads the CA file.
    pub fn new(
        url: &str,
        ca_file: &Path,
        failure_policy: FailurePolicy,
        timeout_seconds: i32,
        identity: Identity,
    ) -> Result<Registration, ManifestsError> {
        https_authority(url)?;
        if !(1..=30).contains(&timeout_seconds) {
            return Err(ManifestsError::Timeout(timeout_seconds));
        }
        let ca_error = |message: String| ManifestsError::CaFile {
            path: ca_file.to_owned(),
            message,
        };
        let ca_bundle = std::fs::read(ca_file).map_err(|e| ca_error(e.to_string()))?;
        let certs = CertificateDer::pem_slice_iter(&ca_bundle)
            .collect::<Result<Vec<_>, _>>()
            .map_err(|e| ca_error(e.to_string()))?;
        if certs.is_empty() {
            return Err(ca_error("no CERTIFICATE block found".to_owned()));
        }
        Ok(Registration {
            url: url.to_owned(),
            ca_bundle,
            failure_policy,
            timeout_seconds,
            identity,
            namespaces: LabelSelector::default(),
        })
    }

    /// Limits locking to the namespaces `text` (a label selector, e.g. `lockable=true`) selects.
    pub fn with_namespace_selector(mut self, text: &str) -> Result<Registration, ManifestsError> {
        self.namespaces =
            selector::parse(text).map_err(|message| ManifestsError::NamespaceSelector {
                selector: text.to_owned(),
                message,
            })?;
        Ok(self)
    }
}

pub fn webhook_configuration(reg: &Registration, name: &str) -> ValidatingWebhookConfiguration {
    let update_delete = |resources: Vec<String>, scope: &str| {
        json!({
            "operations": ["UPDATE", "DELETE"],
            "apiGroups": ["*"],
            "apiVersions": ["*"],
            "resources": resources,
            "scope": scope,
        })
    };
    let entry = |entry_name: &str, rules: Value| {
        json!({
            "name": entry_name,
            "admissionReviewVersions": ["v1"],
            "clientConfig": {"url": reg.url, "caBundle": ByteString(reg.ca_bundle.clone())},
            "failurePolicy": format!("{:?}", reg.failure_policy),
            "matchPolicy": "Equivalent",
            // Refusals are recorded as Events, except for dry runs.
            "sideEffects": "NoneOnDryRun",
            "timeoutSeconds": reg.timeout_seconds,
            // The cluster-scoped entry's selects Namespace objects by their own labels: the same
            // exclusions and requirements.
            "namespaceSelector": registration::namespaced_selector(
                Some(&reg.namespaces),
                registration::Narrowing::Broad,
            ),
            // Traffic that must never depend on the webhook.
            "matchConditions": [
                {
                    "name": "not-lock-resources",
                    "expression": format!("request.resource.group != '{}'", api::GROUP),
                },
                {
                    "name": "not-leases",
                    "expression": "!(request.resource.group == 'coordination.k8s.io' && \
                                   request.resource.resource == 'leases')",
                },
                {"name": "not-events", "expression": "request.resource.resource != 'events'"},
                {"name": "not-nodes", "expression": "!('system:nodes' in request.userInfo.groups)"},
                {
                    "name": "not-apiserver",
                    "expression": "request.userInfo.username != 'system:apiserver'",
                },
            ],
            "rules": rules,
        })
    };
    typed(json!({
        "metadata": {"name": name, "labels": {"app.kubernetes.io/name": NAME}},
        "webhooks": [
            entry("namespaced.objectlock.dev", json!([
                update_delete(subresources::rule_resources(true), "Namespaced"),
                // Eviction deletes the pod without a DELETE reaching admission.
                {
                    "operations": ["CREATE"],
                    "apiGroups": [""],
                    "apiVersions": ["v1"],
                    "resources": ["pods/eviction"],
                    "scope": "Namespaced",
                },
            ])),
            // Includes DELETE of Namespaces (refused while they hold Locks).
            entry("cluster.objectlock.dev", json!([
                update_delete(subresources::rule_resources(false), "Cluster"),
            ])),
        ],
    }))
}

/// Core resources whose labels selector Locks may need: evicted pods, scaled
/// ReplicationControllers.
pub const LABELS_READ_CORE: [&str; 2] = ["pods", "replicationcontrollers"];
/// `apps` resources with a `scale` subresource, whose labels selector Locks may need.
pub const LABELS_READ_APPS: [&str; 3] = ["deployments", "replicasets", "statefulsets"];

/// The ClusterRole (read the locks, write their status, record refusal events, get the labels
/// of evicted pods and scaled objects; nothing else) and its binding to the webhook's identity.
pub fn rbac(identity: &Identity) -> (ClusterRole, ClusterRoleBinding) {
    let metadata = json!({"name": NAME, "labels": {"app.kubernetes.io/name": NAME}});
    let rule = |group: &str, resources: &[&str], verbs: &[&str]| {
        json!({
            "apiGroups": [group],
            "resources": resources,
            "verbs": verbs,
        })
    };
    let locks = [api::LOCKS, api::CLUSTER_LOCKS];
    let status = locks.map(|r| format!("{r}/status"));
    let role = json!({
        "metadata": metadata,
        "rules": [
            rule(api::GROUP, &locks, &["get", "list", "watch"]),
            // Each instance records in a lock's status that it enforces it.
            rule(api::GROUP, &status.each_ref().map(String::as_str), &["patch"]),
            // Refusals are recorded as Events regarding the lock (a series: create, then patch).
            rule("events.k8s.io", &["events"], &["create", "patch"]),
            // A selector Lock applies to an eviction or a scale by the labels of the pod or the
            // scaled object, which their reviews do not carry: the webhook GETs them (RBAC has no
            // metadata-only verb), only in namespaces holding a selector Lock; never list or watch.
            rule("", &LABELS_READ_CORE, &["get"]),
            rule("apps", &LABELS_READ_APPS, &["get"]),
            // A lock on fields covering a custom resource's scale needs the field the scale
            // writes, which only the CRD says (specReplicasPath).
            rule("apiextensions.k8s.io", &["customresourcedefinitions"], &["get"]),
        ],
    });
    let subject = match identity {
        Identity::User(name) => {
            json!({"kind": "User", "name": name, "apiGroup": "rbac.authorization.k8s.io"})
        }
        Identity::ServiceAccount { namespace, name } => {
            json!({"kind": "ServiceAccount", "name": name, "namespace": namespace})
        }
    };
    let binding = json!({
        "metadata": metadata,
        "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": NAME},
        "subjects": [subject],
    });
    (typed(role), typed(binding))
}

/// A manifest written as JSON, as its Kubernetes type.
fn typed<T: DeserializeOwned>(value: Value) -> T {
    serde_json::from_value(value).expect("a manifest of its type")
}

/// Everything for `kubectl apply -f -`: CRDs, RBAC, webhook configuration. Narrowed: the
/// configuration starts matching nothing locked (the running webhook adds the locked names) and
/// the role may keep that one configuration up to date.
pub fn cluster(reg: &Registration) -> Result<String, ManifestsError> {
    cluster_yaml(reg, true)
}

/// Like [`cluster`], broad: every UPDATE and DELETE is sent to the webhook, which never writes
/// its configuration (for clusters that do not let it).
pub fn cluster_broad(reg: &Registration) -> Result<String, ManifestsError> {
    cluster_yaml(reg, false)
}

fn cluster_yaml(reg: &Registration, narrowed: bool) -> Result<String, ManifestsError> {
    let (mut role, binding) = rbac(&reg.identity);
    let mut config = webhook_configuration(reg, NAME);
    if narrowed {
        let rules = role.rules.get_or_insert_with(Vec::new);
        rules.push(registration::rbac_rule(NAME));
        // The status of a Lock in a namespace the operator's requirements leave out says so,
        // from the namespaces' labels.
        rules.push(crate::status::namespaces::rbac_rule());
        let format = registration::NAMESPACES_FORMAT.to_owned();
        config.metadata.annotations =
            Some([(registration::FORMAT_ANNOTATION.to_owned(), format)].into());
        let webhooks = config.webhooks.as_deref().unwrap_or_default();
        config.webhooks = Some(
            registration::starting_point(webhooks)
                .map_err(|e| ManifestsError::Yaml(e.to_string()))?,
        );
    }
    let mut out = api::crds_yaml().map_err(|e| ManifestsError::Yaml(e.to_string()))?;
    out += &document(&role)?;
    out += &document(&binding)?;
    out += &document(&policy::policy())?;
    out += &document(&policy::binding())?;
    out += &document(&config)?;
    out += &format!(
        "---\n# Not bound: lifts anyone's held lock. Bind it to administrators, e.g.\n\
         #   kubectl create clusterrolebinding {role}-admins --clusterrole {role} --group lock-admins\n",
        role = policy::UNLOCK_ROLE
    );
    Ok(out + &yaml(&policy::unlock_role())?)
}

/// The file for the API server's `staticManifestsDir`: always broad, as the running webhook
/// cannot write it to narrow it.
pub fn static_manifest(reg: &Registration) -> Result<String, ManifestsError> {
    document(&webhook_configuration(reg, STATIC_NAME))
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ApiServerFiles {
    pub admission_config: String,
    /// `webhook-kubeconfig.yaml`, the client certificate the API server presents.
    pub kubeconfig: String,
}

/// The file names inside the API server's directory.
pub const ADMISSION_CONFIG_FILE: &str = "admission-config.yaml";
pub const KUBECONFIG_FILE: &str = "webhook-kubeconfig.yaml";

/// The AdmissionConfiguration and the kubeconfig it points to. `apiserver_dir` is the
/// directory as the API server sees it (inside its static pod); `static_dir` adds
/// `staticManifestsDir` (Kubernetes 1.37; 1.36 behind its feature gate).
pub fn apiserver(
    url: &str,
    client_cert: &Path,
    client_key: &Path,
    apiserver_dir: &Path,
    static_dir: Option<&Path>,
) -> Result<ApiServerFiles, ManifestsError> {
    let authority = https_authority(url)?;
    // The API server picks the client certificate by `users[].name` == host:port of the URL; a
    // mismatch silently sends none. The port is explicit even when it is 443.
    let user = match authority.port() {
        Some(_) => authority.as_str().to_owned(),
        None => format!("{}:443", authority.as_str()),
    };
    let read = |flag: &'static str, path: &Path, pem_kind: &str| {
        let error = |message| ManifestsError::ClientFile {
            flag,
            path: path.to_owned(),
            message,
        };
        let bytes = std::fs::read(path).map_err(|e| error(e.to_string()))?;
        if !String::from_utf8_lossy(&bytes).contains(pem_kind) {
            return Err(error(format!("no {pem_kind} PEM block")));
        }
        Ok(base64::engine::general_purpose::STANDARD.encode(bytes))
    };
    let cert = read("--client-cert", client_cert, "CERTIFICATE")?;
    let key = read("--client-key", client_key, "PRIVATE KEY")?;
    let mut webhook = json!({
        "apiVersion": "apiserver.config.k8s.io/v1",
        "kind": "WebhookAdmissionConfiguration",
        "kubeConfigFile": apiserver_dir.join(KUBECONFIG_FILE),
    });
    if let Some(dir) = static_dir {
        webhook["staticManifestsDir"] = json!(dir);
    }
    let admission = json!({
        "apiVersion": "apiserver.config.k8s.io/v1",
        "kind": "AdmissionConfiguration",
        "plugins": [{"name": "ValidatingAdmissionWebhook", "configuration": webhook}],
    });
    let kubeconfig = json!({
        "apiVersion": "v1",
        "kind": "Config",
        "users": [{
            "name": user,
            "user": {"client-certificate-data": cert, "client-key-data": key},
        }],
    });
    Ok(ApiServerFiles {
        admission_config: yaml(&admission)?,
        kubeconfig: yaml(&kubeconfig)?,
    })
}

/// Writes the API server's files into `dir` (the key-bearing kubeconfig mode 0600).
pub fn write_apiserver(dir: &Path, files: &ApiServerFiles) -> Result<Vec<PathBuf>, ManifestsError> {
    let files = [
        (ADMISSION_CONFIG_FILE, &files.admission_config, 0o644),
        (KUBECONFIG_FILE, &files.kubeconfig, 0o600),
    ];
    super::certs::write_files(dir, files, true)
        .map_err(|(path, source)| ManifestsError::Write { path, source })
}

/// Plain scalars only: base64 data (caBundle, client keys) stays on one unfolded line.
fn yaml(value: &impl Serialize) -> Result<String, ManifestsError> {
    let mut options = serde_saphyr::SerializerOptions::default();
    options.prefer_block_scalars = false;
    serde_saphyr::to_string_with_options(value, options)
        .map_err(|e| ManifestsError::Yaml(e.to_string()))
}

fn document(value: &impl Serialize) -> Result<String, ManifestsError> {
    Ok(format!("---\n{}", yaml(value)?))
}

/// The host:port of an https:// URL with a host.
fn https_authority(url: &str) -> Result<http::uri::Authority, ManifestsError> {
    let uri = url.parse::<http::Uri>().ok();
    let https = uri.filter(|uri| uri.scheme_str() == Some("https") && uri.host().is_some());
    (https.and_then(|uri| uri.authority().cloned()))
        .ok_or_else(|| ManifestsError::Url(url.to_owned()))
}

#[cfg(test)]
mod tests;
