//! Locks on fields, writes that change nothing, and status writes, on the real API server: a
//! lock refuses only a change of what it freezes, and names the field.

use std::time::{Duration, Instant};

use anyhow::{Result, ensure};
use serde_json::{Value, json};

use crate::scenarios::scale::deployment;
use crate::suite::{Ctx, ENFORCE_WITHIN, NAMESPACED_DENIAL, locked};

const REASON: &str = "VM snapshot in progress";

/// `... is locked by Lock ns/name (field changed): reason (to unlock: ...)`.
fn locked_field(resource: &str, ns: &str, name: &str, field: &str, reason: Option<&str>) -> String {
    let reason = reason.map(|r| format!(": {r}")).unwrap_or_default();
    format!(
        "{resource} \"{name}\" in namespace \"{ns}\" is locked by Lock {ns}/{name} ({field} changed){reason} (to unlock: kubectl delete lock {name} -n {ns})"
    )
}

/// Repeats the kubectl command `args` (a dry run) until it is refused with `message`: the
/// webhook enforces the new lock.
fn until_refused(ctx: &Ctx, args: &[&str], message: &str) -> Result<()> {
    ensure!(
        args.contains(&"--dry-run=server"),
        "only a dry run is repeated"
    );
    let start = Instant::now();
    loop {
        match ctx.k(args).refused(message) {
            Ok(()) => return Ok(()),
            Err(e) if start.elapsed() > ENFORCE_WITHIN => return Err(e),
            Err(_) => std::thread::sleep(Duration::from_millis(100)),
        }
    }
}

/// A Deployment locked on `spec.template` accepts `annotate`, `label` and `scale`, and refuses
/// `set image` naming the field.
pub fn deployment_template(ctx: &Ctx) -> Result<()> {
    let ns = ctx.namespace("")?;
    let n = ns.as_str();
    ctx.create(
        &format!("/apis/apps/v1/namespaces/{ns}/deployments"),
        deployment("web", json!({})),
    )?;
    // Through the plugin, which waits until the lock is in force.
    let out = ctx
        .k(&[
            "lock",
            "deployment/web",
            "-n",
            n,
            "--fields",
            "spec.template",
            "--reason",
            REASON,
        ])
        .check()?;
    ensure!(
        out.stdout.contains("fields spec.template"),
        "kubectl lock says what it froze: {}",
        out.stdout
    );
    let listed = ctx.k(&["lock", "list", "-n", n]).check()?;
    ensure!(
        listed.stdout.contains("UPDATE[spec.template],DELETE"),
        "kubectl lock list shows what is frozen: {}",
        listed.stdout
    );
    let message = locked_field("deployments.apps", n, "web", "spec.template", Some(REASON));
    let set_image = [
        "set",
        "image",
        "deployment/web",
        "-n",
        n,
        "c=registry.invalid/web:2",
    ];
    // Dry run first: the real write must not go through while the lock is not yet seen.
    let mut dry = set_image.to_vec();
    dry.push("--dry-run=server");
    until_refused(ctx, &dry, &message)?;
    ctx.k(&set_image).refused(&message)?;
    ctx.k(&[
        "annotate",
        "deployment",
        "web",
        "-n",
        n,
        "example.com/note=1",
    ])
    .allowed()?;
    ctx.k(&["label", "deployment", "web", "-n", n, "tier=web"])
        .allowed()?;
    ctx.k(&["scale", "deployment", "web", "-n", n, "--replicas=3"])
        .allowed()?;
    // `rollout restart` changes the pod template's annotations: refused.
    ctx.k(&["rollout", "restart", "deployment/web", "-n", n])
        .refused(&message)?;
    // A lock on spec.replicas refuses the scale, through the scale subresource.
    ctx.unlock(n, "web")?;
    ctx.lock(n, "web", json!({"fields": ["spec.replicas"]}))?;
    let replicas = locked_field("deployments.apps", n, "web", "spec.replicas", None);
    let scale = ["scale", "deployment", "web", "-n", n, "--replicas=4"];
    let mut dry = scale.to_vec();
    dry.push("--dry-run=server");
    until_refused(ctx, &dry, &format!("{NAMESPACED_DENIAL}{replicas}"))?;
    ctx.k(&scale).refused(&replicas)?;
    ctx.k(&set_image).allowed()?;
    Ok(())
}

