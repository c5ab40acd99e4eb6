//! What the registration costs writes it does not send, through the real API server: dry-run
//! updates of unlocked ConfigMaps by 16 clients at once, with no registration (deleted), the
//! registration narrowed by its conditions only (format 1, what earlier versions write) and
//! narrowed by its namespaceSelector too (format 2), alternated A B C C B A so that the drift of
//! a shared machine falls on every variant alike: the median of each variant's rounds, and the
//! median of its ratios to no registration cycle by cycle (a variant's two rounds of a cycle
//! pooled, against those of no registration).
//!
//! Three figures per round: writes per second; the API server's CPU time per write (utime and
//! stime of its process, read before and after the round; local control plane only); and the
//! time its `ValidatingAdmissionWebhook` plugin took per write (its own histogram). The first
//! moves by 2x from one round to the next when anything else runs on the machine; the second is
//! what a write costs the API server, which other work delays but hardly changes; the third is
//! where all the registration adds to a write it does not send is spent, so it bounds that cost
//! far more tightly than the difference of two noisy totals. Each comparison starts once the API
//! server is back at rest, and with a round that is not counted.
//!
//! Two sets of Locks: 20 (in 20 of 200 namespaces), then 2,000 spread over 200 other namespaces;
//! writes in namespaces holding no Lock (with 20 Locks in longer and more rounds: the variants
//! are closest there), and in one holding Locks; then cluster-scoped writes (the cluster-scoped
//! entry keeps its conditions), and lock-to-enforcement of a Lock in a namespace that held none,
//! in each format; last, what a Lock asking for CREATE costs the creations of other names (in its
//! namespace and elsewhere). A benchmark (about ten minutes): it runs when `KOL_E2E_COST=1`
//! (`KOL_E2E_COST=create`: the CREATE comparison alone, about a minute; `KOL_E2E_COST=goal`:
//! namespaces without a Lock alone, no registration against format 2, with 20 and 2,000 Locks;
//! `KOL_E2E_COST_CYCLES=N`: N cycles per comparison), and prints figures only.
//!
//! `KOL_E2E_COST=binaries` compares two builds instead, with the broad registration (every
//! write sent to the webhook): the binary under test against `KOL_E2E_COST_BASELINE` (another
//! build's `kube-object-lock`), one instance at a time on the suite's port, A B B A, about three
//! minutes.

use std::time::{Duration, Instant};

use anyhow::{Context, Result, ensure};
use serde_json::{Value, json};

use crate::env::WebhookMode;
use crate::harness::Harness;
use crate::scenarios::latency::percentiles;
use crate::scenarios::narrowing::{apiserver_metrics, create_locks};
use crate::suite::{Ctx, skip};
use crate::webhook::REGISTRATION;

const VWC: &str = "/apis/admissionregistration.k8s.io/v1/validatingwebhookconfigurations";
const FORMAT: &str = "objectlock.dev/registration-format";
const CLIENTS: usize = 16;

#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum Variant {
    None,
    Conditions,
    Namespaces,
    /// Format 2, and no Lock asks for CREATE: no entry sends CREATE.
    NoCreateLock,
    /// The broad registration, served by the `KOL_E2E_COST_BASELINE` build.
    BaselineBinary,
    /// The broad registration, served by the binary under test.
    TestedBinary,
    /// A Lock asking for CREATE in the namespace written to: its entry's condition is evaluated
    /// for every CREATE there.
    CreateLockHere,
    /// A Lock asking for CREATE in another namespace: its entry's selector matches the writes out.
    CreateLockElsewhere,
}

impl Variant {
    fn label(self) -> &'static str {
        match self {
            Variant::None => "no registration",
            Variant::Conditions => "conditions only (format 1)",
            Variant::Namespaces => "conditions and namespaceSelector (format 2)",
            Variant::NoCreateLock => "no Lock asks CREATE",
            Variant::CreateLockHere => "a Lock asking CREATE in the namespace",
            Variant::CreateLockElsewhere => "a Lock asking CREATE in another namespace",
            Variant::BaselineBinary => "broad, baseline binary",
            Variant::TestedBinary => "broad, binary under test",
        }
    }
}

