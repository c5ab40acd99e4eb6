//! Who may lock and who may unlock, checked by the API server's own lock policy (the
//! ValidatingAdmissionPolicy of `manifests cluster`) for least-privileged users with client
//! certificates: nobody locks what they may not change themselves, and a held lock is lifted only
//! by its holder, by whoever is granted the `unlock` verb, and by the controllers that clean up;
//! changing an unheld lock's spec, owners or finalizers needs the right to delete it.
//! The policy runs in the API server: every check but the first lock holds with the webhook
//! stopped.

use anyhow::{Result, ensure};
use serde_json::json;

use crate::kubectl::Out;
use crate::suite::{Ctx, skip};
use crate::users::{User, bind, user};

/// Locks and ClusterLocks (their status and collections too), nothing else.
const LOCK_RIGHTS: &str = "rules:\n- apiGroups: [objectlock.dev]\n  resources: [locks, clusterlocks, locks/status]\n  verbs: [get, list, watch, create, update, patch, delete, deletecollection]\n";
/// Locks and ClusterLocks, all but `delete`.
const LOCK_RIGHTS_NO_DELETE: &str = "rules:\n- apiGroups: [objectlock.dev]\n  resources: [locks, clusterlocks]\n  verbs: [get, list, watch, create, update, patch]\n";

pub fn run(ctx: &Ctx) -> Result<()> {
    if !ctx.env.kcm {
        return skip("needs kube-controller-manager to sign the users' client certificates");
    }
    let ns = ctx.namespace("")?;
    let role = ctx.cluster_name("lock-rights");
    let label = format!("{}={}", crate::suite::RUN_LABEL, ctx.env.run);
    let no_delete = ctx.cluster_name("lock-no-delete");
    for (name, rules) in [(&role, LOCK_RIGHTS), (&no_delete, LOCK_RIGHTS_NO_DELETE)] {
        ctx.k_in(&["apply", "-f", "-"], &format!(
            "apiVersion: rbac.authorization.k8s.io/v1\nkind: ClusterRole\nmetadata:\n  name: {name}\n  labels: {{{}}}\n{rules}",
            label.replacen('=', ": ", 1)
        ))
        .check()?;
    }
    // bot: Lock rights only. alice, bob: editors with Lock rights. carol: the unlock role only.
    let bot = user(ctx, "bot", &[])?;
    bind(ctx, &bot, &role, Some(&ns))?;
    bind(ctx, &bot, &role, None)?;
    let alice = user(ctx, "alice", &["editors"])?;
    let bob = user(ctx, "bob", &["editors"])?;
    for editor in [&alice, &bob] {
        bind(ctx, editor, "edit", Some(&ns))?;
        bind(ctx, editor, &role, Some(&ns))?;
    }
    let carol = user(ctx, "carol", &[])?;
    bind(ctx, &carol, "kube-object-lock-unlock", Some(&ns))?;
    // dave: an editor who may change Locks but not delete them.
    let dave = user(ctx, "dave", &[])?;
    bind(ctx, &dave, "edit", Some(&ns))?;
    bind(ctx, &dave, &no_delete, Some(&ns))?;

    ctx.configmap(&ns, "db-config", json!({}))?;
    ctx.configmap(&ns, "app-config", json!({}))?;
    ctx.configmap(&ns, "frozen", json!({}))?;
    // An unheld lock, taken by an administrator.
    ctx.lock(
        &ns,
        "frozen",
        json!({"resources": [{"apiGroups": [""], "resources": ["configmaps"]}]}),
    )?;
    // An editor locks her own ConfigMap with kubectl lock, and it holds (the webhook confirms it,
    // within the suite's bound: this scenario starts as the parallel ones' namespaces go).
    let within = format!("{}s", crate::suite::ENFORCE_WITHIN.as_secs());
    alice
        .k(&[
            "lock",
            "configmap/db-config",
            "-n",
            &ns,
            "--reason",
            "backup",
            "--timeout",
            &within,
        ])
        .check()?;
    let lock = ctx
        .k(&["get", "lock", "db-config", "-n", &ns, "-o", "json"])
        .check()?;
    let lock: serde_json::Value = serde_json::from_str(&lock.stdout)?;
    ensure!(
        lock["spec"]["holder"] == json!({"user": alice.name}),
        "holder: {}",
        lock["spec"]["holder"]
    );
    ensure!(
        lock["status"]["enforcedCount"].as_u64() >= Some(1),
        "the webhook did not write the lock's status: {}",
        lock["status"]
    );
    let list = alice.k(&["lock", "list", "-n", &ns]).check()?;
    ensure!(
        list.stdout.contains(&alice.name),
        "no holder in: {}",
        list.stdout
    );
    ctx.k(&["label", "configmap", "db-config", "-n", &ns, "checked=yes"])
        .refused("is locked by Lock")?;

    ctx.with_webhook_stopped(|| {
        policy_checks(&ns, &bot, &alice, &bob, &carol)?;
        changing_is_unlocking(&ns, &bob, &dave)?;
        cleanup_controllers(ctx, &ns, &role, &alice)
    })?;

    // The holder lifts her own lock.
    alice
        .k(&["unlock", "configmap/db-config", "-n", &ns])
        .check()?;
    ctx.unlock(&ns, "frozen")
}