/// A custom resource shaped like a virtual machine, locked on its volumes: it may be started,
/// stopped and scaled, its volumes may not change. Its scale writes `spec.size` (the CRD's
/// specReplicasPath): a lock on that field refuses a scale, naming it.
pub fn virtual_machine(ctx: &Ctx) -> Result<()> {
    let ns = ctx.namespace("")?;
    let n = ns.as_str();
    let group = format!("{}.example.com", ctx.cluster_name("vm"));
    let crd = format!("virtualmachines.{group}");
    let rest = ctx.rest();
    let result = (|| {
        ctx.create(
            "/apis/apiextensions.k8s.io/v1/customresourcedefinitions",
            json!({
                "apiVersion": "apiextensions.k8s.io/v1", "kind": "CustomResourceDefinition",
                "metadata": {"name": crd},
                "spec": {
                    "group": group, "scope": "Namespaced",
                    "names": {"plural": "virtualmachines", "singular": "virtualmachine",
                              "kind": "VirtualMachine"},
                    "versions": [{"name": "v1", "served": true, "storage": true,
                        "subresources": {"scale": {"specReplicasPath": ".spec.size",
                                                   "statusReplicasPath": ".status.size"}},
                        "schema": {"openAPIV3Schema": {"type": "object",
                            "x-kubernetes-preserve-unknown-fields": true}}}]
                }
            }),
        )?;
        let collection = format!("/apis/{group}/v1/namespaces/{ns}/virtualmachines");
        let vm = json!({
            "apiVersion": format!("{group}/v1"), "kind": "VirtualMachine",
            "metadata": {"name": "vm1"},
            "spec": {"running": false, "size": 1, "template": {"spec": {
                "domain": {"cpu": {"cores": 1}},
                "volumes": [{"name": "root", "persistentVolumeClaim": {"claimName": "root"}}]
            }}}
        });
        // The CRD is served once established.
        let start = Instant::now();
        while !rest.post(&collection, &vm)?.ok() {
            ensure!(
                start.elapsed() < ENFORCE_WITHIN,
                "the VirtualMachine CRD is not served"
            );
            std::thread::sleep(Duration::from_millis(200));
        }
        ctx.lock(
            n,
            "vm1",
            json!({"fields": ["spec.template.spec.volumes"], "reason": REASON}),
        )?;
        let path = format!("{collection}/vm1");
        let resource = format!("virtualmachines.{group}");
        let message = locked_field(
            &resource,
            n,
            "vm1",
            "spec.template.spec.volumes",
            Some(REASON),
        );
        let volumes = json!({"spec": {"template": {"spec": {"volumes": [
            {"name": "root", "persistentVolumeClaim": {"claimName": "other"}}]}}}});
        let start = Instant::now();
        loop {
            let reply = rest.merge_patch(&format!("{path}?dryRun=All"), &volumes)?;
            if reply.code == 403 {
                reply.refused("dry-run volume change", &message)?;
                break;
            }
            ensure!(
                start.elapsed() < ENFORCE_WITHIN,
                "volume change allowed after {ENFORCE_WITHIN:?}"
            );
            std::thread::sleep(Duration::from_millis(100));
        }
        rest.merge_patch(&path, &volumes)?
            .refused("volume change", &message)?;
        for running in [true, false] {
            rest.merge_patch(&path, &json!({"spec": {"running": running}}))?
                .allowed(&format!("running: {running}"))?;
        }
        rest.merge_patch(
            &path,
            &json!({"spec": {"template": {"spec": {"domain": {"cpu": {"cores": 2}}}}}}),
        )?
        .allowed("a cpu change")?;
        // Removing the volumes is a change too.
        rest.merge_patch(
            &path,
            &json!({"spec": {"template": {"spec": {"volumes": null}}}}),
        )?
        .refused("volume removal", &message)?;
        // The scale writes spec.size, which this lock leaves free.
        rest.merge_patch(&format!("{path}/scale"), &json!({"spec": {"replicas": 2}}))?
            .allowed("a scale")?;
        // A lock on spec.size refuses it, naming the field.
        let mut vm2 = vm.clone();
        vm2["metadata"]["name"] = json!("vm2");
        rest.post(&collection, &vm2)?.allowed("vm2")?;
        ctx.lock(n, "vm2", json!({"fields": ["spec.size"]}))?;
        let size = locked_field(&resource, n, "vm2", "spec.size", None);
        let scale2 = format!("{collection}/vm2/scale");
        let start = Instant::now();
        loop {
            let reply = rest.merge_patch(
                &format!("{scale2}?dryRun=All"),
                &json!({"spec": {"replicas": 3}}),
            )?;
            if reply.code == 403 {
                reply.refused("dry-run scale", &size)?;
                break;
            }
            ensure!(
                start.elapsed() < ENFORCE_WITHIN,
                "a scale of vm2 allowed after {ENFORCE_WITHIN:?}"
            );
            std::thread::sleep(Duration::from_millis(100));
        }
        rest.merge_patch(&scale2, &json!({"spec": {"replicas": 3}}))?
            .refused("a scale", &size)?;
        rest.merge_patch(
            &format!("{collection}/vm2"),
            &json!({"spec": {"running": true}}),
        )?
        .allowed("vm2 running")?;
        Ok(())
    })();
    rest.delete(&format!(
        "/apis/apiextensions.k8s.io/v1/customresourcedefinitions/{crd}"
    ))
    .ok();
    result
}

