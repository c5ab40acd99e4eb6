//! The REST API as a program sees it: status code, `Status` body and `Warning` headers, through
//! kube's client (so any kubeconfig kube-rs understands works: certificates, tokens, kind).

use std::path::Path;
use std::time::{Duration, Instant};

use anyhow::{Context, Result, ensure};
use http_body_util::BodyExt;
use kube::config::{KubeConfigOptions, Kubeconfig};
use serde_json::Value;

/// A client and the runtime that drives it (the scenarios are plain threads).
pub struct Rest {
    client: kube::Client,
    rt: std::sync::Arc<tokio::runtime::Runtime>,
}

/// An answer.
#[derive(Debug, Clone)]
pub struct Reply {
    pub code: u16,
    pub body: Value,
    pub warnings: Vec<String>,
}

impl Reply {
    pub fn ok(&self) -> bool {
        (200..300).contains(&self.code)
    }

    /// `Status.message` of an error.
    pub fn message(&self) -> &str {
        self.body["message"].as_str().unwrap_or_default()
    }

    /// `Status.reason` of an error.
    pub fn reason(&self) -> &str {
        self.body["reason"].as_str().unwrap_or_default()
    }

    /// Asserts a 403 `Forbidden` `Status` whose message contains `message`.
    pub fn refused(&self, what: &str, message: &str) -> Result<()> {
        ensure!(
            self.code == 403 && self.reason() == "Forbidden" && self.message().contains(message),
            "{what}: expected 403 Forbidden with `{message}`, got {} {}: {}",
            self.code,
            self.reason(),
            if self.ok() {
                "(allowed)".to_owned()
            } else {
                self.message().to_owned()
            }
        );
        ensure!(
            self.body["kind"] == "Status" && self.body["status"] == "Failure",
            "{what}: the refusal is not a Status: {}",
            self.body
        );
        Ok(())
    }

    /// Asserts a 2xx.
    pub fn allowed(&self, what: &str) -> Result<()> {
        ensure!(
            self.ok(),
            "{what}: expected it allowed, got {} {}: {}",
            self.code,
            self.reason(),
            self.message()
        );
        Ok(())
    }
}

/// The text of a `Warning` header (`299 - "text"`, with `\"` and `\\` escaped).
fn warning_text(header: &str) -> String {
    let quoted = header
        .strip_prefix("299 - \"")
        .and_then(|rest| rest.strip_suffix('"'));
    let Some(quoted) = quoted else {
        return header.to_owned();
    };
    let mut text = String::with_capacity(quoted.len());
    let mut chars = quoted.chars();
    while let Some(c) = chars.next() {
        match c {
            '\\' => text.extend(chars.next()),
            c => text.push(c),
        }
    }
    text
}

impl Rest {
    pub fn new(kubeconfig: &Path) -> Result<Rest> {
        let rt = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .enable_all()
            .build()?;
        let client = rt.block_on(async {
            let kc = Kubeconfig::read_from(kubeconfig)?;
            let mut config =
                kube::Config::from_custom_kubeconfig(kc, &KubeConfigOptions::default())
                    .await
                    .context("kubeconfig")?;
            // Every answer as the API server gave it: kube retries 503s by default.
            config.default_retry = false;
            anyhow::Ok(kube::Client::try_from(config)?)
        })?;
        Ok(Rest {
            client,
            rt: std::sync::Arc::new(rt),
        })
    }

    /// Sends `method path` with an optional body (`content_type` applies to it).
    pub fn call(
        &self,
        method: &str,
        path: &str,
        content_type: &str,
        body: Option<&Value>,
    ) -> Result<Reply> {
        let bytes = match body {
            Some(Value::String(raw)) => raw.clone().into_bytes(),
            Some(v) => serde_json::to_vec(v)?,
            None => Vec::new(),
        };
        let request = http::Request::builder()
            .method(method)
            .uri(path)
            .header(http::header::CONTENT_TYPE, content_type)
            .header(http::header::ACCEPT, "application/json")
            .body(kube::client::Body::from(bytes))?;
        self.rt.block_on(async {
            let response = tokio::time::timeout(Duration::from_secs(30), self.client.send(request))
                .await
                .with_context(|| format!("{method} {path}: no answer in 30s"))?
                .with_context(|| format!("{method} {path}"))?;
            let code = response.status().as_u16();
            let warnings = response
                .headers()
                .get_all(http::header::WARNING)
                .iter()
                .filter_map(|v| v.to_str().ok())
                .map(warning_text)
                .collect();
            let bytes = response.into_body().collect().await?.to_bytes();
            let body = serde_json::from_slice(&bytes)
                .unwrap_or_else(|_| Value::String(String::from_utf8_lossy(&bytes).into_owned()));
            Ok(Reply {
                code,
                body,
                warnings,
            })
        })
    }

    pub fn get(&self, path: &str) -> Result<Reply> {
        self.call("GET", path, "application/json", None)
    }

    pub fn post(&self, path: &str, body: &Value) -> Result<Reply> {
        self.call("POST", path, "application/json", Some(body))
    }

    pub fn put(&self, path: &str, body: &Value) -> Result<Reply> {
        self.call("PUT", path, "application/json", Some(body))
    }

    pub fn merge_patch(&self, path: &str, body: &Value) -> Result<Reply> {
        self.call("PATCH", path, "application/merge-patch+json", Some(body))
    }

    pub fn delete(&self, path: &str) -> Result<Reply> {
        self.call("DELETE", path, "application/json", None)
    }

    /// A server-side dry-run merge patch adding an annotation: the API server runs admission
    /// and changes nothing.
    pub fn probe_update(&self, path: &str) -> Result<Reply> {
        self.merge_patch(
            &format!("{path}?dryRun=All"),
            &serde_json::json!({"metadata": {"annotations": {"objectlock.dev/e2e-probe": "1"}}}),
        )
    }

    /// A server-side dry-run DELETE.
    pub fn probe_delete(&self, path: &str) -> Result<Reply> {
        self.delete(&format!("{path}?dryRun=All"))
    }
}

/// Repeats `probe` until it is refused with 403 (at most `within`): how long that took, how
/// many tries were allowed before, and the refusal. Other failures (a webhook call that failed,
/// a 503) are retried too and counted apart.
pub struct Enforced {
    pub after: Duration,
    pub allowed_before: usize,
    pub failed_before: usize,
    pub refusal: Reply,
}

pub fn until_refused(
    within: Duration,
    mut probe: impl FnMut() -> Result<Reply>,
) -> Result<Enforced> {
    let start = Instant::now();
    let (mut allowed, mut failed) = (0, 0);
    let mut last = None;
    loop {
        match probe() {
            Ok(reply) if reply.code == 403 => {
                return Ok(Enforced {
                    after: start.elapsed(),
                    allowed_before: allowed,
                    failed_before: failed,
                    refusal: reply,
                });
            }
            Ok(reply) if reply.ok() => allowed += 1,
            Ok(reply) => {
                failed += 1;
                last = Some(format!("{} {}", reply.code, reply.message()));
            }
            Err(e) => {
                failed += 1;
                last = Some(format!("{e:#}"));
            }
        }
        ensure!(
            start.elapsed() < within,
            "not refused within {within:?} ({allowed} allowed, {failed} failed; last failure: {})",
            last.as_deref().unwrap_or("none")
        );
        std::thread::sleep(Duration::from_millis(10));
    }
}
