//! The API server goes silent (its process stopped with SIGSTOP: connections stay open, its
//! kernel still acknowledges, nothing errors and nothing ends). Within the bound the webhook
//! stops answering from its lock index: a write in a namespace without Locks is refused with the
//! lookup error (`on_lookup_error=deny`), not allowed. After SIGCONT its index is live again and
//! a Lock created then is enforced within the bound.
//!
//! While the API server is stopped nothing can reach it, kubectl included, so the webhook is
//! asked directly: an AdmissionReview (a captured fixture moved into this scenario's namespace)
//! posted with curl to the suite's webhook, and its `/readyz`. The API server is continued on
//! every path, failures and panics included.

use std::path::Path;
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail, ensure};
use serde_json::{Value, json};

use crate::harness::Harness;
use crate::kubectl::run as exec;
use crate::suite::{Ctx, locked, skip};
use crate::webhook::{URL, curl};

/// The bound: from the API server's stop to the last write allowed from the index, and
/// from a Lock's acknowledged creation to the last write of its object allowed.
const BOUND: Duration = Duration::from_secs(2);
/// The longest the API server is kept stopped, whatever happens.
const STOPPED_AT_MOST: Duration = Duration::from_secs(20);
/// How long recovery may take before the scenario gives up (generous: the machine is shared).
const RECOVER_WITHIN: Duration = Duration::from_secs(30);

pub fn run(ctx: &Ctx) -> Result<()> {
    ctx.env.needs_local()?;
    let Some(harness) = &ctx.env.cfg.harness else {
        return skip("not the local control plane");
    };
    if !exec(Path::new("curl"), &["--version"], None, None).ok() {
        return skip(
            "no curl: the webhook cannot be asked directly while the API server is stopped",
        );
    }
    let ns = ctx.namespace("")?;
    ctx.configmap(&ns, "after", json!({}))?;
    // The fixture's namespace replaced with this one, which has no Locks: the index answers.
    let mut review: Value = serde_json::from_slice(&std::fs::read(
        Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/configmap-delete-unlocked.json"),
    )?)
    .context("the fixture's JSON")?;
    review["request"]["namespace"] = json!(ns);
    review["request"]["oldObject"]["metadata"]["namespace"] = json!(ns);
    let review = review.to_string();

    // Before: live, and the write allowed.
    let start = Instant::now();
    loop {
        let ready = get(ctx, "/readyz")?;
        let answer = post(ctx, &review)?;
        if ready.0 == 200 && answer["allowed"] == true {
            break;
        }
        ensure!(
            start.elapsed() < RECOVER_WITHIN,
            "before the stop, the webhook is not ready or refuses a write in a namespace without Locks: /readyz {} {}; {answer}",
            ready.0,
            ready.1.trim()
        );
        std::thread::sleep(Duration::from_millis(100));
    }

    let stopped = Stopped::stop(harness)?;
    let during = while_stopped(ctx, &review, stopped.at);
    let continued = stopped.resume();
    let during = during?;
    continued?;
    let after = after_continue(ctx, &ns, &review)?;
    ctx.figure(format!("{during}; {after}"));
    Ok(())
}

/// Asks the webhook until a write in the namespace without Locks is refused with the lookup
/// error; none may be allowed later than [`BOUND`] after the stop. Returns the figures.
fn while_stopped(ctx: &Ctx, review: &str, at: Instant) -> Result<String> {
    let (mut allowed, mut late) = (0, 0);
    let refused = loop {
        let sent = at.elapsed();
        let answer = post(ctx, review)?;
        if answer["allowed"] == true {
            allowed += 1;
            if sent > BOUND {
                late += 1;
            }
        } else {
            let message = answer["status"]["message"].as_str().unwrap_or_default();
            ensure!(
                answer["status"]["code"] == 503
                    && message.contains("the lock state could not be read")
                    && message.contains("on_lookup_error=deny"),
                "with the API server stopped, refused otherwise than with the lookup error: {answer}"
            );
            break sent;
        }
        ensure!(
            at.elapsed() < STOPPED_AT_MOST,
            "{:?} after the API server was stopped, a write in a namespace without Locks is still allowed from the index",
            at.elapsed()
        );
        std::thread::sleep(Duration::from_millis(50));
    };
    ensure!(
        late == 0,
        "{late} writes allowed from the index more than {BOUND:?} after the API server was stopped ({allowed} in all)"
    );
    let (code, body) = get(ctx, "/readyz")?;
    ensure!(
        code == 503 && body.contains("liveness probe"),
        "/readyz with the API server stopped: {code} {}",
        body.trim()
    );
    Ok(format!(
        "API server stopped: {allowed} writes allowed from the index, then the lookup error for a write sent {:.0} ms after the stop",
        refused.as_secs_f64() * 1000.0
    ))
}