/// A whole-object lock allows an identical `kubectl apply` and a server-side dry-run apply
/// with no changes, and refuses one with a change.
pub fn unchanged_writes(ctx: &Ctx) -> Result<()> {
    let ns = ctx.namespace("")?;
    let n = ns.as_str();
    let yaml = |name: &str, value: &str| {
        format!(
            "apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: {name}\n  namespace: {ns}\ndata:\n  key: {value}\n"
        )
    };
    let server_side = |extra: &[&'static str]| {
        let mut args = vec![
            "apply",
            "--server-side",
            "--force-conflicts",
            "--field-manager=gitops",
            "-f",
            "-",
        ];
        args.extend_from_slice(extra);
        args
    };
    // One object applied server-side (as a GitOps tool does), one client-side.
    ctx.k_in(&server_side(&[]), &yaml("app", "one")).check()?;
    ctx.k_in(&["apply", "-f", "-"], &yaml("csa", "one"))
        .check()?;
    ctx.lock(n, "app", json!({"reason": REASON}))?;
    ctx.lock(n, "csa", json!({"reason": REASON}))?;
    ctx.update_enforced(&format!("/api/v1/namespaces/{ns}/configmaps/app"))?;
    ctx.update_enforced(&format!("/api/v1/namespaces/{ns}/configmaps/csa"))?;
    let message = locked("configmaps", n, "app", Some(REASON));
    // The drift check (a dry run) and the apply itself, with nothing changed: allowed.
    for extra in [&["--dry-run=server"][..], &[][..]] {
        ctx.k_in(&server_side(extra), &yaml("app", "one"))
            .allowed()?;
        ctx.k_in(&server_side(extra), &yaml("app", "two"))
            .refused(&message)?;
    }
    // A PUT of the object as read: the same.
    let path = format!("/api/v1/namespaces/{ns}/configmaps/app");
    let current = ctx.rest().get(&path)?.body;
    ctx.rest()
        .put(&path, &current)?
        .allowed("PUT of the object as read")?;
    let csa = locked("configmaps", n, "csa", Some(REASON));
    ctx.k_in(&["apply", "-f", "-"], &yaml("csa", "one"))
        .allowed()?;
    ctx.k_in(&["apply", "-f", "-"], &yaml("csa", "two"))
        .refused(&csa)?;
    Ok(())
}

/// `exceptFields: [metadata.annotations]` lets annotations change and nothing else.
pub fn except_annotations(ctx: &Ctx) -> Result<()> {
    let ns = ctx.namespace("")?;
    let n = ns.as_str();
    ctx.configmap(n, "app", json!({}))?;
    ctx.lock(n, "app", json!({"exceptFields": ["metadata.annotations"]}))?;
    let labels = locked_field("configmaps", n, "app", "metadata.labels", None);
    until_refused(
        ctx,
        &[
            "label",
            "configmap",
            "app",
            "-n",
            n,
            "a=b",
            "--dry-run=server",
        ],
        &labels,
    )?;
    ctx.k(&["annotate", "configmap", "app", "-n", n, "example.com/a=1"])
        .allowed()?;
    ctx.k(&["label", "configmap", "app", "-n", n, "a=b"])
        .refused(&labels)?;
    let data = locked_field("configmaps", n, "app", "data", None);
    ctx.k(&[
        "patch",
        "configmap",
        "app",
        "-n",
        n,
        "--type=merge",
        "-p",
        r#"{"data":{"state":"changed"}}"#,
    ])
    .refused(&data)?;
    Ok(())
}