/// Everything the API server decides on its own, with no webhook instance running.
fn policy_checks(ns: &str, bot: &User, alice: &User, bob: &User, carol: &User) -> Result<()> {
    let lock = |name: &str, spec: serde_json::Value| {
        json!({"apiVersion": "objectlock.dev/v1alpha1", "kind": "Lock",
               "metadata": {"name": name, "namespace": ns}, "spec": spec})
        .to_string()
    };
    let configmaps = json!([{"apiGroups": [""], "resources": ["configmaps"]}]);

    // Lock rights alone do not let anyone lock: bot may not change the ConfigMap itself.
    bot.k_in(&["create", "-f", "-"], &lock("app-config", json!({"resources": configmaps})))
        .refused(&format!(
            "user \"{}\" may not update configmaps \"app-config\" in namespace \"{ns}\", so may not lock it",
            bot.name
        ))?;
    // A lock without spec.resources needs every resource: an editor cannot create one.
    alice
        .k_in(&["create", "-f", "-"], &lock("app-config", json!({})))
        .refused("(a lock without spec.resources covers every resource: name the resource, as kubectl lock does)")?;
    // Nor a lock in someone else's name.
    alice
        .k_in(
            &["create", "-f", "-"],
            &lock(
                "app-config",
                json!({"resources": configmaps, "holder": {"user": bob.name}}),
            ),
        )
        .refused(&format!("spec.holder names user \"{}\"", bob.name))?;
    // A ClusterLock on a Namespace needs the right to change and delete that Namespace.
    failed_with(
        &bot.k(&[
            "lock",
            "namespace",
            ns,
            "--no-holder",
            "--allow-missing",
            "--wait=false",
        ]),
        &format!(
            "user \"{}\" may not update namespaces \"{ns}\", so may not lock it",
            bot.name
        ),
    )?;

    // Widening is checked like a create: DELETE-only on a pod is within an editor's rights, UPDATE
    // also takes away kubectl debug (pods/ephemeralcontainers), which `edit` does not grant.
    let pods = json!([{"apiGroups": [""], "resources": ["pods"]}]);
    alice
        .k_in(
            &["create", "-f", "-"],
            &lock(
                "worker",
                json!({"resources": pods, "operations": ["DELETE"]}),
            ),
        )
        .check()?;
    alice
        .patch_lock(
            ns,
            "worker",
            json!({"spec": {"operations": ["UPDATE", "DELETE"]}}),
        )
        .refused(&format!(
            "user \"{}\" may not update pods/ephemeralcontainers \"worker\"",
            alice.name
        ))?;
    let more = json!({"spec": {"resources": [
        {"apiGroups": [""], "resources": ["pods"]},
        {"apiGroups": ["rbac.authorization.k8s.io"], "resources": ["roles"]}]}});
    alice
        .patch_lock(ns, "worker", more)
        .refused("may not delete roles.rbac.authorization.k8s.io \"worker\"")?;

    // CREATE takes away `create` of the name, CONNECT `create` on the pod's exec, attach,
    // port-forward and proxy: the editor has them (dry run), bot has neither.
    bot.k_in(
        &["create", "-f", "-"],
        &lock(
            "app-config",
            json!({"resources": configmaps, "operations": ["CREATE"]}),
        ),
    )
    .refused(&format!(
        "user \"{}\" may not create configmaps \"app-config\" in namespace \"{ns}\"",
        bot.name
    ))?;
    bot.k_in(
        &["create", "-f", "-"],
        &lock(
            "worker",
            json!({"resources": pods, "operations": ["CONNECT"]}),
        ),
    )
    .refused(&format!(
        "user \"{}\" may not create pods/exec \"worker\" in namespace \"{ns}\"",
        bot.name
    ))?;
    alice
        .k_in(
            &["create", "--dry-run=server", "-f", "-"],
            &lock(
                "guarded",
                json!({"resources": pods, "operations": ["CREATE", "CONNECT"]}),
            ),
        )
        .check()?;

    // An eviction is authorized as `create` on pods/eviction: a DELETE lock naming it needs that
    // (which `edit` grants), not `delete`.
    let evictions = json!({"resources": [{"apiGroups": [""], "resources": ["pods/eviction"]}],
                           "operations": ["DELETE"]});
    bot.k_in(&["create", "-f", "-"], &lock("drained", evictions.clone()))
        .refused(&format!(
            "user \"{}\" may not create pods/eviction \"drained\" in namespace \"{ns}\"",
            bot.name
        ))?;
    alice
        .k_in(
            &["create", "--dry-run=server", "-f", "-"],
            &lock("drained", evictions),
        )
        .check()?;

    // A held lock: another editor may neither lift nor loosen it...
    let held = format!("is held by user \"{}\"", alice.name);
    failed_with(&bob.k(&["unlock", "configmap/db-config", "-n", ns]), &held)?;
    bob.k(&["delete", "lock", "db-config", "-n", ns])
        .refused(&held)?;
    bob.patch_lock(ns, "db-config", json!({"spec": {"operations": ["DELETE"]}}))
        .refused(&held)?;
    // ...nor hand it to an owner about to go (the garbage collector would lift it).
    let owner = json!({"metadata": {"ownerReferences": [{"apiVersion": "v1", "kind": "ConfigMap",
        "name": "app-config", "uid": "00000000-0000-0000-0000-000000000000"}]}});
    bob.patch_lock(ns, "db-config", owner).refused(&held)?;
    // ...nor add a finalizer (the holder's delete would leave it Terminating, still enforced).
    bob.patch_lock(ns, "db-config", finalizer())
        .refused(&format!("{held}: only its holder"))?;
    held_lock_routes(ns, alice, bob, &held)?;
    // Unheld locks are anyone's with the right to delete Locks.
    bob.k(&["delete", "lock", "worker", "-n", ns]).check()?;
    // The holder changes her own lock; someone granted `unlock` may lift it (dry run: she keeps it).
    alice
        .patch_lock(
            ns,
            "db-config",
            json!({"spec": {"reason": "backup, then restore"}}),
        )
        .check()?;
    carol
        .k(&["delete", "lock", "db-config", "-n", ns, "--dry-run=server"])
        .check()?;
    Ok(())
}

