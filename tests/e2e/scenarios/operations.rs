//! CREATE and CONNECT are sent only for the Locks that ask for them: with a Lock asking CREATE
//! (and one asking CONNECT) the registration gains `create.objectlock.dev` (and
//! `connect.objectlock.dev`), written under the field manager `kube-object-lock-operations`
//! alone, as `kubectl get --show-managed-fields` shows; a CREATE of the locked name reaches the
//! webhook and one of another name, or in another namespace, does not (the API server's count of
//! calls to the entry and the webhook's count of CREATE reviews); the Locks deleted, the entries
//! go. What the webhook answers to those CREATEs is not asserted here.

use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail, ensure};
use serde_json::{Value, json};

use crate::env::WebhookMode;
use crate::scenarios::metrics::scrape;
use crate::scenarios::narrowing::webhook_calls_to;
use crate::suite::{Ctx, ENFORCE_WITHIN, skip};
use crate::webhook::{METRICS_PORT, REGISTRATION};

pub const CREATE: &str = "create.objectlock.dev";
const CONNECT: &str = "connect.objectlock.dev";
const NAMESPACED: &str = "namespaced.objectlock.dev";
/// The base entries' field manager, and that of the CREATE and CONNECT entries.
const MANAGER: &str = "kube-object-lock";
pub const OPERATIONS_MANAGER: &str = "kube-object-lock-operations";
/// The webhook's count of CREATE reviews, every decision.
const CREATE_REVIEWS: &str = "kube_object_lock_admission_requests_total{operation=\"CREATE\"";

