//! The registration narrowed to the locked names: the API server accepts the CEL the webhook
//! writes, sends it writes to locked objects only (counted by the API server's own
//! `apiserver_admission_webhook_request_total`), goes broad when the ClusterLocks alone exceed
//! `registration.max_names` (a namespace's Locks beyond it widen only their namespace),
//! and with the webhook stopped refuses only writes to locked objects; another writer's change of
//! an entry is put back and counted (`registration_undone`). Figures: lock to
//! enforcement including the registration update, and the cost per write of unlocked objects
//! with 0 to just under 2,000 locked names (the default bound), one client and 16.

use std::time::{Duration, Instant};

use anyhow::{Context, Result, ensure};
use serde_json::{Value, json};

use crate::env::WebhookMode;
use crate::scenarios::latency::percentiles;
use crate::scenarios::metrics::scrape;
use crate::scenarios::operations;
use crate::suite::{Ctx, ENFORCE_WITHIN, RUN_LABEL, skip, skip_unless_required};
use crate::webhook::{METRICS_PORT, REGISTRATION, SPARE_PORTS, Serve, Spare};

const VWC: &str = "/apis/admissionregistration.k8s.io/v1/validatingwebhookconfigurations";
const NAMESPACED: &str = "namespaced.objectlock.dev";
/// The registration's format annotation (see `registration::FORMAT_ANNOTATION`).
const FORMAT: &str = "objectlock.dev/registration-format";
/// What ends every condition written in format 2.
const MARKER: &str = "// registration-format 2";