/// The other routes to lift a held lock, each refused or without effect: removing `holder`,
/// a server-side apply with force, `replace --force` (a delete, then a create), a collection
/// delete, and a status write carrying a spec.
fn held_lock_routes(ns: &str, alice: &User, bob: &User, held: &str) -> Result<()> {
    bob.patch_lock(ns, "db-config", json!({"spec": {"holder": null}}))
        .refused(held)?;
    let unheld = json!({"apiVersion": "objectlock.dev/v1alpha1", "kind": "Lock",
        "metadata": {"name": "db-config", "namespace": ns},
        "spec": {"resources": [{"apiGroups": [""], "resources": ["configmaps"]}],
                 "operations": ["DELETE"]}})
    .to_string();
    bob.k_in(
        &[
            "apply",
            "--server-side",
            "--force-conflicts",
            "--field-manager=bob",
            "-f",
            "-",
        ],
        &unheld,
    )
    .refused(held)?;
    failed_with(&bob.k_in(&["replace", "--force", "-f", "-"], &unheld), held)?;
    let collection = format!("/apis/objectlock.dev/v1alpha1/namespaces/{ns}/locks?dryRun=All");
    failed_with(&bob.k(&["delete", "--raw", &collection]), held)?;
    // The status endpoint keeps the spec: a write through it changes the status at most.
    let _ = bob.k(&[
        "patch",
        "lock",
        "db-config",
        "-n",
        ns,
        "--subresource=status",
        "--type=merge",
        "-p",
        r#"{"spec": {"holder": null, "operations": ["DELETE"]}}"#,
    ]);
    let lock = bob
        .k(&["get", "lock", "db-config", "-n", ns, "-o", "json"])
        .check()?;
    let lock: serde_json::Value = serde_json::from_str(&lock.stdout)?;
    ensure!(
        lock["spec"]["holder"] == json!({"user": alice.name})
            && lock["spec"]["operations"].is_null(),
        "routes around the holder changed the held lock: {}",
        lock["spec"]
    );
    Ok(())
}