pub fn run(ctx: &Ctx) -> Result<()> {
    if ctx.env.cfg.mode != WebhookMode::Own {
        return skip("KOL_E2E_WEBHOOK=external: the registration is not the suite's to delete");
    }
    if std::env::var_os("KOL_E2E_COST").is_none() {
        return skip("a benchmark of about ten minutes: set KOL_E2E_COST=1 to run it");
    }
    let saved = stored(ctx)?;
    let result = match std::env::var("KOL_E2E_COST").as_deref() {
        // The CREATE comparison alone (about a minute).
        Ok("create") => measure_creates(ctx, &saved),
        // The goals alone: namespaces without a Lock, no registration against format 2.
        Ok("goal") => measure(ctx, &saved, Scope::Goal),
        Ok("binaries") => measure_binaries(ctx),
        _ => measure(ctx, &saved, Scope::All).and_then(|()| measure_creates(ctx, &saved)),
    };
    // Whatever happened: the registration back, in format 2, and no bulk Locks left.
    let restored = switch(ctx, &saved, Variant::Namespaces);
    result.and(restored)
}

/// What [`measure`] compares: everything, or only what the goals are about (writes in
/// namespaces without a Lock, no registration against format 2).
#[derive(Clone, Copy, PartialEq, Eq)]
enum Scope {
    All,
    Goal,
}

fn measure(ctx: &Ctx, saved: &Value, scope: Scope) -> Result<()> {
    let rest = ctx.rest();
    let variants: &[Variant] = match scope {
        Scope::All => &[Variant::None, Variant::Conditions, Variant::Namespaces],
        Scope::Goal => &[Variant::None, Variant::Namespaces],
    };
    // 200 namespaces with a ConfigMap each; the first 20 hold a Lock (on another ConfigMap).
    let namespaces: Vec<String> = (0..200)
        .map(|i| ctx.namespace(&format!("n{i:03}")))
        .collect::<Result<_>>()?;
    for ns in &namespaces {
        ctx.configmap(ns, "free", json!({}))?;
    }
    for ns in &namespaces[..20] {
        ctx.configmap(ns, "held", json!({}))?;
        ctx.lock(ns, "held", json!({}))?;
    }
    let unlocked: Vec<String> = (namespaces[20..].iter())
        .map(|ns| format!("/api/v1/namespaces/{ns}/configmaps/free"))
        .collect();
    let holding = vec![format!(
        "/api/v1/namespaces/{}/configmaps/free",
        namespaces[0]
    )];
    let figure = |what: &str, comparison: &Comparison| {
        for line in summary(comparison) {
            ctx.figure(format!("registration cost, {what}: {line}"));
        }
    };
    figure(
        "20 Locks, namespaces without a Lock",
        &abba(ctx, saved, LONG, variants, &unlocked)?,
    );
    if scope == Scope::All {
        figure(
            "20 Locks, a namespace holding one",
            &abba(ctx, saved, SHORT, variants, &holding)?,
        );
    }

    // 2,000 Locks over 200 other namespaces (their objects need not exist), the 20 deleted:
    // more than registration.max_names (2,000) would make the registration broad.
    for ns in &namespaces[..20] {
        ctx.unlock(ns, "held")?;
    }
    let bulk: Vec<String> = (0..200)
        .map(|i| ctx.namespace(&format!("m{i:03}")))
        .collect::<Result<_>>()?;
    let existing = ["locks", "clusterlocks"]
        .iter()
        .map(|kind| {
            let reply = rest.get(&format!("/apis/objectlock.dev/v1alpha1/{kind}"))?;
            Ok(reply.body["items"].as_array().map_or(0, Vec::len))
        })
        .sum::<Result<usize>>()?;
    let locks: Vec<(String, String)> = (bulk.iter())
        .flat_map(|ns| (0..10).map(move |i| (ns.clone(), format!("bulk-{i}"))))
        .take(2_000 - existing.min(2_000))
        .collect();
    let placed = locks.len();
    ctx.configmap(&bulk[0], "free", json!({}))?;
    let created = create_locks(ctx, &locks);
    let result = created.and_then(|()| {
        switch(ctx, saved, Variant::Namespaces)?;
        let start = Instant::now();
        let last = &locks.last().context("no room for bulk Locks")?.0;
        while !names_namespace(&stored(ctx)?, last) {
            ensure!(
                start.elapsed() < Duration::from_secs(60),
                "the 2,000 Locks never reached the registration"
            );
            std::thread::sleep(Duration::from_millis(100));
        }
        let plan = if scope == Scope::Goal { LONG } else { SHORT };
        figure(
            &format!("{placed} Locks over 200 namespaces, namespaces without a Lock"),
            &abba(ctx, saved, plan, variants, &unlocked)?,
        );
        if scope == Scope::Goal {
            return Ok(());
        }
        figure(
            &format!("{placed} Locks over 200 namespaces, a namespace holding 10"),
            &abba(
                ctx,
                saved,
                SHORT,
                variants,
                &[format!("/api/v1/namespaces/{}/configmaps/free", bulk[0])],
            )?,
        );
        Ok(())
    });
    let deleted = bulk.iter().try_for_each(|ns| {
        rest.delete(&format!(
            "/apis/objectlock.dev/v1alpha1/namespaces/{ns}/locks"
        ))?
        .allowed("delete the bulk Locks")
    });
    result?;
    deleted?;
    if scope == Scope::Goal {
        return Ok(());
    }

    // Cluster-scoped writes: the cluster-scoped entry's conditions, whatever the format.
    let role = ctx.cluster_name("cost");
    ctx.create(
        "/apis/rbac.authorization.k8s.io/v1/clusterroles",
        json!({"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRole",
               "metadata": {"name": role}, "rules": []}),
    )?;
    let path = format!("/apis/rbac.authorization.k8s.io/v1/clusterroles/{role}");
    let measured = abba(
        ctx,
        saved,
        SHORT,
        &[Variant::None, Variant::Namespaces],
        std::slice::from_ref(&path),
    );
    let removed = rest.delete(&path)?.allowed("delete the ClusterRole");
    figure("a cluster-scoped object (ClusterRole), no Lock", &measured?);
    removed?;

    // A Lock in a namespace that held none, in each format.
    for variant in [Variant::Conditions, Variant::Namespaces] {
        switch(ctx, saved, variant)?;
        let mut took = Vec::new();
        for i in 0..ctx.env.cfg.tries.min(20) {
            let ns = ctx.namespace(&format!("{}{i}", tag(variant)))?;
            ctx.configmap(&ns, "new", json!({}))?;
            ctx.lock(&ns, "new", json!({}))?;
            took.push(
                ctx.update_enforced(&format!("/api/v1/namespaces/{ns}/configmaps/new"))?
                    .after,
            );
        }
        ctx.figure(format!(
            "registration cost, {}: a Lock in a namespace that held none -> first refused write: {}",
            variant.label(),
            percentiles(&mut took)
        ));
    }
    Ok(())
}