/// The API server refuses both fields at once, and a path that does not parse, naming it.
pub fn validation(ctx: &Ctx) -> Result<()> {
    let ns = ctx.namespace("")?;
    let n = ns.as_str();
    let rest = ctx.rest();
    let collection = format!("/apis/objectlock.dev/v1alpha1/namespaces/{ns}/locks");
    let lock = |name: &str, spec: Value| {
        json!({"apiVersion": "objectlock.dev/v1alpha1", "kind": "Lock",
               "metadata": {"name": name}, "spec": spec})
    };
    let both = rest.post(
        &collection,
        &lock(
            "both",
            json!({"fields": ["spec"], "exceptFields": ["metadata.annotations"]}),
        ),
    )?;
    ensure!(
        both.code == 422
            && both
                .message()
                .contains("give fields or exceptFields, not both"),
        "both fields: {} {}",
        both.code,
        both.message()
    );
    for (field, bad) in [
        ("fields", "spec..template"),
        ("exceptFields", "metadata.annotations[example.com/key]"),
    ] {
        let reply = rest.post(
            &collection,
            &lock("bad", json!({ field: ["spec.replicas", bad] })),
        )?;
        let expected = format!("{field}: {bad} is not a field path");
        ensure!(
            reply.code == 422 && reply.message().contains(&expected),
            "{field} {bad}: {} {}",
            reply.code,
            reply.message()
        );
    }
    // The same through a ClusterLock.
    let cluster = rest.post(
        "/apis/objectlock.dev/v1alpha1/clusterlocks",
        &json!({"apiVersion": "objectlock.dev/v1alpha1", "kind": "ClusterLock",
                "metadata": {"name": ctx.cluster_name("both")},
                "spec": {"fields": ["spec"], "exceptFields": ["status"]}}),
    )?;
    ensure!(
        cluster.code == 422 && cluster.message().contains("not both"),
        "ClusterLock with both: {} {}",
        cluster.code,
        cluster.message()
    );
    ctx.lock(
        n,
        "good",
        json!({"fields": ["spec.template", "metadata.annotations['example.com/key']"]}),
    )?;
    Ok(())
}

/// A status write of a locked pod may change its status and nothing else: labels, annotations
/// and finalizers through `pods/status` are refused like an UPDATE, and a pod cannot be
/// relabelled out of a selector lock that way.
pub fn status_write(ctx: &Ctx) -> Result<()> {
    let ns = ctx.namespace("")?;
    let n = ns.as_str();
    let pod = |name: &str, labels: Value| {
        json!({"apiVersion": "v1", "kind": "Pod",
               "metadata": {"name": name, "labels": labels},
               "spec": {"containers": [{"name": "c", "image": "registry.invalid/x:1"}]}})
    };
    let pods = format!("/api/v1/namespaces/{ns}/pods");
    ctx.create(&pods, pod("held", json!({})))?;
    ctx.create(&pods, pod("web-1", json!({"app": "web"})))?;
    ctx.lock(
        n,
        "held",
        json!({"operations": ["UPDATE"], "reason": REASON}),
    )?;
    ctx.lock(
        n,
        "web-pods",
        json!({"selector": {"matchLabels": {"app": "web"}}, "reason": "freeze"}),
    )?;
    let status_patch = |name: &str, patch: &str| {
        ctx.k(&[
            "patch",
            "pod",
            name,
            "-n",
            n,
            "--subresource=status",
            "--type=merge",
            "-p",
            patch,
        ])
    };
    let labels = locked_field("pods", n, "held", "metadata.labels", Some(REASON));
    let start = Instant::now();
    loop {
        let out = ctx.k(&[
            "patch",
            "pod",
            "held",
            "-n",
            n,
            "--subresource=status",
            "--type=merge",
            "--dry-run=server",
            "-p",
            r#"{"metadata":{"labels":{"x":"y"}}}"#,
        ]);
        if out.refused(&labels).is_ok() {
            break;
        }
        ensure!(
            start.elapsed() < ENFORCE_WITHIN,
            "a label through pods/status is not refused: {}",
            out.stderr
        );
        std::thread::sleep(Duration::from_millis(100));
    }
    status_patch("held", r#"{"metadata":{"labels":{"x":"y"}}}"#).refused(&labels)?;
    for (patch, field) in [
        (
            r#"{"metadata":{"annotations":{"x":"y"}}}"#,
            "metadata.annotations",
        ),
        (
            r#"{"metadata":{"finalizers":["example.com/hold"]}}"#,
            "metadata.finalizers",
        ),
    ] {
        status_patch("held", patch).refused(&locked_field(
            "pods",
            n,
            "held",
            field,
            Some(REASON),
        ))?;
    }
    // The status itself may change.
    let condition = r#"{"status":{"message":"reported"}}"#;
    status_patch("held", condition).allowed()?;
    // Relabelled out of the selector lock through status, then deleted: refused at the first
    // step.
    let web = format!(
        "pods \"web-1\" in namespace \"{n}\" is locked by Lock {n}/web-pods (metadata.labels changed): freeze"
    );
    status_patch("web-1", r#"{"metadata":{"labels":{"app":"gone"}}}"#).refused(&web)?;
    status_patch("web-1", condition).allowed()?;
    ensure!(
        ctx.rest().get(&format!("{pods}/web-1"))?.body["metadata"]["labels"]["app"] == "web",
        "web-1 was relabelled"
    );
    Ok(())
}
