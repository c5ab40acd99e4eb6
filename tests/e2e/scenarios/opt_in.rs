//! Namespaces that opt in: the operator's requirement `lockable=true`, as `manifests cluster
//! --namespace-selector lockable=true` writes it, added to the installed registration's base
//! entries (and taken out again whatever happens). A default Lock refuses the deletion and the
//! scale of its Deployment in a namespace labelled `lockable=true`; in one labelled
//! `lockable=false` a Lock changes nothing, its status says `NamespaceNotSelected` and `kubectl
//! lock` refuses to wait for one, until the namespace is relabelled: then the same Lock is
//! enforced. A Lock asking CREATE refuses the creation of a Deployment of its name in the first,
//! not in the second.

use std::time::Instant;

use anyhow::{Context, Result, bail, ensure};
use serde_json::{Map, Value, json};

use super::enforcement::wait_for;
use super::narrowing::registered;
use super::scale::deployment;
use crate::env::WebhookMode;
use crate::suite::{Ctx, NAMESPACED_DENIAL, locked, skip};
use crate::webhook::{REGISTRATION, cluster_manifests};

const VWC: &str = "/apis/admissionregistration.k8s.io/v1/validatingwebhookconfigurations";
/// The entries `manifests cluster` installs; the instances copy the others from them.
const BASE_ENTRIES: [&str; 2] = ["namespaced.objectlock.dev", "cluster.objectlock.dev"];
const SELECTOR: &str = "lockable=true";

pub fn run(ctx: &Ctx) -> Result<()> {
    if ctx.env.cfg.mode != WebhookMode::Own {
        return skip("KOL_E2E_WEBHOOK=external: the registration is not the suite's to change");
    }
    let requirement = requirement(ctx)?;
    let result = select(ctx, &requirement, true).and_then(|()| check(ctx));
    // Whatever happened: every namespace but the excluded ones again.
    let restored =
        select(ctx, &requirement, false).context("taking the requirement out of the registration");
    result.and(restored)
}

/// The `matchLabels` that `manifests cluster --namespace-selector lockable=true` gives both base
/// entries (beside the exclusions, which every registration has).
fn requirement(ctx: &Ctx) -> Result<Map<String, Value>> {
    let flags = ["--namespace-selector", SELECTOR];
    let yaml = cluster_manifests(&ctx.env.cfg.server_bin, &ctx.env.files, &flags)?;
    let documents: Vec<Value> = serde_saphyr::from_multiple(&yaml).context("manifests cluster")?;
    let registration = (documents.iter())
        .find(|d| d["kind"] == "ValidatingWebhookConfiguration")
        .context("manifests cluster printed no ValidatingWebhookConfiguration")?;
    let mut found = Vec::new();
    for name in BASE_ENTRIES {
        let entry = (registration["webhooks"].as_array().into_iter().flatten())
            .find(|w| w["name"] == name)
            .with_context(|| format!("manifests cluster printed no entry {name}"))?;
        found.push(entry["namespaceSelector"]["matchLabels"].clone());
    }
    ensure!(
        found.iter().all(|l| *l == json!({"lockable": "true"})),
        "--namespace-selector {SELECTOR} did not give both base entries matchLabels lockable=true: {found:?}"
    );
    Ok(found[0].as_object().cloned().unwrap_or_default())
}