/// What a Lock asking for CREATE costs the creations it does not concern: dry-run creates of new
/// names, format 2, with no such Lock (no entry sends CREATE: its rules match nothing), with one
/// in the namespace written to (its entry's condition is evaluated for each), and with one in
/// another namespace (its entry's selector matches the writes out).
fn measure_creates(ctx: &Ctx, saved: &Value) -> Result<()> {
    switch(ctx, saved, Variant::Namespaces)?;
    let here = ctx.namespace("create-here")?;
    let elsewhere = ctx.namespace("create-elsewhere")?;
    let set = |variant| set_create_lock(ctx, &here, &elsewhere, variant);
    let measured = alternate(
        ctx,
        SHORT,
        &[
            Variant::NoCreateLock,
            Variant::CreateLockHere,
            Variant::CreateLockElsewhere,
        ],
        &set,
        &Requests::Creates(&here),
    );
    let cleared = set(Variant::NoCreateLock);
    for line in summary(&measured?) {
        ctx.figure(format!(
            "registration cost, CREATE of unlocked names: {line}"
        ));
    }
    cleared
}

/// Writes/s of unlocked ConfigMaps with the broad registration (`registration.max_names` 1, two
/// Locks), served by the baseline build and by the binary under test in turn, each started
/// afresh in place of the suite's instance (which is back afterwards).
fn measure_binaries(ctx: &Ctx) -> Result<()> {
    let baseline = std::env::var_os("KOL_E2E_COST_BASELINE")
        .map(std::path::PathBuf::from)
        .filter(|p| p.is_file())
        .context("KOL_E2E_COST=binaries: set KOL_E2E_COST_BASELINE to a kube-object-lock binary")?;
    let namespaces: Vec<String> = (0..20)
        .map(|i| ctx.namespace(&format!("b{i:02}")))
        .collect::<Result<_>>()?;
    for ns in &namespaces {
        ctx.configmap(ns, "free", json!({}))?;
    }
    for ns in &namespaces[..2] {
        ctx.lock(ns, "held", json!({}))?;
    }
    let paths: Vec<String> = (namespaces.iter())
        .map(|ns| format!("/api/v1/namespaces/{ns}/configmaps/free"))
        .collect();
    let requests = Requests::Updates(&paths);
    let client_ca = (ctx.env.serve.lock().ok())
        .and_then(|s| s.as_ref().map(crate::webhook::Serve::client_ca))
        .unwrap_or(false);
    let running = std::cell::RefCell::new(None::<(Variant, crate::webhook::Serve)>);
    let set = |variant: Variant| -> Result<()> {
        if matches!(&*running.borrow(), Some((v, _)) if *v == variant) {
            return Ok(());
        }
        if let Some((_, serve)) = running.borrow_mut().take() {
            serve.stop()?;
        }
        let bin = match variant {
            Variant::BaselineBinary => baseline.as_path(),
            _ => ctx.env.cfg.server_bin.as_path(),
        };
        let settings = [("KUBE_OBJECT_LOCK__REGISTRATION__MAX_NAMES", "1")];
        let serve = crate::webhook::Serve::start_with(bin, &ctx.env.files, client_ca, &settings)?;
        running.replace(Some((variant, serve)));
        wait_broad(ctx)?;
        // The API server's connections to the new instance, and the instance's index, warm up.
        write(ctx, Duration::from_secs(2), &requests).map(|_| ())
    };
    let plan = Plan {
        length: Duration::from_secs(6),
        cycles: 5,
    };
    let measured = ctx.with_webhook_stopped(|| {
        let measured = alternate(
            ctx,
            plan,
            &[Variant::BaselineBinary, Variant::TestedBinary],
            &set,
            &requests,
        );
        let stopped = match running.borrow_mut().take() {
            Some((_, serve)) => serve.stop(),
            None => Ok(()),
        };
        measured.and_then(|m| stopped.map(|()| m))
    })?;
    for line in summary(&measured) {
        ctx.figure(format!(
            "registration cost, two builds, broad registration: {line}"
        ));
    }
    Ok(())
}

