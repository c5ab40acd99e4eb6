//! Dry-run DELETE and merge PATCH of the seeded objects, through validating admission: the
//! fake calls a registered webhook over HTTPS with a real `admission.k8s.io/v1` AdmissionReview
//! (`dryRun: true`), and turns a refusal into the Status kube-apiserver returns
//! (`admission webhook "NAME" denied the request: MESSAGE`, with the webhook's code).
//!
//! Nothing is stored: only dry runs are accepted (a real write of these objects is still
//! answered 405). Without a registered webhook the dry run is allowed, as it is when the
//! registration does not send the request. [`FakeApiServer::deny_first`] plays another
//! webhook that refuses before ours is asked.

use std::sync::Arc;

use bytes::Bytes;
use http::Method;
use http_body_util::{BodyExt, Full};
use serde_json::{Value, json};

use super::{FakeApiServer, ObjectRoute, Query, bad_request, status};

/// A validating webhook the fake calls.
#[derive(Clone)]
pub struct Webhook {
    pub url: String,
    pub ca: std::path::PathBuf,
}

/// What admission is configured to do.
#[derive(Clone, Default)]
pub struct AdmissionState {
    pub webhook: Option<Webhook>,
    /// Another webhook, called first, refusing with this message.
    pub deny_first: Option<String>,
}

/// Whether this request is a write of a seeded object the module answers: a DELETE (whose
/// `dryRun` may be in the query or, as kube-rs sends it, in the DeleteOptions body), or a PATCH
/// with `?dryRun=All`.
pub fn handles(method: &Method, path: &str, query: &Query) -> bool {
    let dry_query = query.get("dryRun").is_some_and(|d| d == "All");
    (method == Method::DELETE || (method == Method::PATCH && dry_query))
        && ObjectRoute::parse(path).is_some_and(|r| r.entry().is_some())
}

/// `dryRun: ["All"]` in the query or in a DeleteOptions body.
fn is_dry_run(query: &Query, body: &Bytes) -> bool {
    let in_body = serde_json::from_slice::<Value>(body).is_ok_and(|options| {
        options["dryRun"]
            .as_array()
            .is_some_and(|d| d.iter().any(|v| v == "All"))
    });
    in_body || query.get("dryRun").is_some_and(|d| d == "All")
}

impl FakeApiServer {
    /// Sends admission reviews of dry-run writes to the webhook at `url`, trusting `ca`.
    pub fn register_webhook(&self, url: &str, ca: &std::path::Path) {
        self.state().admission.webhook = Some(Webhook {
            url: url.to_owned(),
            ca: ca.to_owned(),
        });
    }

    /// Another webhook refuses every dry-run write first, with `message`.
    pub fn deny_first(&self, message: &str) {
        self.state().admission.deny_first = Some(message.to_owned());
    }

