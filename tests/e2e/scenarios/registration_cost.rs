//! What the registration costs writes it does not send, through the real API server: dry-run
//! updates of unlocked ConfigMaps by 16 clients at once, with no registration (deleted), the
//! registration narrowed by its conditions only (format 1, what earlier versions write) and
//! narrowed by its namespaceSelector too (format 2), alternated A B C C B A so that the drift of
//! a shared machine falls on every variant alike; the median of the rounds, and each round's
//! ratio to the no-registration rounds of the same cycle.
//!
//! Two sets of Locks: 20 (in 20 of 200 namespaces), then 2,000 spread over 200 other namespaces;
//! writes in namespaces holding no Lock, and in one holding Locks; then cluster-scoped writes
//! (the cluster-scoped entry keeps its conditions), and lock-to-enforcement of a Lock in a
//! namespace that held none, in each format. A benchmark (about eight minutes): it runs when
//! `KOL_E2E_COST=1`, and prints figures only.

use std::time::{Duration, Instant};

use anyhow::{Context, Result, ensure};
use serde_json::{Value, json};

use crate::env::WebhookMode;
use crate::scenarios::latency::percentiles;
use crate::scenarios::narrowing::create_locks;
use crate::suite::{Ctx, skip};
use crate::webhook::REGISTRATION;

const VWC: &str = "/apis/admissionregistration.k8s.io/v1/validatingwebhookconfigurations";
const FORMAT: &str = "objectlock.dev/registration-format";
const CLIENTS: usize = 16;
const ROUND: Duration = Duration::from_secs(3);
const CYCLES: usize = 3;

#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum Variant {
    None,
    Conditions,
    Namespaces,
}

impl Variant {
    fn label(self) -> &'static str {
        match self {
            Variant::None => "no registration",
            Variant::Conditions => "conditions only (format 1)",
            Variant::Namespaces => "conditions and namespaceSelector (format 2)",
        }
    }
}

pub fn run(ctx: &Ctx) -> Result<()> {
    if ctx.env.cfg.mode != WebhookMode::Own {
        return skip("KOL_E2E_WEBHOOK=external: the registration is not the suite's to delete");
    }
    if std::env::var_os("KOL_E2E_COST").is_none() {
        return skip("a benchmark of about eight minutes: set KOL_E2E_COST=1 to run it");
    }
    let saved = stored(ctx)?;
    let result = measure(ctx, &saved);
    // Whatever happened: the registration back, in format 2, and no bulk Locks left.
    let restored = switch(ctx, &saved, Variant::Namespaces);
    result.and(restored)
}

fn measure(ctx: &Ctx, saved: &Value) -> Result<()> {
    let rest = ctx.rest();
    let variants = [Variant::None, Variant::Conditions, Variant::Namespaces];
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
    let figure = |what: &str, results: &[(Variant, Vec<f64>)]| {
        ctx.figure(format!("registration cost, {what}: {}", summary(results)));
    };
    figure(
        "20 Locks, namespaces without a Lock",
        &abba(ctx, saved, &variants, &unlocked)?,
    );
    figure(
        "20 Locks, a namespace holding one",
        &abba(ctx, saved, &variants, &holding)?,
    );

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
        figure(
            &format!("{placed} Locks over 200 namespaces, namespaces without a Lock"),
            &abba(ctx, saved, &variants, &unlocked)?,
        );
        figure(
            &format!("{placed} Locks over 200 namespaces, a namespace holding 10"),
            &abba(
                ctx,
                saved,
                &variants,
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

fn tag(variant: Variant) -> &'static str {
    match variant {
        Variant::None => "none",
        Variant::Conditions => "f1-",
        Variant::Namespaces => "f2-",
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

/// Rounds of [`CLIENTS`] clients doing dry-run updates of `paths` (each client its own, in
/// turn) for [`ROUND`], in the order A B C C B A, [`CYCLES`] times: writes/s per round.
fn abba(
    ctx: &Ctx,
    saved: &Value,
    variants: &[Variant],
    paths: &[String],
) -> Result<Vec<(Variant, Vec<f64>)>> {
    let mut results: Vec<(Variant, Vec<f64>)> = variants.iter().map(|v| (*v, Vec::new())).collect();
    for _ in 0..CYCLES {
        for variant in variants.iter().chain(variants.iter().rev()) {
            switch(ctx, saved, *variant)?;
            let rate = writes_per_second(ctx, paths)?;
            if let Some((_, rates)) = results.iter_mut().find(|(v, _)| v == variant) {
                rates.push(rate);
            }
        }
    }
    Ok(results)
}

fn writes_per_second(ctx: &Ctx, paths: &[String]) -> Result<f64> {
    let rest = ctx.rest();
    let start = Instant::now();
    let total = std::thread::scope(|scope| {
        let clients: Vec<_> = (0..CLIENTS)
            .map(|c| {
                scope.spawn(move || -> Result<usize> {
                    let mut n = 0usize;
                    while start.elapsed() < ROUND {
                        let path = &paths[(c + n * CLIENTS) % paths.len()];
                        rest.probe_update(path)?
                            .allowed("an unlocked dry-run update")?;
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
    Ok(total as f64 / start.elapsed().as_secs_f64())
}

/// Per variant: median writes/s, and its ratio to no registration with the range of the
/// rounds' ratios (round i of a variant against round i of no registration).
fn summary(results: &[(Variant, Vec<f64>)]) -> String {
    let median = |rates: &[f64]| {
        let mut sorted = rates.to_vec();
        sorted.sort_by(f64::total_cmp);
        let n = sorted.len();
        if n == 0 {
            0.0
        } else if n % 2 == 1 {
            sorted[n / 2]
        } else {
            (sorted[n / 2 - 1] + sorted[n / 2]) / 2.0
        }
    };
    let none = results
        .iter()
        .find(|(v, _)| *v == Variant::None)
        .map(|(_, r)| r.clone())
        .unwrap_or_default();
    let base = median(&none);
    results
        .iter()
        .map(|(variant, rates)| {
            let ratios: Vec<f64> = rates.iter().zip(&none).map(|(r, n)| r / n).collect();
            let (lo, hi) = ratios
                .iter()
                .fold((f64::MAX, f64::MIN), |(lo, hi), r| (lo.min(*r), hi.max(*r)));
            let each: Vec<String> = rates.iter().map(|r| format!("{r:.0}")).collect();
            format!(
                "{} {:.0} writes/s ({:.2}x, rounds {lo:.2}-{hi:.2}; {})",
                variant.label(),
                median(rates),
                median(rates) / base,
                each.join(" ")
            )
        })
        .collect::<Vec<_>>()
        .join("; ")
}