/// After SIGCONT: a Lock created at once is enforced within [`BOUND`], and the index is live
/// again (`/readyz` ok, the write in the namespace without that object's Lock allowed).
fn after_continue(ctx: &Ctx, ns: &str, review: &str) -> Result<String> {
    let continued = Instant::now();
    let rest = ctx.rest();
    let reason = "created after SIGCONT";
    let lock = json!({"apiVersion": "objectlock.dev/v1alpha1", "kind": "Lock",
        "metadata": {"name": "after"}, "spec": {"reason": reason}});
    // The first requests may fail while the API server catches up; a 409 is a create whose
    // answer was lost.
    let acked = loop {
        match rest.post(
            &format!("/apis/objectlock.dev/v1alpha1/namespaces/{ns}/locks"),
            &lock,
        ) {
            Ok(reply) if reply.ok() || reply.code == 409 => break Instant::now(),
            Ok(reply) if continued.elapsed() > RECOVER_WITHIN => {
                bail!(
                    "the Lock cannot be created after SIGCONT: {} {}",
                    reply.code,
                    reply.message()
                )
            }
            Err(e) if continued.elapsed() > RECOVER_WITHIN => {
                return Err(e.context("the Lock cannot be created after SIGCONT"));
            }
            _ => std::thread::sleep(Duration::from_millis(100)),
        }
    };
    let path = format!("/api/v1/namespaces/{ns}/configmaps/after");
    let (mut allowed, mut late) = (0, 0);
    let enforced = loop {
        match rest.probe_update(&path) {
            Ok(reply) if reply.code == 403 => {
                reply.refused(
                    "update of a locked ConfigMap",
                    &locked("configmaps", ns, "after", Some(reason)),
                )?;
                break acked.elapsed();
            }
            Ok(reply) if reply.ok() => {
                allowed += 1;
                if acked.elapsed() > BOUND {
                    late += 1;
                }
            }
            _ => {}
        }
        ensure!(
            acked.elapsed() < RECOVER_WITHIN,
            "a Lock created after SIGCONT is not enforced after {RECOVER_WITHIN:?}"
        );
        std::thread::sleep(Duration::from_millis(10));
    };
    ensure!(
        late == 0,
        "{late} writes allowed more than {BOUND:?} after a Lock created after SIGCONT"
    );
    let live = loop {
        let ready = get(ctx, "/readyz")?;
        let answer = post(ctx, review)?;
        if ready.0 == 200 && answer["allowed"] == true {
            break continued.elapsed();
        }
        ensure!(
            continued.elapsed() < RECOVER_WITHIN,
            "after SIGCONT, the webhook is not live again: /readyz {} {}; {answer}",
            ready.0,
            ready.1.trim()
        );
        std::thread::sleep(Duration::from_millis(50));
    };
    Ok(format!(
        "after SIGCONT: a new Lock enforced {:.0} ms after its creation ({allowed} writes allowed), the index live within {:.1}s",
        enforced.as_secs_f64() * 1000.0,
        live.as_secs_f64()
    ))
}

/// The API server's process, stopped; continued when dropped, whatever happened.
struct Stopped {
    pid: rustix::process::Pid,
    at: Instant,
    continued: bool,
}

impl Stopped {
    fn stop(harness: &Harness) -> Result<Stopped> {
        let raw = harness.apiserver_pid()?;
        let pid = rustix::process::Pid::from_raw(raw).context("the API server's pid")?;
        rustix::process::kill_process(pid, rustix::process::Signal::STOP)
            .with_context(|| format!("SIGSTOP to the API server (pid {raw})"))?;
        Ok(Stopped {
            pid,
            at: Instant::now(),
            continued: false,
        })
    }

    fn resume(mut self) -> Result<()> {
        self.continued = true;
        rustix::process::kill_process(self.pid, rustix::process::Signal::CONT)
            .context("SIGCONT to the API server")?;
        Ok(())
    }
}

impl Drop for Stopped {
    fn drop(&mut self) {
        if !self.continued {
            let _ = rustix::process::kill_process(self.pid, rustix::process::Signal::CONT);
        }
    }
}

fn get(ctx: &Ctx, path: &str) -> Result<(u16, String)> {
    curl(&ctx.env.files, path, None)
}

/// The `response` of the AdmissionReview `review` posted to the webhook.
fn post(ctx: &Ctx, review: &str) -> Result<Value> {
    let (code, text) = curl(&ctx.env.files, "/validate", Some(review))?;
    ensure!(code == 200, "{URL}: {code} {}", text.trim());
    let reply: Value = serde_json::from_str(&text).with_context(|| format!("{URL}: {text}"))?;
    Ok(reply["response"].clone())
}