/// Adds the `requirement` to the base entries' `namespaceSelector` (`add` false: takes it out),
/// as an operator edits them, and waits until every entry of ours says the same. An instance's
/// write already on its way when the edit lands may put back the selector it read before: the
/// edit is then made again.
fn select(ctx: &Ctx, requirement: &Map<String, Value>, add: bool) -> Result<()> {
    let carries = |entry: &Value| {
        let labels = &entry["namespaceSelector"]["matchLabels"];
        requirement.iter().all(|(key, value)| labels[key] == *value)
    };
    let is_base = |entry: &Value| BASE_ENTRIES.iter().any(|b| entry["name"] == *b);
    let entries = || -> Result<Vec<Value>> {
        let stored = ctx.rest().get(&format!("{VWC}/{REGISTRATION}"))?;
        ensure!(stored.ok(), "GET the registration: {}", stored.code);
        Ok(stored.body["webhooks"]
            .as_array()
            .cloned()
            .unwrap_or_default())
    };
    for _ in 0..3 {
        let mut patch = Vec::new();
        for (index, entry) in entries()?.iter().enumerate().filter(|(_, e)| is_base(e)) {
            let mut selector = entry["namespaceSelector"].clone();
            let mut labels = (selector["matchLabels"].as_object().cloned()).unwrap_or_default();
            match add {
                true => labels.extend(requirement.clone()),
                false => labels.retain(|key, _| !requirement.contains_key(key)),
            }
            selector["matchLabels"] = Value::Object(labels);
            if selector["matchLabels"] == json!({}) {
                selector.as_object_mut().map(|s| s.remove("matchLabels"));
            }
            patch.push(json!({"op": "test", "path": format!("/webhooks/{index}/name"), "value": entry["name"]}));
            patch.push(json!({"op": "replace", "path": format!("/webhooks/{index}/namespaceSelector"), "value": selector}));
        }
        let registration = ("validatingwebhookconfiguration", REGISTRATION);
        ctx.json_patch(registration.0, registration.1, &Value::Array(patch))?;
        // Some(false): a base entry lost the edit; Some(true): every entry of ours follows it.
        let settled = wait_for(|| {
            let entries = entries()?;
            let follows = |w: &&Value| carries(w) == add;
            let ours =
                |w: &&Value| (w["name"].as_str()).is_some_and(|n| n.ends_with(".objectlock.dev"));
            let bases = entries.iter().filter(|w| is_base(w)).all(|w| follows(&w));
            let all = entries.iter().filter(ours).all(|w| follows(&w));
            Ok(match (bases, all) {
                (false, _) => Some(false),
                (true, true) => Some(true),
                (true, false) => None,
            })
        })
        .context("the registration's entries never all followed the edit")?;
        if settled {
            return Ok(());
        }
    }
    bail!("an instance's writes kept replacing the edited selector of the base entries")
}