/// A finalizer, as a merge patch.
fn finalizer() -> serde_json::Value {
    json!({"metadata": {"finalizers": ["example.com/keep"]}})
}

/// Changing an unheld lock's spec, owners or finalizers lifts it as a delete would: it needs the
/// right to delete it. dave may patch Locks, not delete them; bob may both.
fn changing_is_unlocking(ns: &str, bob: &User, dave: &User) -> Result<()> {
    let refused = format!(
        "Lock {ns}/frozen: changing its spec, owners or finalizers can lift it, so it needs the right to delete it; user \"{}\" may not delete locks.objectlock.dev \"frozen\" in namespace \"{ns}\"",
        dave.name
    );
    let absent_owner = json!({"metadata": {"ownerReferences": [{"apiVersion": "v1",
        "kind": "ConfigMap", "name": "gone", "uid": "00000000-0000-0000-0000-000000000000"}]}});
    // Narrower: it no longer covers the ConfigMap's UPDATE (dave may delete ConfigMaps).
    let narrower = json!({"spec": {"operations": ["DELETE"]}});
    for patch in [&absent_owner, &narrower, &finalizer()] {
        dave.patch_lock(ns, "frozen", patch.clone())
            .refused(&refused)?;
    }
    // Other metadata is not restricted.
    dave.patch_lock(
        ns,
        "frozen",
        json!({"metadata": {"labels": {"team": "storage"}}}),
    )
    .check()?;
    // Whoever may delete the lock may change it (dry runs: it stays).
    for patch in [&absent_owner, &narrower, &finalizer()] {
        bob.k(&[
            "patch",
            "lock",
            "frozen",
            "-n",
            ns,
            "--type=merge",
            "--dry-run=server",
            "-p",
            &patch.to_string(),
        ])
        .check()?;
    }
    Ok(())
}

/// The controllers that clean up after deleted objects may delete held locks, as the identities
/// they have on a kubeadm cluster (per-controller ServiceAccounts, bound by the API server's
/// bootstrap roles); the suite impersonates them (dry runs: the lock stays).
fn cleanup_controllers(ctx: &Ctx, ns: &str, role: &str, holder: &User) -> Result<()> {
    let held = format!("is held by user \"{}\"", holder.name);
    let delete_as = |account: &str| {
        let account = format!("--as=system:serviceaccount:{account}");
        ctx.k(&[
            "delete",
            "lock",
            "db-config",
            "-n",
            ns,
            "--dry-run=server",
            &account,
        ])
    };
    for controller in ["generic-garbage-collector", "namespace-controller"] {
        delete_as(&format!("kube-system:{controller}")).check()?;
    }
    // Another controller, given the right to delete Locks, is held back like anyone.
    let other = "kube-system:resourcequota-controller";
    let binding = format!("{}-other-controller", holder.name);
    let create = [
        "create",
        "rolebinding",
        &binding,
        "-n",
        ns,
        "--clusterrole",
        role,
    ];
    let mut args = create.to_vec();
    args.extend(["--serviceaccount", other]);
    ctx.k(&args).check()?;
    let account = format!("--as=system:serviceaccount:{other}");
    crate::users::granted(
        &binding,
        Some(ns),
        "delete",
        "locks.objectlock.dev",
        |args| {
            let mut args = args.to_vec();
            args.push(&account);
            ctx.k(&args)
        },
    )?;
    delete_as(other).refused(&held)
}

/// The command failed with `text` in its error.
fn failed_with(out: &Out, text: &str) -> Result<()> {
    ensure!(
        !out.ok() && out.stderr.contains(text),
        "`{}`: expected a failure with: {text}\n    got ({:?}): {}{}",
        out.cmd,
        out.code(),
        out.stderr.trim(),
        out.stdout.trim()
    );
    Ok(())
}