/// Waits until every entry's `may-be-locked` condition is `true`: the broad registration.
fn wait_broad(ctx: &Ctx) -> Result<()> {
    registration_until(ctx, "the registration never became broad", |config| {
        let entries = config["webhooks"].as_array().into_iter().flatten();
        entries.clone().count() > 0
            && entries
                .flat_map(|w| w["matchConditions"].as_array().into_iter().flatten())
                .filter(|c| c["name"] == "may-be-locked")
                .all(|c| {
                    (c["expression"].as_str())
                        .is_some_and(|e| e.split("//").next().is_some_and(|e| e.trim() == "true"))
                })
    })
}

/// Puts the Lock `reserved` asking for CREATE where `variant` says (in `here`, in `elsewhere`,
/// or nowhere), and waits until the registration's CREATE entry says the same.
fn set_create_lock(ctx: &Ctx, here: &str, elsewhere: &str, variant: Variant) -> Result<()> {
    let rest = ctx.rest();
    let (wanted, other) = match variant {
        Variant::CreateLockHere => (Some(here), elsewhere),
        Variant::CreateLockElsewhere => (Some(elsewhere), here),
        _ => (None, here),
    };
    for ns in std::iter::once(other).chain(wanted.is_none().then_some(elsewhere)) {
        let reply = rest.delete(&format!(
            "/apis/objectlock.dev/v1alpha1/namespaces/{ns}/locks/reserved"
        ))?;
        ensure!(
            reply.ok() || reply.code == 404,
            "delete Lock {ns}/reserved: {} {}",
            reply.code,
            reply.message()
        );
    }
    if let Some(ns) = wanted {
        let path = format!("/apis/objectlock.dev/v1alpha1/namespaces/{ns}/locks/reserved");
        if !rest.get(&path)?.ok() {
            ctx.lock(ns, "reserved", json!({"operations": ["CREATE"]}))?;
        }
    }
    let what = format!("the registration's CREATE entry never reached {variant:?}");
    registration_until(ctx, &what, |config| {
        let create = (config["webhooks"].as_array().into_iter().flatten())
            .find(|w| w["name"] == "create.objectlock.dev");
        let names =
            |ns: &str| create.is_some_and(|w| w.to_string().contains(&format!("|{ns}/reserved|")));
        match wanted {
            None => create.is_none(),
            Some(ns) => names(ns) && !names(other),
        }
    })
}

/// Waits (30 s at most, else `failure`) until the stored registration satisfies `done`, then
/// for the API server's view of webhook configurations, which follows its own watch.
fn registration_until(ctx: &Ctx, failure: &str, done: impl Fn(&Value) -> bool) -> Result<()> {
    let start = Instant::now();
    while !done(&stored(ctx)?) {
        ensure!(start.elapsed() < Duration::from_secs(30), "{failure}");
        std::thread::sleep(Duration::from_millis(50));
    }
    std::thread::sleep(Duration::from_millis(1500));
    Ok(())
}

