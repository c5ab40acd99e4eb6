//! The registration narrowed to the locked names: the API server accepts the CEL the webhook
//! writes, sends it writes to locked objects only (counted by the API server's own
//! `apiserver_admission_webhook_request_total`), goes broad beyond `registration.max_names`,
//! and with the webhook stopped refuses only writes to locked objects. Figures: lock to
//! enforcement including the registration update, and the cost per write of unlocked objects
//! with 0 to just under 2,000 locked names (the default bound), one client and 16.

use std::time::{Duration, Instant};

use anyhow::{Context, Result, ensure};
use serde_json::{Value, json};

use crate::env::WebhookMode;
use crate::scenarios::latency::percentiles;
use crate::suite::{Ctx, skip};
use crate::webhook::{REGISTRATION, Serve};

const VWC: &str = "/apis/admissionregistration.k8s.io/v1/validatingwebhookconfigurations";
const NAMESPACED: &str = "namespaced.objectlock.dev";

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
    // Beyond registration.max_names: broad, every write reaches the webhook.
    restart_serve(
        ctx,
        &[("KUBE_OBJECT_LOCK__REGISTRATION__MAX_NAMES", "2")],
        |ctx| {
            let start = Instant::now();
            while conditions(ctx)?
                .lines()
                .any(|l| !l.ends_with("may-be-locked: true"))
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
    )?;
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
fn conditions(ctx: &Ctx) -> Result<String> {
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

fn registered(ctx: &Ctx, key: &str) -> Result<bool> {
    Ok(conditions(ctx)?.contains(key))
}

/// Calls the API server made to the namespaced webhook so far (its own metric).
fn webhook_calls(ctx: &Ctx) -> Result<u64> {
    let reply = ctx.rest().get("/metrics")?;
    let Value::String(text) = &reply.body else {
        anyhow::bail!("/metrics: {} {}", reply.code, reply.body);
    };
    let label = format!("name=\"{NAMESPACED}\"");
    let sum = |metric: &str| -> Option<u64> {
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
    };
    sum("apiserver_admission_webhook_request_total")
        .or_else(|| sum("apiserver_admission_webhook_admission_duration_seconds_count"))
        .or(Some(0))
        .context("no webhook metric")
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
        let rest = ctx.rest();
        let collection = format!("/apis/objectlock.dev/v1alpha1/namespaces/{bulk}/locks");
        let collection = &collection;
        std::thread::scope(|scope| {
            let writers: Vec<_> = names
                .chunks(names.len().div_ceil(8).max(1))
                .map(|chunk| {
                    scope.spawn(move || -> Result<()> {
                        for name in chunk {
                            let lock = json!({"apiVersion": "objectlock.dev/v1alpha1",
                                "kind": "Lock", "metadata": {"name": name}, "spec": {}});
                            rest.post(collection, &lock)?
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
            Ok::<_, anyhow::Error>(())
        })?;
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