fn check(ctx: &Ctx) -> Result<()> {
    let (yes, no) = (ctx.namespace("yes")?, ctx.namespace("no")?);
    label(ctx, &yes, "true")?;
    label(ctx, &no, "false")?;
    for ns in [&yes, &no] {
        ctx.create(
            &format!("/apis/apps/v1/namespaces/{ns}/deployments"),
            deployment("web", json!({})),
        )?;
        ctx.lock(ns, "web", json!({}))?;
    }
    let refusal = |ns: &str| {
        let message = locked("deployments.apps", ns, "web", None);
        format!("{NAMESPACED_DENIAL}{message}")
    };

    // Selected: the Lock holds.
    ctx.delete_enforced(&format!("/apis/apps/v1/namespaces/{yes}/deployments/web"))?;
    ctx.k(&["delete", "deployment", "web", "-n", &yes])
        .refused(&refusal(&yes))?;
    ctx.k(&["scale", "deployment", "web", "-n", &yes, "--replicas=2"])
        .refused(&refusal(&yes))?;

    // A Lock asking CREATE reserves its name where it applies; without a Lock, creating and
    // scaling work.
    let reserving = json!({"operations": ["CREATE", "UPDATE", "DELETE"],
        "resources": [{"apiGroups": ["apps"], "resources": ["deployments"]}]});
    let dry_create = |ns: &str, name: &str| {
        ctx.rest().post(
            &format!("/apis/apps/v1/namespaces/{ns}/deployments?dryRun=All"),
            &deployment(name, json!({})),
        )
    };
    for ns in [&yes, &no] {
        ctx.lock(ns, "web-v2", reserving.clone())?;
    }
    ctx.enforced("dry-run create of a reserved name", || {
        dry_create(&yes, "web-v2")
    })?;
    let reserved = locked("deployments.apps", &yes, "web-v2", None);
    let image = "--image=registry.invalid/web:2";
    ctx.k(&["create", "deployment", "web-v2", "-n", &yes, image])
        .refused(&format!("cannot create: {reserved}"))?;
    ctx.k(&["create", "deployment", "free", "-n", &yes, image])
        .allowed()?;
    ctx.k(&["scale", "deployment", "free", "-n", &yes, "--replicas=2"])
        .allowed()?;
    // Its twin in the unselected namespace is named by the CREATE entry's condition, and left
    // out by its selector.
    let key = format!("|{no}/web-v2|");
    wait_for(|| {
        let stored = ctx.rest().get(&format!("{VWC}/{REGISTRATION}"))?.body;
        let create = (stored["webhooks"].as_array().into_iter().flatten())
            .find(|w| w["name"] == "create.objectlock.dev");
        Ok(create
            .is_some_and(|w| w.to_string().contains(&key))
            .then_some(()))
    })
    .context("the CREATE entry's condition never named the Lock")?;
    // The API server's view of webhook configurations follows its own watch.
    std::thread::sleep(std::time::Duration::from_millis(1500));
    dry_create(&no, "web-v2")?
        .allowed("dry-run create of a name reserved in an unselected namespace")?;

    // Not selected: the conditions name the Lock, the selector leaves its namespace out.
    let lock_path = format!("/apis/objectlock.dev/v1alpha1/namespaces/{no}/locks/web");
    let status = wait_for(|| {
        let lock = ctx.rest().get(&lock_path)?.body;
        let condition = &lock["status"]["conditions"][0];
        Ok((condition["reason"] == "NamespaceNotSelected").then(|| lock["status"].clone()))
    })
    .context("the Lock in the unselected namespace never said NamespaceNotSelected")?;
    let message = status["conditions"][0]["message"]
        .as_str()
        .unwrap_or_default();
    ensure!(
        message.contains(&format!("namespace {no} ")) && message.contains(SELECTOR),
        "the status does not name the namespace and the selector: {message}"
    );
    ensure!(
        status["enforcedBy"].as_array().is_none_or(Vec::is_empty),
        "an instance says it enforces a Lock whose namespace is not selected: {status}"
    );
    wait_for(|| Ok(registered(ctx, &format!("|{no}/web|"))?.then_some(())))
        .context("the registration's conditions never named the Lock")?;
    let deploy = format!("/apis/apps/v1/namespaces/{no}/deployments/web");
    ctx.k(&["scale", "deployment", "web", "-n", &no, "--replicas=2"])
        .allowed()?;
    ctx.rest()
        .probe_delete(&deploy)?
        .allowed("dry-run delete of the Deployment in the unselected namespace")?;

    // kubectl lock: created, and not waited for, with the reason.
    ctx.create(
        &format!("/apis/apps/v1/namespaces/{no}/deployments"),
        deployment("api", json!({})),
    )?;
    let start = Instant::now();
    let out = ctx.k(&["lock", "deploy/api", "-n", &no, "--timeout", "60s"]);
    let took = start.elapsed();
    ensure!(
        !out.ok()
            && out.stderr.contains("is not selected")
            && out.stderr.contains(&no)
            && out.stderr.contains(SELECTOR)
            && !out.stderr.contains(" after "),
        "kubectl lock in the unselected namespace did not refuse to wait with the reason: {} {}",
        out.stdout,
        out.stderr
    );
    ctx.note(format!(
        "kubectl lock in the unselected namespace stopped after {took:?}: {}",
        out.stderr.trim()
    ));

    // Relabelled: the same Lock is enforced, first in its status, then in a refused delete.
    label(ctx, &no, "true")?;
    wait_for(|| {
        let lock = ctx.rest().get(&lock_path)?.body;
        let enforced = lock["status"]["conditions"][0]["reason"] == "Enforcing"
            && lock["status"]["enforcedCount"].as_i64().unwrap_or(0) >= 1;
        Ok(enforced.then_some(()))
    })
    .context("the Lock never said Enforcing once its namespace was selected")?;
    ctx.k(&["delete", "deployment", "web", "-n", &no])
        .refused(&refusal(&no))?;
    Ok(())
}

fn label(ctx: &Ctx, ns: &str, lockable: &str) -> Result<()> {
    let label = format!("lockable={lockable}");
    ctx.k(&["label", "namespace", ns, &label, "--overwrite"])
        .check()
        .map(drop)
}