fn tag(variant: Variant) -> &'static str {
    match variant {
        Variant::None => "none",
        Variant::Conditions => "f1-",
        Variant::Namespaces => "f2-",
        _ => "create-",
    }
}

/// The registration as stored.
fn stored(ctx: &Ctx) -> Result<Value> {
    let reply = ctx.rest().get(&format!("{VWC}/{REGISTRATION}"))?;
    ensure!(reply.ok(), "GET the registration: {}", reply.code);
    Ok(reply.body)
}

fn names_namespace(config: &Value, ns: &str) -> bool {
    (config["webhooks"].as_array().into_iter().flatten()).any(|w| {
        (w["namespaceSelector"]["matchExpressions"]
            .as_array()
            .into_iter()
            .flatten())
        .any(|e| {
            e["operator"] == "In"
                && e["values"]
                    .as_array()
                    .is_some_and(|v| v.iter().any(|v| v == ns))
        })
    })
}

/// Puts the registration in `variant`: deleted, or back (from `saved`) with the format
/// annotation; then waits until the instance has written it and the API server has had a
/// moment to pick it up.
fn switch(ctx: &Ctx, saved: &Value, variant: Variant) -> Result<()> {
    let rest = ctx.rest();
    let path = format!("{VWC}/{REGISTRATION}");
    let exists = rest.get(&path)?.ok();
    match (variant, exists) {
        (Variant::None, true) => rest.delete(&path)?.allowed("delete the registration")?,
        (Variant::None, false) => {}
        (_, false) => {
            let mut config = saved.clone();
            let meta = config["metadata"]
                .as_object_mut()
                .context("the registration has no metadata")?;
            for field in [
                "resourceVersion",
                "uid",
                "managedFields",
                "creationTimestamp",
                "generation",
            ] {
                meta.remove(field);
            }
            rest.post(VWC, &config)?
                .allowed("create the registration again")?;
        }
        (_, true) => {}
    }
    if variant != Variant::None {
        let format = if variant == Variant::Namespaces {
            "2"
        } else {
            "1"
        };
        rest.merge_patch(
            &path,
            &json!({"metadata": {"annotations": {FORMAT: format}}}),
        )?
        .allowed("annotate the registration")?;
        let start = Instant::now();
        loop {
            let config = stored(ctx)?;
            let narrowed = (config["webhooks"].as_array().into_iter().flatten())
                .filter(|w| {
                    w["name"]
                        .as_str()
                        .is_some_and(|n| n.starts_with("namespaced"))
                })
                .all(|w| {
                    (w["namespaceSelector"]["matchExpressions"]
                        .as_array()
                        .into_iter()
                        .flatten())
                    .any(|e| e["operator"] != "NotIn")
                });
            let marked = config["webhooks"][0]["matchConditions"]
                .as_array()
                .into_iter()
                .flatten()
                .any(|c| {
                    c["name"] == "may-be-locked"
                        && c["expression"]
                            .as_str()
                            .is_some_and(|e| e.contains("// registration-format 2"))
                });
            if narrowed == (variant == Variant::Namespaces) && marked == narrowed {
                break;
            }
            ensure!(
                start.elapsed() < Duration::from_secs(30),
                "the registration never reached {variant:?}"
            );
            std::thread::sleep(Duration::from_millis(50));
        }
    }
    // The API server's view of webhook configurations follows its own watch.
    std::thread::sleep(Duration::from_millis(1500));
    Ok(())
}

/// How a comparison runs: rounds of `length`, in the order A B C C B A, `cycles` times.
#[derive(Clone, Copy)]
struct Plan {
    length: Duration,
    cycles: usize,
}

/// Writes in the 180 namespaces without a Lock, 20 Locks: the variants are within a few percent
/// of each other, less than a short round moves on a shared machine.
const LONG: Plan = Plan {
    length: Duration::from_secs(5),
    cycles: 5,
};
const SHORT: Plan = Plan {
    length: Duration::from_secs(3),
    cycles: 3,
};

/// What one round did (or several, pooled): writes, in how long, the API server's CPU time
/// meanwhile (when the cluster is the local control plane, whose process is readable), and the
/// time its webhook admission plugin took.
#[derive(Clone, Copy)]
struct Round {
    writes: usize,
    elapsed: Duration,
    cpu: Option<Duration>,
    plugin: Plugin,
}

/// The API server's `ValidatingAdmissionWebhook` plugin over a round, from its own histogram
/// (`apiserver_admission_controller_admission_duration_seconds`, the round's operation): all the
/// registration can add to a write it does not send is in there (the entries' rules, namespace
/// lookups, selectors and conditions), measured in wall time, which is at least its CPU time.
#[derive(Clone, Copy)]
struct Plugin {
    seconds: f64,
    calls: f64,
}

