//! The webhook's `GET /metrics` (plain HTTP on `metrics.listen`, the suite's at
//! `127.0.0.1:18444`) scraped before and after this scenario's own admissions: the admission
//! counters moved by at least what it caused (the other scenarios run at the same time), and
//! by exactly that for the one series only it causes, `invalid_requests_total` (requests that
//! are not an AdmissionReview, posted to the webhook directly).

use std::collections::BTreeMap;
use std::io::{Read, Write};
use std::net::TcpStream;
use std::path::Path;
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail, ensure};
use serde_json::json;

use crate::env::WebhookMode;
use crate::kubectl::run as exec;
use crate::suite::{Ctx, skip};
use crate::webhook::{METRICS_PORT, curl};

/// Of each kind of admission, this many.
const EACH: u64 = 5;

/// One scrape: `name{labels}` to value.
pub struct Samples(BTreeMap<String, f64>);

impl Samples {
    /// The value of `series` (`name{labels}` as exposed), 0 when absent (a series appears once
    /// it counts).
    pub fn get(&self, series: &str) -> f64 {
        self.0.get(series).copied().unwrap_or(0.0)
    }

    /// The sum of every series starting with `prefix` (e.g. a metric and its first labels).
    pub fn total(&self, prefix: &str) -> f64 {
        (self.0.iter())
            .filter(|(series, _)| series.starts_with(prefix))
            .map(|(_, value)| value)
            .sum()
    }
}

/// `GET /metrics` on `127.0.0.1:port`.
pub fn scrape(port: u16) -> Result<Samples> {
    let mut stream = TcpStream::connect(("127.0.0.1", port))
        .with_context(|| format!("connecting to the metrics listener 127.0.0.1:{port}"))?;
    stream.set_read_timeout(Some(Duration::from_secs(10)))?;
    stream.write_all(b"GET /metrics HTTP/1.0\r\nHost: 127.0.0.1\r\n\r\n")?;
    let mut raw = Vec::new();
    stream.read_to_end(&mut raw)?;
    let text = String::from_utf8_lossy(&raw);
    let (head, body) = text
        .split_once("\r\n\r\n")
        .context("GET /metrics: no end of headers")?;
    let status = head.lines().next().unwrap_or_default();
    ensure!(status.contains(" 200 "), "GET /metrics: {status}");
    let mut samples = BTreeMap::new();
    for line in body
        .lines()
        .filter(|l| !l.starts_with('#') && !l.is_empty())
    {
        let Some((series, value)) = line.rsplit_once(' ') else {
            bail!("GET /metrics: not a sample: {line}");
        };
        let value: f64 = value
            .parse()
            .with_context(|| format!("GET /metrics: not a number: {line}"))?;
        samples.insert(series.to_owned(), value);
    }
    Ok(Samples(samples))
}

/// `kube_object_lock_admission_requests_total{operation="OP",decision="D"}`.
pub fn requests(operation: &str, decision: &str) -> String {
    format!(
        "kube_object_lock_admission_requests_total{{operation=\"{operation}\",decision=\"{decision}\"}}"
    )
}

pub fn run(ctx: &Ctx) -> Result<()> {
    if ctx.env.cfg.mode != WebhookMode::Own {
        return skip("KOL_E2E_WEBHOOK=external: the webhook's metrics listener is not the suite's");
    }
    let ns = ctx.namespace("")?;
    let n = ns.as_str();
    let rest = ctx.rest();
    ctx.configmap(n, "held", json!({}))?;
    ctx.configmap(n, "warned", json!({}))?;
    ctx.lock(n, "held", json!({"reason": "counted"}))?;
    ctx.lock(n, "warned", json!({"mode": "Warn"}))?;
    let held = format!("/api/v1/namespaces/{n}/configmaps/held");
    let warned = format!("/api/v1/namespaces/{n}/configmaps/warned");
    ctx.update_enforced(&held)?;
    let start = Instant::now();
    while rest.probe_update(&warned)?.warnings.is_empty() {
        ensure!(
            start.elapsed() < Duration::from_secs(30),
            "the Warn lock on `warned` never warned"
        );
        std::thread::sleep(Duration::from_millis(20));
    }

    let before = scrape(METRICS_PORT)?;
    for _ in 0..EACH {
        rest.probe_update(&held)?
            .refused("dry-run update of a locked ConfigMap", "is locked by Lock")?;
        rest.probe_delete(&held)?
            .refused("dry-run delete of a locked ConfigMap", "is locked by Lock")?;
        let reply = rest.probe_update(&warned)?;
        reply.allowed("dry-run update under a Warn lock")?;
        ensure!(
            !reply.warnings.is_empty(),
            "a dry-run update under a Warn lock came back without a warning"
        );
    }
    // Not an AdmissionReview, straight to the webhook: nothing else in the run sends those.
    let invalid = if exec(Path::new("curl"), &["--version"], None, None).ok() {
        for _ in 0..EACH {
            let (code, text) = curl(
                &ctx.env.files,
                "/validate",
                Some("{\"kind\":\"AdmissionReview\"}"),
            )?;
            ensure!(
                code == 400,
                "a review without a request: HTTP {code} {} (expected 400)",
                text.trim()
            );
        }
        EACH
    } else {
        ctx.note("no curl: the invalid-request counter is left out");
        0
    };
    let after = scrape(METRICS_PORT)?;

    let delta = |series: &str| after.get(series) - before.get(series);
    let mut failures = Vec::new();
    for (series, caused) in [
        (requests("UPDATE", "denied"), EACH),
        (requests("DELETE", "denied"), EACH),
        (requests("UPDATE", "warned"), EACH),
    ] {
        let moved = delta(&series);
        if moved < caused as f64 {
            failures.push(format!("{series} moved by {moved}, less than {caused}"));
        }
    }
    let total = 3 * EACH;
    let count = "kube_object_lock_admission_duration_seconds_count";
    if delta(count) < total as f64 {
        failures.push(format!(
            "{count} moved by {}, less than {total}",
            delta(count)
        ));
    }
    if invalid > 0 {
        let series = "kube_object_lock_invalid_requests_total";
        let moved = delta(series);
        if moved != invalid as f64 {
            failures.push(format!("{series} moved by {moved}, not exactly {invalid}"));
        }
    }
    ensure!(failures.is_empty(), "{}", failures.join("; "));
    ctx.note(format!(
        "deltas: UPDATE denied {}, DELETE denied {}, UPDATE warned {}, invalid {}",
        delta(&requests("UPDATE", "denied")),
        delta(&requests("DELETE", "denied")),
        delta(&requests("UPDATE", "warned")),
        delta("kube_object_lock_invalid_requests_total")
    ));
    Ok(())
}
