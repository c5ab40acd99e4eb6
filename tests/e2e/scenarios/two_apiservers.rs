//! Two control-plane nodes, as the README's HA install has them: a second kube-apiserver on the
//! same etcd, in a network namespace of its own, calls its own webhook instance at the same URL
//! (`https://127.0.0.1:18443/validate`, the one registration's), which reads Locks from that API
//! server and runs under an `instance.name` of its own. A Lock created through either API server
//! is refused through the other within the usual bound; both instances name themselves in its
//! `status.enforcedBy`. With the second instance stopped (SIGTERM), its entry leaves the
//! status, and through its API server unlocked writes still pass (the narrowed registration
//! does not send them) while locked ones are refused (`failurePolicy: Fail`); the first node is
//! unaffected, and a Lock created meanwhile holds on both nodes.

use std::time::{Duration, Instant};

use anyhow::{Context, Result, ensure};
use serde_json::json;

use crate::node::{self, Node};
use crate::rest::{Reply, Rest, until_refused};
use crate::scenarios::sigterm::{instances, instances_of, poll};
use crate::suite::{Ctx, ENFORCE_WITHIN, NAMESPACED_DENIAL, locked, skip_unless_required};
use crate::webhook::Serve;

pub fn run(ctx: &Ctx) -> Result<()> {
    let env = ctx.env;
    env.needs_local()?;
    if let Some(why) = node::unavailable() {
        return skip_unless_required(why);
    }
    let harness = env
        .cfg
        .harness
        .as_ref()
        .context("the local control plane")?;
    let ns = ctx.namespace("")?;
    let n = ns.as_str();
    for name in ["one", "two", "three", "free"] {
        ctx.configmap(n, name, json!({}))?;
    }
    let dir = env.files.dir.join("node2");
    let node = Node::start(harness, &env.kubectl, &env.run, &dir)?;
    let result = with_node(ctx, n, &node);
    let stopped = node.stop();
    result?;
    stopped
}

fn with_node(ctx: &Ctx, n: &str, node: &Node) -> Result<()> {
    let env = ctx.env;
    // The second instance: the same URL on its node's loopback, that node's API server, the
    // suite's identity, a name of its own.
    let kubeconfig = node.file("webhook-kubeconfig.json");
    node.local_kubeconfig(&env.files.kubeconfig(), &kubeconfig)?;
    let name = format!("kol-e2e-{}-node2", env.run);
    let place = node.place(kubeconfig, node.file("serve.log"));
    let serve = Serve::start_at(
        &env.cfg.server_bin,
        &env.files,
        &place,
        false,
        &[("KUBE_OBJECT_LOCK__INSTANCE__NAME", name.as_str())],
    )?;
    let two = Two {
        ctx,
        n,
        first: ctx.rest(),
        second: &node.rest,
        name: &name,
    };
    let both_running = two.both_running();
    // Stopped whatever happened: SIGTERM withdraws its entries from every Lock's status.
    serve.stop()?;
    both_running?;
    two.one_stopped()
}

/// The scenario's namespace as the two API servers serve it.
struct Two<'a> {
    ctx: &'a Ctx<'a>,
    n: &'a str,
    first: &'a Rest,
    second: &'a Rest,
    /// The second instance's name.
    name: &'a str,
}