pub fn run(ctx: &Ctx) -> Result<()> {
    if ctx.env.cfg.mode != WebhookMode::Own {
        return skip("KOL_E2E_WEBHOOK=external: the webhook is not the suite's to restart");
    }
    let ns = ctx.namespace("")?;
    let rest = ctx.rest();
    let mut phases = Phases::new();
    ctx.configmap(&ns, "locked", json!({}))?;
    ctx.configmap(&ns, "free", json!({}))?;
    let locked = format!("/api/v1/namespaces/{ns}/configmaps/locked");
    let free = format!("/api/v1/namespaces/{ns}/configmaps/free");

    // The webhook writes the name; the API server stores and evaluates the CEL.
    ctx.lock(&ns, "locked", json!({}))?;
    ctx.update_enforced(&locked)?;
    ensure!(
        registered(ctx, &format!("|{ns}/locked|"))?,
        "the registration does not name {ns}/locked: {}",
        conditions(ctx)?
    );

    undone_is_put_back(ctx, &format!("|{ns}/locked|"))?;

    // Unlocked writes are decided in the API server; locked ones reach the webhook.
    let n = 40;
    let before = webhook_calls(ctx)?;
    for _ in 0..n {
        rest.probe_update(&free)?
            .allowed("update of an unlocked ConfigMap")?;
    }
    let unlocked_calls = webhook_calls(ctx)? - before;
    let before = webhook_calls(ctx)?;
    for _ in 0..n {
        let reply = rest.probe_update(&locked)?;
        ensure!(
            reply.code == 403,
            "a locked write was not refused: {}",
            reply.code
        );
    }
    let locked_calls = webhook_calls(ctx)? - before;
    ctx.note(format!(
        "{n} unlocked writes -> {unlocked_calls} webhook calls; {n} locked writes -> {locked_calls}"
    ));
    ensure!(
        unlocked_calls < n / 4 && locked_calls >= n,
        "unlocked writes reached the webhook ({unlocked_calls} calls for {n}) or locked ones did not ({locked_calls})"
    );
    // In a namespace holding no Lock, the namespaceSelector decides: no CEL is evaluated.
    let elsewhere = ctx.namespace("unlocked")?;
    ctx.configmap(&elsewhere, "free", json!({}))?;
    let before = condition_evaluations(ctx)?;
    for _ in 0..n {
        rest.probe_update(&format!("/api/v1/namespaces/{elsewhere}/configmaps/free"))?
            .allowed("update in a namespace without Locks")?;
    }
    let outside = condition_evaluations(ctx)? - before;
    let before = condition_evaluations(ctx)?;
    for _ in 0..n {
        rest.probe_update(&free)?
            .allowed("update of an unlocked ConfigMap")?;
    }
    let inside = condition_evaluations(ctx)? - before;
    ctx.note(format!(
        "matchCondition evaluations of the namespaced entry: {outside} for {n} writes in a namespace without Locks, {inside} for {n} in one holding a Lock"
    ));
    ensure!(
        outside < n / 4 && inside >= n,
        "the namespaceSelector does not keep the conditions from writes elsewhere ({outside} evaluations for {n} writes; {inside} where a Lock is)"
    );

    phases.mark("which writes are sent");
    // Lock to enforcement, the registration update included.
    let mut enforce = Vec::new();
    for i in 0..ctx.env.cfg.tries.min(20) {
        let name = format!("t{i}");
        ctx.configmap(&ns, &name, json!({}))?;
        ctx.lock(&ns, &name, json!({}))?;
        let e = ctx.update_enforced(&format!("/api/v1/namespaces/{ns}/configmaps/{name}"))?;
        enforce.push(e.after);
    }
    ctx.figure(format!(
        "narrowed: lock created -> first refused write: {}",
        percentiles(&mut enforce)
    ));

    phases.mark("lock to enforcement");
    // The status says enforced only once the registration names the lock: from then on, a
    // write is refused at once.
    let mut seen_not_yet = 0;
    let mut to_status = Vec::new();
    for i in 0..10 {
        let name = format!("s{i}");
        let path = format!("/api/v1/namespaces/{ns}/configmaps/{name}");
        ctx.configmap(&ns, &name, json!({}))?;
        let created = Instant::now();
        ctx.lock(&ns, &name, json!({}))?;
        let lock = format!("/apis/objectlock.dev/v1alpha1/namespaces/{ns}/locks/{name}");
        loop {
            let status = rest.get(&lock)?.body["status"].clone();
            if status["conditions"][0]["reason"] == "NotYetRegistered" {
                seen_not_yet += 1;
            }
            if status["enforcedCount"].as_i64().unwrap_or(0) >= 1 {
                break;
            }
            ensure!(
                created.elapsed() < Duration::from_secs(30),
                "Lock {name} never said it was enforced: {status}"
            );
            std::thread::sleep(Duration::from_millis(5));
        }
        to_status.push(created.elapsed());
        let reply = rest.probe_update(&path)?;
        ensure!(
            reply.code == 403,
            "Lock {name} said it was enforced, yet the next write got {} {}",
            reply.code,
            reply.message()
        );
    }
    ctx.figure(format!(
        "narrowed: lock created -> status enforced: {} (the next write refused every time; NotYetRegistered seen {seen_not_yet} times)",
        percentiles(&mut to_status)
    ));

    phases.mark("status");
    new_namespaces(ctx)?;
    phases.mark("new namespaces");
    cluster_selector(ctx)?;
    phases.mark("cluster selector");
    // The webhook stopped: only locked objects are refused.
    restart_serve(ctx, &[], |ctx| {
        rest.probe_update(&free)?
            .allowed("unlocked update with the webhook stopped")?;
        let reply = rest.probe_update(&locked)?;
        ensure!(
            !reply.ok() && reply.message().contains("failed calling webhook"),
            "a locked update with the webhook stopped: {} {}",
            reply.code,
            reply.message()
        );
        ctx.note(
            "webhook stopped: unlocked update allowed, locked update refused (failurePolicy Fail)",
        );
        Ok(())
    })?;

    phases.mark("webhook stopped");
    // Beyond registration.max_names with ClusterLocks alone: broad, every write reaches the
    // webhook (a namespace's Locks beyond it would widen only their namespace).
    let cluster_locks: Vec<String> = (0..3)
        .map(|i| ctx.cluster_name(&format!("broad-{i}")))
        .collect();
    for name in &cluster_locks {
        ctx.cluster_lock(name, json!({}))?;
    }
    let broad = restart_serve(
        ctx,
        &[("KUBE_OBJECT_LOCK__REGISTRATION__MAX_NAMES", "2")],
        |ctx| {
            let start = Instant::now();
            // The base entries; those of CREATE and CONNECT have bounds of their own.
            while conditions(ctx)?
                .lines()
                .filter(|l| is_base_entry(l))
                .any(|l| {
                    !l.split(" //")
                        .next()
                        .unwrap_or(l)
                        .ends_with("may-be-locked: true")
                })
            {
                ensure!(
                    start.elapsed() < Duration::from_secs(30),
                    "the registration did not go broad"
                );
                std::thread::sleep(Duration::from_millis(50));
            }
            let before = webhook_calls(ctx)?;
            for _ in 0..10 {
                rest.probe_update(&free)?
                    .allowed("unlocked update, broad")?;
            }
            let calls = webhook_calls(ctx)? - before;
            ensure!(
                calls >= 10,
                "broad, yet unlocked writes did not reach the webhook ({calls})"
            );
            ctx.note("beyond registration.max_names: broad, unlocked writes reach the webhook");
            ctx.figure(format!(
                "unlocked dry-run updates through the broad registration (every write reaches the webhook): {}",
                measure(ctx, &free)?
            ));
            let lock = format!("/apis/objectlock.dev/v1alpha1/namespaces/{ns}/locks/s0");
            let start = Instant::now();
            loop {
                let condition = rest.get(&lock)?.body["status"]["conditions"][0].clone();
                let message = condition["message"].as_str().unwrap_or_default();
                if condition["reason"] == "Enforcing"
                    && message.contains("broad")
                    && message.contains("registration.max_names")
                {
                    break;
                }
                ensure!(
                    start.elapsed() < Duration::from_secs(30),
                    "the Lock status never said the registration is broad: {condition}"
                );
                std::thread::sleep(Duration::from_millis(50));
            }
            // The same measure as narrowed, for comparison: only the webhook's watch counts.
            let mut enforce = Vec::new();
            for i in 0..ctx.env.cfg.tries.min(20) {
                let name = format!("b{i}");
                ctx.configmap(&ns, &name, json!({}))?;
                ctx.lock(&ns, &name, json!({}))?;
                let path = format!("/api/v1/namespaces/{ns}/configmaps/{name}");
                enforce.push(ctx.update_enforced(&path)?.after);
            }
            ctx.figure(format!(
                "broad (same run): lock created -> first refused write: {}",
                percentiles(&mut enforce)
            ));
            Ok(())
        },
    );
    for name in &cluster_locks {
        rest.delete(&format!(
            "/apis/objectlock.dev/v1alpha1/clusterlocks/{name}"
        ))?;
    }
    broad?;
    phases.mark("broad");
    // Narrowed again once the bound is back.
    let start = Instant::now();
    while !registered(ctx, &format!("|{ns}/locked|"))? {
        ensure!(
            start.elapsed() < Duration::from_secs(30),
            "not narrowed again"
        );
        std::thread::sleep(Duration::from_millis(50));
    }

    phases.mark("narrowed again");
    // An expiring Lock leaves the registration at its expiresAt, without any event.
    use k8s_openapi::jiff::{SignedDuration, Timestamp};
    let at = Timestamp::now() + SignedDuration::from_secs(5);
    let at_text = at.strftime("%Y-%m-%dT%H:%M:%SZ").to_string();
    ctx.lock(&ns, "soon", json!({"expiresAt": at_text}))?;
    let key = format!("|{ns}/soon|");
    let start = Instant::now();
    while !registered(ctx, &key)? {
        ensure!(
            start.elapsed() < Duration::from_secs(30),
            "soon never registered"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
    while registered(ctx, &key)? {
        ensure!(
            start.elapsed() < Duration::from_secs(40),
            "an expired Lock stayed registered"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
    let expiry: Timestamp = at_text.parse()?;
    ctx.note(format!(
        "an expiring Lock left the registration {} ms after its expiresAt",
        Timestamp::now().duration_since(expiry).as_millis()
    ));

    phases.mark("expiry");
    cost_per_write(ctx, &free)?;
    phases.mark("cost per write");
    ctx.note(format!("phases: {}", phases.done.join(", ")));
    Ok(())
}

/// How long each step took (the scenario is the suite's longest).
struct Phases {
    last: Instant,
    done: Vec<String>,
}

impl Phases {
    fn new() -> Phases {
        Phases {
            last: Instant::now(),
            done: Vec::new(),
        }
    }

    fn mark(&mut self, step: &str) {
        self.done
            .push(format!("{step} {:.1}s", self.last.elapsed().as_secs_f64()));
        self.last = Instant::now();
    }
}

/// Stops the suite's webhook, runs `with_stopped` (without a webhook when `env` is empty,
/// else with one started with `env`), and starts the suite's webhook again.
fn restart_serve(
    ctx: &Ctx,
    env: &[(&str, &str)],
    with: impl FnOnce(&Ctx) -> Result<()>,
) -> Result<()> {
    let e = ctx.env;
    if let Some(serve) = e.serve.lock().ok().and_then(|mut s| s.take()) {
        serve.stop()?;
    }
    let other = if env.is_empty() {
        None
    } else {
        Some(Serve::start_with(&e.cfg.server_bin, &e.files, false, env)?)
    };
    let result = with(ctx);
    if let Some(other) = other {
        other.stop()?;
    }
    let serve = Serve::start(&e.cfg.server_bin, &e.files, false)?;
    if let Ok(mut s) = e.serve.lock() {
        *s = Some(serve);
    }
    result
}

/// The `may-be-locked` conditions of the registration, one per line.
pub fn conditions(ctx: &Ctx) -> Result<String> {
    let reply = ctx.rest().get(&format!("{VWC}/{REGISTRATION}"))?;
    ensure!(reply.ok(), "GET the registration: {}", reply.code);
    let mut out = String::new();
    for webhook in reply.body["webhooks"].as_array().into_iter().flatten() {
        for c in webhook["matchConditions"].as_array().into_iter().flatten() {
            if c["name"] == "may-be-locked" {
                out.push_str(&format!(
                    "{} may-be-locked: {}\n",
                    webhook["name"].as_str().unwrap_or_default(),
                    c["expression"].as_str().unwrap_or_default()
                ));
            }
        }
    }
    Ok(out)
}

/// Whether an entry (or a line of [`conditions`]) is one of the base entries, which every
/// version writes, not one of those sending CREATE or CONNECT (`create.objectlock.dev`,
/// `cluster-create.objectlock.dev`, `connect.objectlock.dev`), which only this one does.
pub fn is_base_entry(name: &str) -> bool {
    !["create", "cluster-create", "connect"]
        .iter()
        .any(|op| name.starts_with(&format!("{op}.")) || name.starts_with(&format!("{op}-")))
}

/// Whether a `may-be-locked` condition of the registration names `key` (`|ns/name|`).
pub(super) fn registered(ctx: &Ctx, key: &str) -> Result<bool> {
    Ok(conditions(ctx)?.contains(key))
}

/// Another writer changes what the instance wrote (the namespaced entry's condition, made
/// broad): the instance writes it back, naming `key` again, and counts the write as undone.
fn undone_is_put_back(ctx: &Ctx, key: &str) -> Result<()> {
    const UNDONE: &str = "kube_object_lock_registration_undone_total";
    let before = scrape(METRICS_PORT)?.get(UNDONE);
    let stored = ctx.rest().get(&format!("{VWC}/{REGISTRATION}"))?;
    ensure!(stored.ok(), "GET the registration: {}", stored.code);
    let webhooks = stored.body["webhooks"].as_array().context("no webhooks")?;
    let entry = (webhooks.iter())
        .position(|w| w["name"] == NAMESPACED)
        .context("no namespaced entry")?;
    let condition = (webhooks[entry]["matchConditions"]
        .as_array()
        .into_iter()
        .flatten())
    .position(|c| c["name"] == "may-be-locked")
    .context("no may-be-locked condition")?;
    ctx.json_patch(
        "validatingwebhookconfiguration",
        REGISTRATION,
        &json!([{"op": "replace", "value": "true",
            "path": format!("/webhooks/{entry}/matchConditions/{condition}/expression")}]),
    )?;
    let start = Instant::now();
    while !(registered(ctx, key)? && scrape(METRICS_PORT)?.get(UNDONE) > before) {
        ensure!(
            start.elapsed() < Duration::from_secs(10),
            "another writer's change was not put back and counted within 10 s ({UNDONE} {before} -> {}): {}",
            scrape(METRICS_PORT)?.get(UNDONE),
            conditions(ctx)?
        );
        std::thread::sleep(Duration::from_millis(100));
    }
    Ok(())
}

/// Calls the API server made to the namespaced webhook so far (its own metric).
fn webhook_calls(ctx: &Ctx) -> Result<u64> {
    webhook_calls_to(ctx, NAMESPACED)
}

/// Calls the API server made to the webhook entry `entry` so far (its own metric).
pub fn webhook_calls_to(ctx: &Ctx, entry: &str) -> Result<u64> {
    let text = apiserver_metrics(ctx)?;
    sum(&text, "apiserver_admission_webhook_request_total", entry)
        .or_else(|| {
            sum(
                &text,
                "apiserver_admission_webhook_admission_duration_seconds_count",
                entry,
            )
        })
        .or(Some(0))
        .context("no webhook metric")
}

/// Evaluations of the namespaced webhook's matchConditions so far (the API server's metric).
fn condition_evaluations(ctx: &Ctx) -> Result<u64> {
    let text = apiserver_metrics(ctx)?;
    Ok(sum(
        &text,
        "apiserver_admission_match_condition_evaluation_seconds_count",
        NAMESPACED,
    )
    .unwrap_or(0))
}

/// The API server's `/metrics`, as text.
pub fn apiserver_metrics(ctx: &Ctx) -> Result<String> {
    let reply = ctx.rest().get("/metrics")?;
    let Value::String(text) = reply.body else {
        anyhow::bail!("/metrics: {} {}", reply.code, reply.body);
    };
    Ok(text)
}

/// The sum of `metric`'s series for the webhook entry `entry`; `None` when it has none.
fn sum(text: &str, metric: &str, entry: &str) -> Option<u64> {
    let label = format!("name=\"{entry}\"");
    let lines: Vec<_> = text
        .lines()
        .filter(|l| l.starts_with(&format!("{metric}{{")) && l.contains(&label))
        .collect();
    (!lines.is_empty()).then(|| {
        lines
            .iter()
            .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
            .sum::<f64>() as u64
    })
}

/// The default `registration.max_names`; the last step fills up to just under it.
const MAX_NAMES: usize = 2000;
/// Writers of the concurrent measure (as in the load that motivated narrowing).
const CONCURRENT: usize = 16;

/// Unlocked writes per second with 0 names up to just under the default bound (Locks in a
/// namespace of their own; the objects need not exist), one client and 16 at once. The bulk
/// Locks are deleted again whatever happens, so later scenarios do not inherit them.
fn cost_per_write(ctx: &Ctx, free: &str) -> Result<()> {
    let bulk = ctx.namespace("bulk")?;
    let measured = measure_by_names(ctx, free, &bulk);
    let deleted = ctx
        .rest()
        .delete(&format!(
            "/apis/objectlock.dev/v1alpha1/namespaces/{bulk}/locks"
        ))
        .and_then(|r| r.allowed("delete the bulk locks"));
    let mut figures = measured?;
    deleted?;
    let start = Instant::now();
    while registered(ctx, &format!("|{bulk}/"))? {
        ensure!(
            start.elapsed() < Duration::from_secs(60),
            "bulk names never left"
        );
        std::thread::sleep(Duration::from_millis(100));
    }
    figures.push(format!("0 names again: {}", measure(ctx, free)?));
    ctx.figure(format!(
        "unlocked dry-run updates through the narrowed registration: {}",
        figures.join("; ")
    ));
    Ok(())
}

fn measure_by_names(ctx: &Ctx, free: &str, bulk: &str) -> Result<Vec<String>> {
    // Every live lock counts against the bound, not only this scenario's.
    let existing = ["locks", "clusterlocks"]
        .iter()
        .map(|kind| {
            let reply = ctx
                .rest()
                .get(&format!("/apis/objectlock.dev/v1alpha1/{kind}"))?;
            Ok(reply.body["items"].as_array().map_or(0, Vec::len))
        })
        .sum::<Result<usize>>()?;
    let near_bound = MAX_NAMES.saturating_sub(existing + 20);
    let mut have = 0usize;
    let mut figures = Vec::new();
    for target in [0usize, 10, 100, 1000, near_bound] {
        // Created by 8 writers at once: the registration follows in fewer, larger writes.
        let names: Vec<String> = (have..target).map(|i| format!("name-{i:05}")).collect();
        let t = Instant::now();
        let locks: Vec<(String, String)> =
            names.iter().map(|n| (bulk.to_owned(), n.clone())).collect();
        create_locks(ctx, &locks)?;
        have = have.max(target);
        if !names.is_empty() {
            let took = t.elapsed();
            let created = Instant::now();
            let last = format!("name-{:05}", target - 1);
            while !registered(ctx, &format!("|{bulk}/{last}|"))? {
                ensure!(
                    created.elapsed() < Duration::from_secs(60),
                    "{target} names never registered"
                );
                std::thread::sleep(Duration::from_millis(50));
            }
            let registered_after = created.elapsed();
            // The status of the new Locks is written in the background (in name order); it
            // would compete with the measure for the API server.
            let path = format!("/apis/objectlock.dev/v1alpha1/namespaces/{bulk}/locks/{last}");
            while ctx.rest().get(&path)?.body["status"]["enforcedCount"]
                .as_i64()
                .unwrap_or(0)
                < 1
            {
                ensure!(
                    created.elapsed() < Duration::from_secs(90),
                    "the status of {target} Locks was never written"
                );
                std::thread::sleep(Duration::from_millis(50));
            }
            ctx.note(format!(
                "{} Locks created by 8 clients in {:.1}s: the last one registered {:.1}s and its status written {:.1}s after",
                names.len(),
                took.as_secs_f64(),
                registered_after.as_secs_f64(),
                created.elapsed().as_secs_f64()
            ));
        }
        figures.push(format!("{target} names: {}", measure(ctx, free)?));
    }
    Ok(figures)
}

/// Creates the Locks `(namespace, name)` (on no particular object) from 8 clients at once.
pub fn create_locks(ctx: &Ctx, locks: &[(String, String)]) -> Result<()> {
    let rest = ctx.rest();
    std::thread::scope(|scope| {
        let writers: Vec<_> = locks
            .chunks(locks.len().div_ceil(8).max(1))
            .map(|chunk| {
                scope.spawn(move || -> Result<()> {
                    for (ns, name) in chunk {
                        let lock = json!({"apiVersion": "objectlock.dev/v1alpha1",
                            "kind": "Lock", "metadata": {"name": name}, "spec": {}});
                        rest.post(
                            &format!("/apis/objectlock.dev/v1alpha1/namespaces/{ns}/locks"),
                            &lock,
                        )?
                        .allowed("create a bulk Lock")?;
                    }
                    Ok(())
                })
            })
            .collect();
        for writer in writers {
            writer
                .join()
                .map_err(|_| anyhow::anyhow!("a writer panicked"))??;
        }
        Ok(())
    })
}

/// 100 sequential unlocked dry-run updates, then 320 from 16 writers at once: rates and
/// percentiles.
fn measure(ctx: &Ctx, free: &str) -> Result<String> {
    let writes = 100;
    let mut took = Vec::with_capacity(writes);
    let start = Instant::now();
    for _ in 0..writes {
        let t = Instant::now();
        ctx.rest().probe_update(free)?.allowed("unlocked update")?;
        took.push(t.elapsed());
    }
    let rate = writes as f64 / start.elapsed().as_secs_f64();
    let sequential = format!("one client {rate:.0} writes/s, {}", percentiles(&mut took));

    let each = 20;
    let rest = ctx.rest();
    let start = Instant::now();
    let mut took = std::thread::scope(|scope| {
        let writers: Vec<_> = (0..CONCURRENT)
            .map(|_| {
                scope.spawn(|| -> Result<Vec<Duration>> {
                    let mut took = Vec::with_capacity(each);
                    for _ in 0..each {
                        let t = Instant::now();
                        rest.probe_update(free)?.allowed("unlocked update")?;
                        took.push(t.elapsed());
                    }
                    Ok(took)
                })
            })
            .collect();
        let mut all = Vec::with_capacity(CONCURRENT * each);
        for writer in writers {
            all.extend(
                writer
                    .join()
                    .map_err(|_| anyhow::anyhow!("a writer panicked"))??,
            );
        }
        Ok::<_, anyhow::Error>(all)
    })?;
    let rate = took.len() as f64 / start.elapsed().as_secs_f64();
    Ok(format!(
        "{sequential}; {CONCURRENT} clients {rate:.0} writes/s, {}",
        percentiles(&mut took)
    ))
}

/// A Lock in a namespace that held none: the namespaced entries' `namespaceSelector` leaves the
/// namespace out until then, and the Lock is enforced once both the selector and the condition
/// name it. The status says enforced only then: the next write is refused every time.
/// A ClusterLock with a selector may select any cluster-scoped object: the registration goes
/// broad while it lives, so a labelled ClusterRole of another name is refused, then narrow again.
fn cluster_selector(ctx: &Ctx) -> Result<()> {
    let role = ctx.cluster_name("tiered");
    ctx.create(
        "/apis/rbac.authorization.k8s.io/v1/clusterroles",
        json!({"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRole",
               "metadata": {"name": role, "labels": {RUN_LABEL: ctx.env.run, "tier": role}},
               "rules": []}),
    )?;
    let lock = ctx.cluster_name("tiers");
    ctx.cluster_lock(&lock, json!({"selector": {"matchLabels": {"tier": role}}}))?;
    let path = format!("/apis/rbac.authorization.k8s.io/v1/clusterroles/{role}");
    ctx.update_enforced(&path)?;
    ensure!(
        conditions(ctx)?.contains("may-be-locked: true"),
        "a ClusterLock with a selector lives, yet the registration is not broad"
    );
    let reply = ctx.rest().delete(&format!(
        "/apis/objectlock.dev/v1alpha1/clusterlocks/{lock}"
    ))?;
    reply.allowed("delete the selector ClusterLock")?;
    ctx.released(
        "the selected ClusterRole after the unlock",
        ENFORCE_WITHIN,
        || ctx.rest().probe_update(&path),
    )?;
    ctx.k(&["delete", "clusterrole", &role]).check()?;
    Ok(())
}

fn new_namespaces(ctx: &Ctx) -> Result<()> {
    let rest = ctx.rest();
    ensure!(
        format_of(ctx)?.as_deref() == Some("2"),
        "the suite's registration (manifests cluster) is not in format 2"
    );
    let mut enforce = Vec::new();
    let mut to_status = Vec::new();
    for i in 0..ctx.env.cfg.tries.min(10) {
        let ns = ctx.namespace(&format!("new{i}"))?;
        ctx.configmap(&ns, "held", json!({}))?;
        ensure!(
            !selected(ctx)?.contains(&ns),
            "{ns} holds no Lock, yet the namespaceSelector names it"
        );
        let path = format!("/api/v1/namespaces/{ns}/configmaps/held");
        let lock = format!("/apis/objectlock.dev/v1alpha1/namespaces/{ns}/locks/held");
        let created = Instant::now();
        ctx.lock(&ns, "held", json!({}))?;
        if i.is_multiple_of(2) {
            enforce.push(ctx.update_enforced(&path)?.after);
        } else {
            while rest.get(&lock)?.body["status"]["enforcedCount"]
                .as_i64()
                .unwrap_or(0)
                < 1
            {
                ensure!(
                    created.elapsed() < Duration::from_secs(30),
                    "Lock {ns}/held never said it was enforced"
                );
                std::thread::sleep(Duration::from_millis(5));
            }
            to_status.push(created.elapsed());
            let reply = rest.probe_update(&path)?;
            ensure!(
                reply.code == 403,
                "Lock {ns}/held said it was enforced, yet the next write got {} {}",
                reply.code,
                reply.message()
            );
        }
        ensure!(
            selected(ctx)?.contains(&ns),
            "{ns} holds a Lock that is enforced, yet the namespaceSelector does not name it"
        );
    }
    ctx.figure(format!(
        "narrowed, a Lock in a namespace that held none: lock created -> first refused write: {}; -> status enforced (the next write refused every time): {}",
        percentiles(&mut enforce),
        percentiles(&mut to_status)
    ));
    Ok(())
}

/// The registration's format annotation.
fn format_of(ctx: &Ctx) -> Result<Option<String>> {
    let reply = ctx.rest().get(&format!("{VWC}/{REGISTRATION}"))?;
    ensure!(reply.ok(), "GET the registration: {}", reply.code);
    Ok(reply.body["metadata"]["annotations"][FORMAT]
        .as_str()
        .map(str::to_owned))
}

/// Sets (or removes) the format annotation, as an operator would with `kubectl annotate`.
fn set_format(ctx: &Ctx, value: Option<&str>) -> Result<()> {
    ctx.rest()
        .merge_patch(
            &format!("{VWC}/{REGISTRATION}"),
            &json!({"metadata": {"annotations": {FORMAT: value}}}),
        )?
        .allowed("annotate the registration")
}

/// The namespaces the namespaced entries select (`In`), or `["*"]` for an entry that selects
/// every namespace but the excluded ones (the broad selector, conditions-only format), and
/// whether every condition carries the format 2 marker.
fn selection(ctx: &Ctx) -> Result<(Vec<String>, bool)> {
    let reply = ctx.rest().get(&format!("{VWC}/{REGISTRATION}"))?;
    ensure!(reply.ok(), "GET the registration: {}", reply.code);
    let mut names = Vec::new();
    let mut marked = true;
    for webhook in reply.body["webhooks"].as_array().into_iter().flatten() {
        let name = webhook["name"].as_str().unwrap_or_default();
        if !is_base_entry(name) {
            continue;
        }
        for c in webhook["matchConditions"].as_array().into_iter().flatten() {
            if c["name"] == "may-be-locked" {
                marked &= c["expression"]
                    .as_str()
                    .unwrap_or_default()
                    .contains(MARKER);
            }
        }
        if !name.starts_with("namespaced") {
            continue;
        }
        let expressions = webhook["namespaceSelector"]["matchExpressions"]
            .as_array()
            .cloned()
            .unwrap_or_default();
        let narrowing: Vec<_> = expressions
            .iter()
            .filter(|e| e["operator"] != "NotIn")
            .collect();
        match narrowing.first() {
            None => names.push("*".to_owned()),
            Some(e) if e["operator"] == "Exists" => names.push("*".to_owned()),
            Some(e) => names.extend(
                e["values"]
                    .as_array()
                    .into_iter()
                    .flatten()
                    .filter_map(|v| v.as_str().map(str::to_owned)),
            ),
        }
    }
    Ok((names, marked))
}

fn selected(ctx: &Ctx) -> Result<Vec<String>> {
    Ok(selection(ctx)?.0)
}

/// The registration's `metadata.generation`: it grows with every write that changes the
/// entries, whoever makes it (a write of what is stored already leaves it).
fn generation(ctx: &Ctx) -> Result<i64> {
    let reply = ctx.rest().get(&format!("{VWC}/{REGISTRATION}"))?;
    ensure!(reply.ok(), "GET the registration: {}", reply.code);
    reply.body["metadata"]["generation"]
        .as_i64()
        .context("the registration has no generation")
}

/// The registration writes an instance has made, from its metrics.
fn registration_writes(metrics_port: u16) -> Result<f64> {
    Ok(
        scrape(metrics_port)?
            .get("kube_object_lock_registration_writes_total{outcome=\"written\"}"),
    )
}

/// A rolling upgrade: the previous release's `serve` (`KOL_E2E_PREVIOUS_BIN`, built by
/// `.ci/previous-release`) and this one keep the same registration, and compute the same
/// entries from the same Locks, so neither undoes the other. Two phases:
/// 1. the registration without the format annotation: both write the conditions only, the same
///    text; a minute of Lock churn (new namespaces among them), every Lock refusing writes once
///    enforced, and few registration writes; the entry of a Lock asking CREATE kept throughout;
/// 2. format 2 asked for while the previous release still writes: both narrow the selector too,
///    and the previous release never falls back to the conditions only (every condition this
///    version writes carries the marker it looks for).
pub fn upgrade(ctx: &Ctx) -> Result<()> {
    if ctx.env.cfg.mode != WebhookMode::Own {
        return skip("KOL_E2E_WEBHOOK=external: the registration is not the suite's to change");
    }
    let Some(previous) = std::env::var_os("KOL_E2E_PREVIOUS_BIN") else {
        return skip_unless_required(
            "KOL_E2E_PREVIOUS_BIN is unset: no binary of the previous release (.ci/previous-release builds one)",
        );
    };
    let previous = std::path::PathBuf::from(previous);
    ensure!(
        previous.is_file(),
        "KOL_E2E_PREVIOUS_BIN={}: no such file",
        previous.display()
    );
    let (port, metrics_port) = SPARE_PORTS;
    for p in [port, metrics_port] {
        if std::net::TcpStream::connect(("127.0.0.1", p)).is_ok() {
            return skip(format!("127.0.0.1:{p} is in use by another process"));
        }
    }
    let result = upgrade_phases(ctx, &previous, (port, metrics_port));
    // Whatever happened, the suite's registration goes back to format 2.
    let restored = set_format(ctx, Some("2"));
    result.and(restored)
}

fn upgrade_phases(ctx: &Ctx, previous: &std::path::Path, ports: (u16, u16)) -> Result<()> {
    // 1. Installed by the previous release.
    set_format(ctx, None)?;
    wait_for(ctx, "the conditions-only format", |(names, marked)| {
        !marked && names.iter().all(|n| n == "*")
    })?;
    let files = &ctx.env.files;
    let instance = format!("kol-e2e-{}-previous", ctx.env.run);
    let spare = Spare::start(
        previous,
        files,
        &files.kubeconfig(),
        &files.dir.join("previous-release.log"),
        ports,
        &[("KUBE_OBJECT_LOCK__INSTANCE__NAME", instance.clone())],
    )?;
    let writes = || -> Result<(f64, f64, i64)> {
        Ok((
            registration_writes(ports.1)?,
            registration_writes(METRICS_PORT)?,
            generation(ctx)?,
        ))
    };
    // A Lock asking CREATE throughout: the previous release's applies (the base entries only,
    // under the field manager of this version's) leave its entry alone.
    let held = ctx.namespace("create")?;
    ctx.lock(&held, "web", json!({"operations": ["CREATE"]}))?;
    let held_entry = |names: &[String]| names.iter().any(|n| n == operations::CREATE);
    operations::wait_for_entries(ctx, "the CREATE entry", held_entry)?;
    let before = writes()?;
    let (changes, counted) = churn(ctx, "a", Duration::from_secs(60), 2)?;
    let after = writes()?;
    let config = operations::wait_for_entries(ctx, "the CREATE entry kept", held_entry)?;
    let owners = operations::owners(&config, operations::CREATE);
    ensure!(
        owners == [operations::OPERATIONS_MANAGER],
        "after the churn beside the previous release, the CREATE entry is managed by {owners:?}"
    );
    ctx.unlock(&held, "web")?;
    let changed = after.2 - before.2;
    ctx.figure(format!(
        "previous release and this one side by side, conditions only: {changes} Lock changes in 60 s ({counted}) -> registration writes: {:.0} by the previous, {:.0} by this one, {changed} of them changed it; every Lock refused writes once created, and once enforced by both; the entry of a Lock asking CREATE kept throughout",
        after.0 - before.0,
        after.1 - before.1
    ));
    // About one change of the registration per Lock change; versions undoing each other's
    // writes would make two. (Two instances of one version race too: a write computed before
    // the other's landed is still sent; phase 3 shows how often.)
    ensure!(
        changed * 2 < changes as i64 * 3,
        "{changed} changes of the registration for {changes} Lock changes: the versions undo each other's writes"
    );
    let (_, marked) = selection(ctx)?;
    ensure!(
        !marked && selected(ctx)?.iter().all(|n| n == "*"),
        "side by side without the format annotation, the registration left the conditions-only format"
    );

    // A ClusterLock with a selector: both register it the same way.
    let lock = ctx.cluster_name("undoing");
    let before = writes()?;
    ctx.cluster_lock(
        &lock,
        json!({"selector": {"matchLabels": {RUN_LABEL: "none"}}}),
    )?;
    std::thread::sleep(Duration::from_secs(5));
    let during = writes()?;
    let path = format!("/apis/objectlock.dev/v1alpha1/clusterlocks/{lock}");
    let reply = ctx.rest().delete(&path)?;
    reply.allowed("delete the selector ClusterLock")?;
    let (theirs, ours) = (during.0 - before.0, during.1 - before.1);
    ctx.figure(format!(
        "a ClusterLock with a selector beside the previous release: in 5 s, registration writes: {theirs:.0} by the previous, {ours:.0} by this one, {} of them changed it",
        during.2 - before.2
    ));
    ensure!(
        theirs + ours <= 6.0,
        "{theirs} + {ours} registration writes in 5 s for one ClusterLock: the versions undo each other's writes"
    );

    // 2. Format 2 asked for while the previous release still writes.
    set_format(ctx, Some("2"))?;
    wait_for(
        ctx,
        "format 2 beside the previous release",
        |(names, marked)| *marked && !names.iter().any(|n| n == "*"),
    )?;
    let before = writes()?;
    let (changes, _) = churn(ctx, "b", Duration::from_secs(15), 2)?;
    let after = writes()?;
    let (names, marked) = selection(ctx)?;
    ensure!(
        format_of(ctx)?.as_deref() == Some("2") && marked && !names.iter().any(|n| n == "*"),
        "format 2 beside the previous release: fell back (format {:?}, selected {names:?}, marked {marked})",
        format_of(ctx)?
    );
    let changed = after.2 - before.2;
    ctx.figure(format!(
        "format 2 beside the previous release: narrowed by both; {changes} Lock changes in 15 s -> registration writes: {:.0} by the previous, {:.0} by this one, {changed} of them changed it",
        after.0 - before.0,
        after.1 - before.1
    ));
    ensure!(
        changed * 2 < changes as i64 * 3,
        "format 2: {changed} changes of the registration for {changes} Lock changes: the versions undo each other's writes"
    );
    spare.stop()
}

/// Waits up to 30 s until the registration's selection satisfies `done`.
fn wait_for(ctx: &Ctx, what: &str, done: impl Fn(&(Vec<String>, bool)) -> bool) -> Result<()> {
    let start = Instant::now();
    loop {
        let seen = selection(ctx)?;
        if done(&seen) {
            return Ok(());
        }
        ensure!(
            start.elapsed() < Duration::from_secs(30),
            "the registration never reached {what}: {seen:?}"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// Lock churn for `period`: a Lock created on a ConfigMap (every 5th in a namespace of its own,
/// which held none), its object's write refused; once `instances` instances say they enforce it,
/// the next write refused too; the Lock three creations older deleted. Returns the Lock changes
/// (creations and deletions) and what was seen.
fn churn(ctx: &Ctx, tag: &str, period: Duration, instances: i64) -> Result<(usize, String)> {
    let rest = ctx.rest();
    let shared = ctx.namespace(&format!("churn-{tag}"))?;
    let start = Instant::now();
    let mut live: std::collections::VecDeque<(String, String)> = Default::default();
    let (mut changes, mut new_namespaces) = (0usize, 0usize);
    let mut i = 0usize;
    while start.elapsed() < period {
        let ns = if i.is_multiple_of(5) {
            new_namespaces += 1;
            ctx.namespace(&format!("churn-{tag}{i}"))?
        } else {
            shared.clone()
        };
        let name = format!("c{i}");
        ctx.configmap(&ns, &name, json!({}))?;
        ctx.lock(&ns, &name, json!({}))?;
        changes += 1;
        let path = format!("/api/v1/namespaces/{ns}/configmaps/{name}");
        ctx.update_enforced(&path)?;
        let lock = format!("/apis/objectlock.dev/v1alpha1/namespaces/{ns}/locks/{name}");
        let confirmed = Instant::now();
        while rest.get(&lock)?.body["status"]["enforcedCount"]
            .as_i64()
            .unwrap_or(0)
            < instances
        {
            ensure!(
                confirmed.elapsed() < Duration::from_secs(30),
                "Lock {ns}/{name} never said it was enforced by {instances} instances"
            );
            std::thread::sleep(Duration::from_millis(10));
        }
        let reply = rest.probe_update(&path)?;
        ensure!(
            reply.code == 403,
            "Lock {ns}/{name} enforced by {instances}, yet a write got {} {}",
            reply.code,
            reply.message()
        );
        live.push_back((ns, name));
        if live.len() > 3
            && let Some((ns, name)) = live.pop_front()
        {
            ctx.unlock(&ns, &name)?;
            changes += 1;
        }
        i += 1;
    }
    Ok((changes, format!("{new_namespaces} Locks in new namespaces")))
}
