//! Lock-to-enforcement latency through the real API server: from the moment the Lock's creation
//! is acknowledged to the first refused write (server-side dry-run PATCHes back to back), and
//! the same for release. Printed, never asserted against a time.

use std::time::{Duration, Instant};

use anyhow::{Result, ensure};
use serde_json::json;

use crate::rest::until_refused;
use crate::suite::{Ctx, ENFORCE_WITHIN};

/// `p50 … max` of `samples` in milliseconds.
pub fn percentiles(samples: &mut [Duration]) -> String {
    samples.sort();
    let at = |q: f64| {
        let i = ((q * samples.len() as f64).ceil() as usize).clamp(1, samples.len()) - 1;
        samples[i].as_secs_f64() * 1000.0
    };
    format!(
        "p50 {:.1} ms, p90 {:.1} ms, p99 {:.1} ms, max {:.1} ms (n={})",
        at(0.5),
        at(0.9),
        at(0.99),
        at(1.0),
        samples.len()
    )
}

pub fn run(ctx: &Ctx) -> Result<()> {
    let ns = ctx.namespace("")?;
    let rest = ctx.rest();
    let tries = ctx.env.cfg.tries;
    let (mut enforce, mut release) = (Vec::new(), Vec::new());
    let (mut allowed_after_ack, mut allowed_after_unlock) = (0, 0);
    for i in 0..tries {
        let name = format!("l{i}");
        ctx.configmap(&ns, &name, json!({}))?;
        let path = format!("/api/v1/namespaces/{ns}/configmaps/{name}");
        ctx.lock(&ns, &name, json!({}))?;
        let e = until_refused(ENFORCE_WITHIN, || rest.probe_update(&path))?;
        enforce.push(e.after);
        allowed_after_ack += e.allowed_before;

        let lock = format!("/apis/objectlock.dev/v1alpha1/namespaces/{ns}/locks/{name}");
        rest.delete(&lock)?.allowed("delete Lock")?;
        let start = Instant::now();
        loop {
            let reply = rest.probe_update(&path)?;
            if reply.ok() {
                break;
            }
            allowed_after_unlock += 1;
            ensure!(start.elapsed() < ENFORCE_WITHIN, "{name} never released");
        }
        release.push(start.elapsed());
    }
    ctx.figure(format!(
        "lock created -> first refused write: {}; {allowed_after_ack} writes allowed after a creation was acknowledged",
        percentiles(&mut enforce)
    ));
    ctx.figure(format!(
        "lock deleted -> first allowed write: {}; {allowed_after_unlock} writes refused after a deletion was acknowledged",
        percentiles(&mut release)
    ));
    Ok(())
}