    pub(super) async fn dry_run(
        &self,
        method: &Method,
        path: &str,
        query: &Query,
        content_type: &str,
        body: &Bytes,
    ) -> Result<(u16, Value), Value> {
        if !is_dry_run(query, body) {
            return Err(status(405, super::NOT_ALLOWED, json!({})));
        }
        let route = ObjectRoute::parse(path).expect("checked by handles");
        let entry = route.entry().expect("checked by handles");
        let current = self.state().others.get(&super::decode(path)).cloned();
        let Some(current) = current else {
            return Err(route.not_found());
        };
        let (operation, object) = match *method {
            Method::DELETE => ("DELETE", Value::Null),
            _ => {
                if content_type != "application/merge-patch+json" {
                    let msg = format!(
                        "this fake accepts only application/merge-patch+json for a dry-run patch, got {content_type:?}"
                    );
                    return Err(status(415, &msg, Value::Null));
                }
                let patch: Value = serde_json::from_slice(body)
                    .map_err(|e| bad_request(&format!("error decoding request body: {e}")))?;
                let mut patched = current.clone();
                super::ext::merge_patch(&mut patched, &patch);
                ("UPDATE", patched)
            }
        };
        let admission = self.state().admission.clone();
        if let Some(message) = admission.deny_first {
            let msg =
                format!("admission webhook \"other.example.com\" denied the request: {message}");
            return Err(status(403, &msg, Value::Null));
        }
        let answer = match *method {
            Method::DELETE => json!({ "kind": "Status", "apiVersion": "v1", "status": "Success",
                "details": { "name": route.name, "kind": route.plural } }),
            _ => object.clone(),
        };
        let Some(webhook) = admission.webhook else {
            return Ok((200, answer));
        };
        let (group, version) = match route.group_version.split_once('/') {
            Some((g, v)) => (g.to_owned(), v.to_owned()),
            None => (String::new(), route.group_version.clone()),
        };
        let kind = json!({ "group": group, "version": version, "kind": entry["kind"] });
        let resource = json!({ "group": group, "version": version, "resource": route.plural });
        let mut request = json!({
            "uid": format!("dry-run-{}", self.state().log.len()),
            "kind": kind, "resource": resource, "requestKind": kind, "requestResource": resource,
            "name": route.name, "operation": operation,
            "userInfo": { "username": "kubernetes-admin", "groups": ["kubeadm:cluster-admins", "system:authenticated"] },
            "object": object, "oldObject": current, "dryRun": true,
        });
        if let Some(ns) = &route.ns {
            request["namespace"] = json!(ns);
        }
        let review = json!({ "kind": "AdmissionReview", "apiVersion": "admission.k8s.io/v1", "request": request });
        let webhook_name = if route.ns.is_some() {
            "namespaced.objectlock.dev"
        } else {
            "cluster.objectlock.dev"
        };
        let response = match call(&webhook, &review).await {
            Ok(response) => response,
            Err(e) => {
                let msg = format!(
                    "Internal error occurred: failed calling webhook \"{webhook_name}\": {e}"
                );
                return Err(status(500, &msg, Value::Null));
            }
        };
        if response["response"]["allowed"] == true {
            return Ok((200, answer));
        }
        let result = &response["response"]["status"];
        let code = result["code"].as_u64().filter(|c| *c >= 400).unwrap_or(400) as u16;
        let msg = format!(
            "admission webhook \"{webhook_name}\" denied the request: {}",
            result["message"].as_str().unwrap_or_default()
        );
        Err(status(code, &msg, Value::Null))
    }
}

/// POSTs the review to the webhook over HTTPS (HTTP/1.1, as kube-apiserver does).
async fn call(webhook: &Webhook, review: &Value) -> Result<Value, String> {
    use rustls_pki_types::CertificateDer;
    use rustls_pki_types::pem::PemObject;
    let mut roots = rustls::RootCertStore::empty();
    for cert in CertificateDer::pem_file_iter(&webhook.ca).map_err(|e| e.to_string())? {
        roots
            .add(cert.map_err(|e| e.to_string())?)
            .map_err(|e| e.to_string())?;
    }
    let tls = rustls::ClientConfig::builder_with_provider(Arc::new(
        rustls::crypto::ring::default_provider(),
    ))
    .with_safe_default_protocol_versions()
    .map_err(|e| e.to_string())?
    .with_root_certificates(roots)
    .with_no_client_auth();
    let connector = hyper_rustls::HttpsConnectorBuilder::new()
        .with_tls_config(tls)
        .https_only()
        .enable_http1()
        .build();
    let client = hyper_util::client::legacy::Client::builder(hyper_util::rt::TokioExecutor::new())
        .build::<_, Full<Bytes>>(connector);
    let request = http::Request::post(format!("{}?timeout=5s", webhook.url))
        .header("content-type", "application/json")
        .body(Full::new(Bytes::from(
            serde_json::to_vec(review).map_err(|e| e.to_string())?,
        )))
        .map_err(|e| e.to_string())?;
    let response = client.request(request).await.map_err(|e| e.to_string())?;
    let body = response
        .into_body()
        .collect()
        .await
        .map_err(|e| e.to_string())?
        .to_bytes();
    serde_json::from_slice(&body).map_err(|e| e.to_string())
}