impl Plugin {
    /// The plugin's microseconds per call.
    fn per_call(&self) -> Option<f64> {
        (self.calls > 0.0).then_some(self.seconds * 1e6 / self.calls)
    }
}

impl Round {
    fn rate(&self) -> f64 {
        self.writes as f64 / self.elapsed.as_secs_f64()
    }

    /// The API server's CPU microseconds per write.
    fn cpu_per_write(&self) -> Option<f64> {
        (self.writes > 0).then_some(self.cpu?.as_secs_f64() * 1e6 / self.writes as f64)
    }

    fn pooled(self, other: Round) -> Round {
        Round {
            writes: self.writes + other.writes,
            elapsed: self.elapsed + other.elapsed,
            cpu: self.cpu.zip(other.cpu).map(|(a, b)| a + b),
            plugin: Plugin {
                seconds: self.plugin.seconds + other.plugin.seconds,
                calls: self.plugin.calls + other.plugin.calls,
            },
        }
    }
}

/// The `ValidatingAdmissionWebhook` plugin's histogram for `operation` so far, summed over its
/// series.
fn plugin_so_far(ctx: &Ctx, operation: &str) -> Result<Plugin> {
    let text = apiserver_metrics(ctx)?;
    let metric = "apiserver_admission_controller_admission_duration_seconds";
    let series = |suffix: &str| -> f64 {
        (text.lines())
            .filter(|l| {
                l.starts_with(&format!("{metric}_{suffix}{{"))
                    && l.contains("name=\"ValidatingAdmissionWebhook\"")
                    && l.contains(&format!("operation=\"{operation}\""))
                    && l.contains("type=\"validate\"")
            })
            .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
            .sum()
    };
    Ok(Plugin {
        seconds: series("sum"),
        calls: series("count"),
    })
}

/// Cycles per comparison: `KOL_E2E_COST_CYCLES` when set (more cycles, a narrower interval),
/// else `plan`'s.
fn cycles(plan: Plan) -> Result<usize> {
    match std::env::var("KOL_E2E_COST_CYCLES") {
        Err(_) => Ok(plan.cycles),
        Ok(n) => match n.parse::<usize>() {
            Ok(n) if n > 0 => Ok(n),
            _ => anyhow::bail!("KOL_E2E_COST_CYCLES={n:?}: expected a number of cycles, 1 or more"),
        },
    }
}

/// The API server's CPU time so far, if the cluster is the local control plane.
fn apiserver_cpu(ctx: &Ctx) -> Result<Option<Duration>> {
    (ctx.env.cfg.harness.as_ref())
        .map(Harness::apiserver_cpu)
        .transpose()
}

/// The API server's CPU use with nothing written, in milliseconds per second, and how long it
/// took to fall below 5% of a core.
struct AtRest {
    rate: f64,
    waited: Duration,
}

/// Waits (at most a minute) for the API server to finish what the last steps left it (a burst of
/// namespaces or Locks keeps the controller manager and the watches busy for a while), so that
/// the first rounds do not pay for it; what it uses at rest is in every round's CPU time.
fn settle(ctx: &Ctx) -> Result<Option<AtRest>> {
    let window = Duration::from_secs(2);
    let start = Instant::now();
    loop {
        let Some(before) = apiserver_cpu(ctx)? else {
            return Ok(None);
        };
        std::thread::sleep(window);
        let Some(after) = apiserver_cpu(ctx)? else {
            return Ok(None);
        };
        let rate = after.saturating_sub(before).as_secs_f64() * 1e3 / window.as_secs_f64();
        if rate < 50.0 || start.elapsed() > Duration::from_secs(60) {
            return Ok(Some(AtRest {
                rate,
                waited: start.elapsed(),
            }));
        }
    }
}

/// The rounds of a comparison, each variant's in the order they ran.
struct Comparison {
    at_rest: Option<AtRest>,
    results: Vec<(Variant, Vec<Round>)>,
}

/// Rounds of [`CLIENTS`] clients doing dry-run updates of `paths` (each client its own, in
/// turn) as `plan` says, after the API server has settled and one round to warm it and the
/// clients' connections up.
fn abba(
    ctx: &Ctx,
    saved: &Value,
    plan: Plan,
    variants: &[Variant],
    paths: &[String],
) -> Result<Comparison> {
    let requests = Requests::Updates(paths);
    alternate(ctx, plan, variants, &|v| switch(ctx, saved, v), &requests)
}