pub fn run(ctx: &Ctx) -> Result<()> {
    if ctx.env.cfg.mode != WebhookMode::Own {
        return skip("KOL_E2E_WEBHOOK=external: the webhook's metrics listener is not the suite's");
    }
    let ns = ctx.namespace("")?;
    let elsewhere = ctx.namespace("other")?;
    // Nothing asks for CREATE or CONNECT yet (the scenario runs alone).
    wait_for_entries(ctx, "no CREATE or CONNECT entry before", |names| {
        !names.iter().any(|n| n == CREATE || n == CONNECT)
    })?;

    let created = Instant::now();
    ctx.lock(&ns, "web", json!({"operations": ["CREATE", "UPDATE"]}))?;
    ctx.lock(&ns, "db-0", json!({"operations": ["CONNECT"]}))?;
    let config = wait_for_entries(ctx, "the CREATE and CONNECT entries", |names| {
        names.iter().any(|n| n == CREATE) && names.iter().any(|n| n == CONNECT)
    })?;
    ctx.figure(format!(
        "Locks asking CREATE and CONNECT created -> their entries in the registration: {:?}",
        created.elapsed()
    ));
    let entry = |name: &str| -> Result<&Value> {
        (config["webhooks"].as_array().into_iter().flatten())
            .find(|w| w["name"] == name)
            .with_context(|| format!("no entry {name}"))
    };
    for (name, key, not) in [
        (CREATE, format!("|{ns}/web|"), format!("{ns}/db-0")),
        (CONNECT, format!("|{ns}/db-0|"), format!("{ns}/web")),
    ] {
        let entry = entry(name)?;
        let condition = may_be_locked(entry);
        ensure!(
            condition.contains(&key) && !condition.contains(&not),
            "{name} names {key} only: {condition}"
        );
        let selected = &entry["namespaceSelector"]["matchExpressions"];
        ensure!(
            (selected.as_array().into_iter().flatten())
                .any(|e| e["operator"] == "In" && e["values"] == json!([ns])),
            "{name} selects {ns} only: {selected}"
        );
    }
    ensure!(
        entry(CREATE)?["rules"][0]["operations"] == json!(["CREATE"])
            && entry(CONNECT)?["rules"][0]["resources"]
                == json!(["pods/exec", "pods/attach", "pods/portforward", "pods/proxy"]),
        "rules: {} {}",
        entry(CREATE)?["rules"],
        entry(CONNECT)?["rules"]
    );
    // Who wrote what: the entries of the operations are the second manager's alone.
    let shown = ctx
        .k(&[
            "get",
            "validatingwebhookconfiguration",
            REGISTRATION,
            "-o",
            "json",
            "--show-managed-fields",
        ])
        .check()?;
    let shown: Value = serde_json::from_str(&shown.stdout).context("kubectl get -o json")?;
    for (name, expected) in [
        (CREATE, vec![OPERATIONS_MANAGER]),
        (CONNECT, vec![OPERATIONS_MANAGER]),
    ] {
        let owners = owners(&shown, name);
        ensure!(owners == expected, "{name} is managed by {owners:?}");
    }
    let base = owners(&shown, NAMESPACED);
    ensure!(
        base.contains(&MANAGER) && !base.contains(&OPERATIONS_MANAGER),
        "{NAMESPACED} is managed by {base:?}"
    );
    ctx.note(format!(
        "managers: {CREATE} and {CONNECT} by {OPERATIONS_MANAGER}; {NAMESPACED} by {base:?}"
    ));
    // The Lock is enforced once its CREATE entry is written too.
    wait_for("Lock web enforced", || {
        let lock = ctx.rest().get(&format!(
            "/apis/objectlock.dev/v1alpha1/namespaces/{ns}/locks/web"
        ))?;
        Ok(lock.body["status"]["enforcedCount"].as_i64().unwrap_or(0) >= 1)
    })?;

    // Which CREATEs are sent.
    let sent = |what: &str, namespace: &str, name: &str| -> Result<(u64, f64)> {
        let before = (webhook_calls_to(ctx, CREATE)?, reviews()?);
        // A dry run: the name stays free, and the webhook is called all the same.
        let reply = ctx.rest().post(
            &format!("/api/v1/namespaces/{namespace}/configmaps?dryRun=All"),
            &json!({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": name}}),
        )?;
        ctx.note(format!("{what}: {} {}", reply.code, reply.message()));
        let after = (webhook_calls_to(ctx, CREATE)?, reviews()?);
        Ok((after.0 - before.0, after.1 - before.1))
    };
    for (what, namespace, name) in [
        ("CREATE of another name", ns.as_str(), "other"),
        ("CREATE of the name in another namespace", &elsewhere, "web"),
    ] {
        let (calls, reviews) = sent(what, namespace, name)?;
        ensure!(
            calls == 0 && reviews == 0.0,
            "{what} was sent: {calls} calls to {CREATE}, {reviews} CREATE reviews"
        );
    }
    let (calls, reviews) = sent("CREATE of the locked name", &ns, "web")?;
    ensure!(
        calls >= 1 && reviews >= 1.0,
        "the CREATE of the locked name was not sent: {calls} calls, {reviews} reviews"
    );

    // The Locks deleted: the entries go, and the CREATE of the name is no longer sent.
    let deleted = Instant::now();
    ctx.unlock(&ns, "web")?;
    ctx.unlock(&ns, "db-0")?;
    let config = wait_for_entries(ctx, "the entries removed", |names| {
        !names.iter().any(|n| n == CREATE || n == CONNECT)
    })?;
    ctx.figure(format!(
        "Locks deleted -> their entries gone: {:?}",
        deleted.elapsed()
    ));
    ensure!(
        owners(&config, NAMESPACED).contains(&MANAGER),
        "the base entries stay"
    );
    let (calls, reviews) = sent("CREATE of the name, unlocked", &ns, "web")?;
    ensure!(
        calls == 0 && reviews == 0.0,
        "an unlocked CREATE was sent: {calls} calls, {reviews} reviews"
    );
    Ok(())
}

/// The webhook's CREATE reviews so far.
fn reviews() -> Result<f64> {
    Ok(scrape(METRICS_PORT)?.total(CREATE_REVIEWS))
}

fn may_be_locked(entry: &Value) -> String {
    (entry["matchConditions"].as_array().into_iter().flatten())
        .find(|c| c["name"] == "may-be-locked")
        .and_then(|c| c["expression"].as_str())
        .unwrap_or_default()
        .to_owned()
}

/// The field managers owning the entry `name` in `config`'s managedFields.
pub fn owners<'a>(config: &'a Value, name: &str) -> Vec<&'a str> {
    let item = format!("k:{{\"name\":\"{name}\"}}");
    (config["metadata"]["managedFields"]
        .as_array()
        .into_iter()
        .flatten())
    .filter(|m| m["fieldsV1"]["f:webhooks"].get(&item).is_some())
    .filter_map(|m| m["manager"].as_str())
    .collect()
}

/// Polls the registration until its entry names satisfy `done`; the registration then.
pub fn wait_for_entries(ctx: &Ctx, what: &str, done: impl Fn(&[String]) -> bool) -> Result<Value> {
    let path = format!(
        "/apis/admissionregistration.k8s.io/v1/validatingwebhookconfigurations/{REGISTRATION}"
    );
    let mut config = Value::Null;
    wait_for(what, || {
        config = ctx.rest().get(&path)?.body;
        let names: Vec<String> = (config["webhooks"].as_array().into_iter().flatten())
            .filter_map(|w| w["name"].as_str().map(str::to_owned))
            .collect();
        Ok(done(&names))
    })?;
    Ok(config)
}

fn wait_for(what: &str, mut done: impl FnMut() -> Result<bool>) -> Result<()> {
    let start = Instant::now();
    while !done()? {
        if start.elapsed() > ENFORCE_WITHIN {
            bail!("{what}: not within {ENFORCE_WITHIN:?}");
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    Ok(())
}
