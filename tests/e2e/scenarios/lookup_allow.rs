//! Rule 10 with `on_lookup_error = allow`: when the webhook may not read Locks, a write is let
//! through with a warning naming the lookup failure, and the failure is counted.
//!
//! The suite's webhook keeps `deny` (the lookup-error scenario checks it), so this scenario
//! starts a second `serve` of its own: `on_lookup_error = allow`, an identity without any RBAC
//! (a ServiceAccount of its namespace, bound to nothing), the registration left alone
//! (`registration.narrow = false`, and it could not write it anyway), on spare loopback ports.
//! It is registered nowhere, so the API server never calls it: AdmissionReviews (captured
//! fixtures moved into this scenario's namespace) are posted to it with curl, as the API server
//! would. Without RBAC it can write no lock status and no event, so the suite's locks are not
//! touched.

use std::path::Path;

use anyhow::{Context, Result, ensure};
use serde_json::{Value, json};

use super::metrics::{requests, scrape};
use crate::env::WebhookMode;
use crate::kubectl::run as exec;
use crate::suite::{Ctx, skip};
use crate::webhook::{self, SPARE_PORTS, Spare};

pub fn run(ctx: &Ctx) -> Result<()> {
    if ctx.env.cfg.mode != WebhookMode::Own {
        return skip("KOL_E2E_WEBHOOK=external: no certificates of the suite's to serve with");
    }
    if !exec(Path::new("curl"), &["--version"], None, None).ok() {
        return skip("no curl: the second instance cannot be asked directly");
    }
    let (port, metrics_port) = SPARE_PORTS;
    for p in [port, metrics_port] {
        if std::net::TcpStream::connect(("127.0.0.1", p)).is_ok() {
            return skip(format!("127.0.0.1:{p} is in use by another process"));
        }
    }
    let ns = ctx.namespace("")?;
    let n = ns.as_str();
    let files = &ctx.env.files;
    let kubeconfig = files.dir.join("lookup-allow-kubeconfig.yaml");
    webhook::identity_at(&ctx.env.kubectl, n, "no-rbac", &kubeconfig)?;
    let denied = ctx
        .k(&[
            "auth",
            "can-i",
            "list",
            "locks.objectlock.dev",
            "-n",
            n,
            &format!("--as=system:serviceaccount:{n}:no-rbac"),
        ])
        .stdout;
    ensure!(
        denied.trim() == "no",
        "the ServiceAccount without bindings may list Locks: {denied}"
    );
    let log = files.dir.join("lookup-allow.log");
    let instance = Spare::start(
        &ctx.env.cfg.server_bin,
        files,
        &kubeconfig,
        &log,
        (port, metrics_port),
        &[
            ("KUBE_OBJECT_LOCK__ON_LOOKUP_ERROR", "allow".to_owned()),
            ("KUBE_OBJECT_LOCK__REGISTRATION__NARROW", "false".to_owned()),
            (
                "KUBE_OBJECT_LOCK__INSTANCE__NAME",
                format!("kol-e2e-{}-lookup-allow", ctx.env.run),
            ),
        ],
    )?;

    let update = review(n, "configmap-update-merge-patch.json")?;
    let delete = review(n, "configmap-delete-unlocked.json")?;
    let mut seen = Vec::new();
    for (operation, review) in [("UPDATE", &update), ("DELETE", &delete)] {
        let answer = post(ctx, port, review)?;
        let name = review["request"]["name"].as_str().unwrap_or_default();
        let warning = format!(
            "lock state of configmaps \"{name}\" in namespace \"{n}\" could not be read; allowed (on_lookup_error=allow)"
        );
        let warnings = answer["warnings"].as_array().cloned().unwrap_or_default();
        ensure!(
            answer["allowed"] == true && warnings.iter().any(|w| w == warning.as_str()),
            "{operation} with on_lookup_error=allow and no RBAC: expected it allowed with `{warning}`, got {answer}"
        );
        let annotations = answer["auditAnnotations"].to_string();
        ensure!(
            annotations.contains("lookup-error") && annotations.contains("forbidden"),
            "{operation}: the audit annotations do not name the lookup failure: {annotations}"
        );
        seen.push(warning);
    }

    // Its own counters: exactly these two, both lookup errors, both allowed.
    let samples = scrape(metrics_port)?;
    let mut failures = Vec::new();
    for (series, want) in [
        (requests("UPDATE", "error"), 1.0),
        (requests("DELETE", "error"), 1.0),
        (requests("UPDATE", "allowed"), 0.0),
        (requests("UPDATE", "denied"), 0.0),
        (
            "kube_object_lock_lookup_errors_total{reason=\"forbidden\",decision=\"allow\"}"
                .to_owned(),
            2.0,
        ),
    ] {
        let got = samples.get(&series);
        if got != want {
            failures.push(format!("{series} is {got}, not {want}"));
        }
    }
    instance.stop()?;
    ensure!(failures.is_empty(), "{}", failures.join("; "));
    ctx.note(format!("warnings: {}", seen.join(" | ")));
    Ok(())
}

/// The fixture `file`, moved into namespace `ns`.
fn review(ns: &str, file: &str) -> Result<Value> {
    let path = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/fixtures")
        .join(file);
    let mut review: Value = serde_json::from_slice(&std::fs::read(&path)?)
        .with_context(|| format!("{}", path.display()))?;
    review["request"]["namespace"] = json!(ns);
    for side in ["object", "oldObject"] {
        if review["request"][side].is_object() {
            review["request"][side]["metadata"]["namespace"] = json!(ns);
        }
    }
    Ok(review)
}

/// The `response` of `review` posted to the instance on `port`.
fn post(ctx: &Ctx, port: u16, review: &Value) -> Result<Value> {
    let ca = ctx.env.files.pki("ca.crt");
    let url = format!("https://127.0.0.1:{port}/validate");
    let body = review.to_string();
    let out = exec(
        Path::new("curl"),
        &[
            "-sS",
            "--max-time",
            "10",
            "--cacert",
            &ca.to_string_lossy(),
            "-H",
            "content-type: application/json",
            "--data-binary",
            "@-",
            "-w",
            "\n%{http_code}",
            &url,
        ],
        Some(&body),
        None,
    )
    .check()?;
    let (text, code) = out
        .stdout
        .rsplit_once('\n')
        .context("curl printed no status code")?;
    ensure!(
        code.trim() == "200",
        "{url}: {} {}",
        code.trim(),
        text.trim()
    );
    let reply: Value = serde_json::from_str(text).with_context(|| format!("{url}: {text}"))?;
    Ok(reply["response"].clone())
}