impl Two<'_> {
    fn path(&self, cm: &str) -> String {
        format!("/api/v1/namespaces/{}/configmaps/{cm}", self.n)
    }

    fn lock_path(&self, lock: &str) -> String {
        format!(
            "/apis/objectlock.dev/v1alpha1/namespaces/{}/locks/{lock}",
            self.n
        )
    }

    /// Refused by the webhook with the message of the Lock of the same name.
    fn refused_by_lock(&self, reply: &Reply, cm: &str, through: &str) -> Result<()> {
        reply.refused(
            &format!("update of {cm} through the {through} API server"),
            &format!(
                "{NAMESPACED_DENIAL}{}",
                locked("configmaps", self.n, cm, None)
            ),
        )
    }

    fn both_running(&self) -> Result<()> {
        let (ctx, n, name) = (self.ctx, self.n, self.name);
        let (first, second) = (self.first, self.second);
        // Created through one, refused through the other (and through itself).
        ctx.lock(n, "one", json!({}))?;
        let across = until_refused(ENFORCE_WITHIN, || second.probe_update(&self.path("one")))
            .context("a Lock created through the first API server, probed through the second")?;
        self.refused_by_lock(&across.refusal, "one", "second")?;
        let itself = ctx.update_enforced(&self.path("one"))?;
        self.refused_by_lock(&itself.refusal, "one", "first")?;
        second
            .post(
                &format!("/apis/objectlock.dev/v1alpha1/namespaces/{n}/locks"),
                &json!({"apiVersion": "objectlock.dev/v1alpha1", "kind": "Lock",
                        "metadata": {"name": "two"}, "spec": {}}),
            )?
            .allowed("create a Lock through the second API server")?;
        let back = until_refused(ENFORCE_WITHIN, || first.probe_update(&self.path("two")))
            .context("a Lock created through the second API server, probed through the first")?;
        self.refused_by_lock(&back.refusal, "two", "first")?;
        // Each API server reads the registration from its own watch: the second may see the
        // new name a moment after the first.
        let itself = until_refused(ENFORCE_WITHIN, || second.probe_update(&self.path("two")))
            .context("a Lock created through the second API server, probed through it")?;
        self.refused_by_lock(&itself.refusal, "two", "second")?;
        ctx.figure(format!(
            "two API servers: a Lock created through one refused through the other after {:.0} ms (first to second) and {:.0} ms (second to first)",
            across.after.as_secs_f64() * 1000.0,
            back.after.as_secs_f64() * 1000.0
        ));

        // Each instance in the status, whichever API server it is read through, and the count
        // that each writes from the entries it sees (the same once both have seen both).
        let mut named = Vec::new();
        for (rest, lock, through) in [(first, "one", "first"), (second, "two", "second")] {
            let mut last = serde_json::Value::Null;
            named = poll(ENFORCE_WITHIN, || {
                last = rest.get(&self.lock_path(lock))?.body;
                let names = instances(&last);
                let both = names.len() == 2 && names.iter().any(|i| i == name);
                Ok((both && last["status"]["enforcedCount"] == 2).then_some(names))
            })
            .with_context(|| {
                format!(
                    "Lock {n}/{lock}, read through the {through} API server, never named two instances, {name} one of them, with enforcedCount 2: {}",
                    last["status"]
                )
            })?;
        }
        ctx.note(format!("status.enforcedBy of both Locks: {named:?}"));
        Ok(())
    }

    /// The second instance stopped: its entry goes; its node fails closed on locked objects
    /// only.
    fn one_stopped(&self) -> Result<()> {
        let (ctx, n, name) = (self.ctx, self.n, self.name);
        let (first, second) = (self.first, self.second);
        let lock = poll(ENFORCE_WITHIN, || {
            let lock = first.get(&self.lock_path("one"))?.body;
            Ok((!instances_of(&lock).iter().any(|i| i == name)).then_some(lock))
        })
        .with_context(|| format!("{name} stopped, yet it is still in Lock {n}/one's status"))?;
        // The other instance's part stays whole: its entry, the count, the condition.
        let status = &lock["status"];
        let enforcing = (status["conditions"].as_array().into_iter().flatten()).any(|c| {
            c["type"] == "Enforced" && c["status"] == "True" && c["reason"] == "Enforcing"
        });
        ensure!(
            instances(&lock).len() == 1 && status["enforcedCount"] == 1 && enforcing,
            "after {name} withdrew, Lock {n}/one should still say Enforced by the other instance: {status}"
        );
        second
            .probe_update(&self.path("free"))?
            .allowed("an unlocked update through the second API server, its webhook stopped")?;
        fails_closed(&second.probe_update(&self.path("one"))?, "one")?;
        first
            .probe_update(&self.path("free"))?
            .allowed("an unlocked update through the first API server")?;
        self.refused_by_lock(&first.probe_update(&self.path("one"))?, "one", "first")?;
        // A new Lock: the remaining instance names it in the one registration, both nodes send
        // its writes (the second to a webhook that is not there).
        ctx.lock(n, "three", json!({}))?;
        let enforced = ctx.update_enforced(&self.path("three"))?;
        self.refused_by_lock(&enforced.refusal, "three", "first")?;
        let start = Instant::now();
        loop {
            let reply = second.probe_update(&self.path("three"))?;
            if !reply.ok() {
                fails_closed(&reply, "three")?;
                break;
            }
            ensure!(
                start.elapsed() < ENFORCE_WITHIN,
                "a Lock created with the second instance stopped: its writes through the second API server still allowed after {ENFORCE_WITHIN:?}"
            );
            std::thread::sleep(Duration::from_millis(20));
        }
        ctx.note(format!(
            "{name} stopped: its status entry withdrawn; through its API server unlocked writes allowed, locked ones refused (failed calling webhook); the first node unchanged"
        ));
        Ok(())
    }
}

/// A locked write through an API server whose webhook is stopped: refused because the call
/// failed.
fn fails_closed(reply: &Reply, cm: &str) -> Result<()> {
    ensure!(
        !reply.ok() && reply.message().contains("failed calling webhook"),
        "update of locked {cm} through the second API server, its webhook stopped: {} {}",
        reply.code,
        reply.message()
    );
    Ok(())
}