/// What the clients send: dry-run updates of existing objects, or dry-run creates of new
/// ConfigMaps (names no Lock holds) in a namespace.
enum Requests<'a> {
    Updates(&'a [String]),
    Creates(&'a str),
}

/// [`abba`] with the variants set by `set`, the first one the baseline.
fn alternate(
    ctx: &Ctx,
    plan: Plan,
    variants: &[Variant],
    set: &dyn Fn(Variant) -> Result<()>,
    requests: &Requests,
) -> Result<Comparison> {
    let first = *variants.first().context("no variant to compare")?;
    set(first)?;
    let at_rest = settle(ctx)?;
    write(ctx, plan.length, requests)?;
    let mut results: Vec<(Variant, Vec<Round>)> =
        variants.iter().map(|v| (*v, Vec::new())).collect();
    for _ in 0..cycles(plan)? {
        for variant in variants.iter().chain(variants.iter().rev()) {
            set(*variant)?;
            let round = write(ctx, plan.length, requests)?;
            if let Some((_, rounds)) = results.iter_mut().find(|(v, _)| v == variant) {
                rounds.push(round);
            }
        }
    }
    Ok(Comparison { at_rest, results })
}

fn write(ctx: &Ctx, length: Duration, requests: &Requests) -> Result<Round> {
    let rest = ctx.rest();
    let operation = match requests {
        Requests::Updates(_) => "UPDATE",
        Requests::Creates(_) => "CREATE",
    };
    let plugin = plugin_so_far(ctx, operation)?;
    let cpu = apiserver_cpu(ctx)?;
    let start = Instant::now();
    let writes = std::thread::scope(|scope| {
        let clients: Vec<_> = (0..CLIENTS)
            .map(|c| {
                scope.spawn(move || -> Result<usize> {
                    let mut n = 0usize;
                    while start.elapsed() < length {
                        match requests {
                            Requests::Updates(paths) => {
                                let path = &paths[(c + n * CLIENTS) % paths.len()];
                                rest.probe_update(path)?
                                    .allowed("an unlocked dry-run update")?;
                            }
                            Requests::Creates(ns) => {
                                let body = json!({"apiVersion": "v1", "kind": "ConfigMap",
                                                  "metadata": {"name": format!("c-{c}-{n}")}});
                                rest.post(
                                    &format!("/api/v1/namespaces/{ns}/configmaps?dryRun=All"),
                                    &body,
                                )?
                                .allowed("a dry-run create of an unlocked name")?;
                            }
                        }
                        n += 1;
                    }
                    Ok(n)
                })
            })
            .collect();
        clients.into_iter().try_fold(0usize, |sum, c| {
            Ok::<_, anyhow::Error>(
                sum + c
                    .join()
                    .map_err(|_| anyhow::anyhow!("a client panicked"))??,
            )
        })
    })?;
    let elapsed = start.elapsed();
    let cpu = match (cpu, apiserver_cpu(ctx)?) {
        (Some(before), Some(after)) => Some(after.saturating_sub(before)),
        _ => None,
    };
    let after = plugin_so_far(ctx, operation)?;
    let plugin = Plugin {
        seconds: after.seconds - plugin.seconds,
        calls: after.calls - plugin.calls,
    };
    Ok(Round {
        writes,
        elapsed,
        cpu,
        plugin,
    })
}

fn median(values: &[f64]) -> f64 {
    let mut sorted = values.to_vec();
    sorted.sort_by(f64::total_cmp);
    let n = sorted.len();
    if n == 0 {
        f64::NAN
    } else if n % 2 == 1 {
        sorted[n / 2]
    } else {
        (sorted[n / 2 - 1] + sorted[n / 2]) / 2.0
    }
}

/// One figure of a variant: per round, and per cycle (its two rounds of each A B C C B A
/// pooled, whose mean time is the same for every variant: a steady drift of the machine cancels
/// out).
struct Series {
    variant: Variant,
    rounds: Vec<f64>,
    cycles: Vec<f64>,
}

/// Per variant: the median of its rounds in `unit`; beside every variant but no registration,
/// the median of its cycles' ratios to no registration's same cycle (`ratio(variant, none)`,
/// more than 1 is better), their mean with its standard error, and their range; then each
/// round's figure.
fn compare(series: &[Series], (unit, per): (&str, &str), ratio: fn(f64, f64) -> f64) -> String {
    let baseline = series.first().map(|s| s.variant);
    let none = series.first().map(|s| s.cycles.clone()).unwrap_or_default();
    (series.iter())
        .map(|s| {
            let each: Vec<String> = s.rounds.iter().map(|r| format!("{r:.0}")).collect();
            let each = each.join(" ");
            let head = format!("{} {:.0} {unit}", s.variant.label(), median(&s.rounds));
            if Some(s.variant) == baseline {
                return format!("{head} ({each})");
            }
            let ratios: Vec<f64> = (s.cycles.iter().zip(&none))
                .map(|(v, n)| ratio(*v, *n))
                .collect();
            format!("{head} ({}{per}; {each})", spread(&ratios))
        })
        .collect::<Vec<_>>()
        .join("; ")
}

/// Ratios of cycles: their median, mean with its standard error, and range.
fn spread(ratios: &[f64]) -> String {
    let n = ratios.len() as f64;
    let mean = ratios.iter().sum::<f64>() / n;
    let variance = ratios.iter().map(|r| (r - mean).powi(2)).sum::<f64>() / (n - 1.0).max(1.0);
    let (lo, hi) =
        (ratios.iter()).fold((f64::MAX, f64::MIN), |(lo, hi), r| (lo.min(*r), hi.max(*r)));
    format!(
        "{:.3}x median, mean {mean:.3} +- {:.3}, cycles {lo:.2}-{hi:.2}",
        median(ratios),
        (variance / n).sqrt()
    )
}

/// The webhook plugin's time per write, and what it bounds: cycle by cycle, no registration's
/// CPU per write against the same plus what the plugin took more than without a registration,
/// as writes per CPU-second (none when the API server's CPU is not readable).
fn plugin_summary(comparison: &Comparison) -> Option<String> {
    let mut results = comparison.results.iter();
    let (baseline, none) = results.next()?;
    let pooled = |rounds: &[Round]| -> Vec<Round> {
        (rounds.chunks_exact(2))
            .map(|pair| pair[0].pooled(pair[1]))
            .collect()
    };
    let per_call = |rounds: &[Round]| -> Option<Vec<f64>> {
        rounds.iter().map(|r| r.plugin.per_call()).collect()
    };
    let base_cpu: Vec<f64> = (pooled(none).iter())
        .map(Round::cpu_per_write)
        .collect::<Option<_>>()?;
    let base_plugin = per_call(&pooled(none))?;
    let mut lines = vec![format!(
        "webhook plugin: {} {:.1} us per write",
        baseline.label(),
        median(&per_call(none)?)
    )];
    for (variant, rounds) in results {
        let plugin = per_call(&pooled(rounds))?;
        let bound: Vec<f64> = (base_cpu.iter().zip(&base_plugin).zip(&plugin))
            .map(|((cpu, base), plugin)| cpu / (cpu + (plugin - base).max(0.0)))
            .collect();
        lines.push(format!(
            "{} {:.1} us per write (at least {} writes per CPU-second)",
            variant.label(),
            median(&per_call(rounds)?),
            spread(&bound)
        ));
    }
    Some(lines.join("; "))
}

/// The rounds' throughput; the API server's CPU per write as writes per CPU-second against no
/// registration with what it used at rest (none when its process is not readable); its webhook
/// plugin's time per write.
fn summary(comparison: &Comparison) -> Vec<String> {
    let series = |f: fn(&Round) -> Option<f64>| -> Option<Vec<Series>> {
        (comparison.results.iter())
            .map(|(variant, rounds)| {
                let pooled: Vec<Round> = (rounds.chunks_exact(2))
                    .map(|pair| pair[0].pooled(pair[1]))
                    .collect();
                Some(Series {
                    variant: *variant,
                    rounds: rounds.iter().map(f).collect::<Option<_>>()?,
                    cycles: pooled.iter().map(f).collect::<Option<_>>()?,
                })
            })
            .collect()
    };
    let rates = series(|r| Some(r.rate())).unwrap_or_default();
    let rates = compare(&rates, ("writes/s", ""), |v, none| v / none);
    let cpu = series(Round::cpu_per_write).map(|cpu| {
        let at_rest = (comparison.at_rest.as_ref()).map_or(String::new(), |r| {
            format!(
                "; at rest before: {:.0} ms CPU per second (after {:.0} s)",
                r.rate,
                r.waited.as_secs_f64()
            )
        });
        let cpu = compare(
            &cpu,
            ("us API server CPU per write", " writes per CPU-second"),
            |v, none| none / v,
        );
        format!("{cpu}{at_rest}")
    });
    std::iter::once(rates)
        .chain(cpu)
        .chain(plugin_summary(comparison))
        .collect()
}
