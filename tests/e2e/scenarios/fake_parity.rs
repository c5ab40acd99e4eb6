//! The fake API server of the fast tests (`tests/support/fake_apiserver.rs`) against the real
//! one: the same requests on the lock resources to both, the answers compared field by field
//! where the project reads them (status codes, `Status` reasons, messages and details, list
//! paging, created objects' metadata, discovery). When they differ, the fake is wrong.

use std::collections::BTreeSet;

use anyhow::{Result, ensure};
use serde_json::{Value, json};

#[path = "../../support/fake_apiserver.rs"]
mod fake_apiserver;

use crate::rest::{Reply, Rest};
use crate::suite::Ctx;

/// One request to both servers.
struct Pair<'a> {
    real: &'a Rest,
    fake: &'a Rest,
    diffs: Vec<String>,
}

impl Pair<'_> {
    fn both(&self, method: &str, path: &str, body: Option<&Value>) -> Result<(Reply, Reply)> {
        Ok((
            self.real.call(method, path, "application/json", body)?,
            self.fake.call(method, path, "application/json", body)?,
        ))
    }

    /// Records a difference of `what` (a JSON pointer into the bodies, or a derived value).
    fn same(&mut self, what: &str, real: Value, fake: Value) {
        if real != fake {
            self.diffs.push(format!("{what}: real {real}, fake {fake}"));
        }
    }

    fn same_at(&mut self, request: &str, pointers: &[&str], real: &Reply, fake: &Reply) {
        self.same(
            &format!("{request}: HTTP code"),
            json!(real.code),
            json!(fake.code),
        );
        for p in pointers {
            let (r, f) = (
                real.body.pointer(p).cloned().unwrap_or(Value::Null),
                fake.body.pointer(p).cloned().unwrap_or(Value::Null),
            );
            self.same(&format!("{request}: {p}"), r, f);
        }
    }
}

const STATUS: &[&str] = &[
    "/kind",
    "/apiVersion",
    "/status",
    "/reason",
    "/message",
    "/code",
    "/details/name",
    "/details/group",
    "/details/kind",
];

fn keys(v: &Value) -> Value {
    json!(
        v.as_object()
            .map(|o| o.keys().cloned().collect::<BTreeSet<_>>())
            .unwrap_or_default()
    )
}

pub fn run(ctx: &Ctx) -> Result<()> {
    let ns = ctx.namespace("")?;
    let real = ctx.rest();
    let server = real.block_on(fake_apiserver::FakeApiServer::start());
    // kube's client spawns its buffer task: made inside the runtime.
    let fake = real.with_client(real.block_on(async { server.client() }));
    let mut pair = Pair {
        real,
        fake: &fake,
        diffs: Vec::new(),
    };
    let locks = format!("/apis/objectlock.dev/v1alpha1/namespaces/{ns}/locks");

    let (r, f) = pair.both("GET", &format!("{locks}/missing"), None)?;
    pair.same_at("GET missing Lock", STATUS, &r, &f);
    let (r, f) = pair.both(
        "GET",
        "/apis/objectlock.dev/v1alpha1/clusterlocks/missing",
        None,
    )?;
    pair.same_at("GET missing ClusterLock", STATUS, &r, &f);
    let (r, f) = pair.both("DELETE", &format!("{locks}/missing"), None)?;
    pair.same_at("DELETE missing Lock", STATUS, &r, &f);

    // Created without a spec: the CRD defaults it to {}.
    let lock = json!({"apiVersion": "objectlock.dev/v1alpha1", "kind": "Lock", "metadata": {"name": "one"}});
    let (r, f) = pair.both("POST", &locks, Some(&lock))?;
    pair.same_at(
        "POST Lock",
        &[
            "/kind",
            "/apiVersion",
            "/spec",
            "/metadata/name",
            "/metadata/namespace",
            "/metadata/generation",
        ],
        &r,
        &f,
    );
    for field in ["uid", "resourceVersion", "creationTimestamp"] {
        pair.same(
            &format!("POST Lock: metadata.{field} is a string"),
            json!(r.body["metadata"][field].is_string()),
            json!(f.body["metadata"][field].is_string()),
        );
    }
    let (r, f) = pair.both("POST", &locks, Some(&lock))?;
    pair.same_at("POST existing Lock", STATUS, &r, &f);

    let two = json!({"apiVersion": "objectlock.dev/v1alpha1", "kind": "Lock",
                     "metadata": {"name": "two"}, "spec": {"reason": "r", "mode": "Warn"}});
    let (r, f) = pair.both("POST", &locks, Some(&two))?;
    pair.same_at("POST Lock with a spec", &["/spec"], &r, &f);
    let (r, f) = pair.both("GET", &format!("{locks}?limit=1"), None)?;
    pair.same_at(
        "LIST limit=1",
        &[
            "/kind",
            "/apiVersion",
            "/items/0/metadata/name",
            "/items/0/kind",
            "/items/0/apiVersion",
        ],
        &r,
        &f,
    );
    pair.same(
        "LIST limit=1: items",
        json!(r.body["items"].as_array().map(Vec::len)),
        json!(f.body["items"].as_array().map(Vec::len)),
    );
    pair.same(
        "LIST limit=1: metadata keys",
        keys(&r.body["metadata"]),
        keys(&f.body["metadata"]),
    );
    pair.same_at("LIST limit=1", &["/metadata/remainingItemCount"], &r, &f);
    let next = |reply: &Reply| {
        reply.body["metadata"]["continue"]
            .as_str()
            .unwrap_or_default()
            .to_owned()
    };
    let (rc, fc) = (next(&r), next(&f));
    let r2 = real.get(&format!("{locks}?limit=1&continue={rc}"))?;
    let f2 = fake.get(&format!("{locks}?limit=1&continue={fc}"))?;
    pair.same_at(
        "LIST page 2",
        &["/items/0/metadata/name", "/metadata/continue"],
        &r2,
        &f2,
    );
    let (r, f) = pair.both(
        "GET",
        &format!("/apis/objectlock.dev/v1alpha1/locks?fieldSelector=metadata.namespace%3D{ns}"),
        None,
    )?;
    pair.same_at(
        "LIST all namespaces",
        &["/kind", "/items/0/metadata/namespace"],
        &r,
        &f,
    );
    let (r, f) = pair.both(
        "GET",
        &format!("{locks}?fieldSelector=metadata.name%3Dtwo"),
        None,
    )?;
    pair.same_at(
        "LIST fieldSelector",
        &["/items/0/metadata/name", "/items/1"],
        &r,
        &f,
    );

    // A renewal of a Lock deleted and created again: the uid differs.
    let other = json!({"metadata": {"uid": "00000000-0000-0000-0000-000000000000"},
                       "spec": {"reason": "renewed"}});
    let merge = "application/merge-patch+json";
    let two = format!("{locks}/two");
    let r = real.call("PATCH", &two, merge, Some(&other))?;
    let f = fake.call("PATCH", &two, merge, Some(&other))?;
    pair.same_at("PATCH a Lock under another uid", STATUS, &r, &f);
    // A status written from an old view of the Lock (the last instance withdrawing).
    let stale = json!({"metadata": {"resourceVersion": "1"}, "status": {"enforcedCount": 0}});
    let r = real.call("PATCH", &format!("{two}/status"), merge, Some(&stale))?;
    let f = fake.call("PATCH", &format!("{two}/status"), merge, Some(&stale))?;
    pair.same_at(
        "PATCH a Lock's status at an old resourceVersion",
        STATUS,
        &r,
        &f,
    );
    let options = json!({"kind": "DeleteOptions", "apiVersion": "v1",
                         "preconditions": {"uid": "00000000-0000-0000-0000-000000000000"}});
    let (rt, ft) = pair.both("GET", &two, None)?;
    let r = real.call("DELETE", &two, "application/json", Some(&options))?;
    let f = fake.call("DELETE", &two, "application/json", Some(&options))?;
    let but_message: Vec<&str> = STATUS
        .iter()
        .copied()
        .filter(|p| *p != "/message")
        .collect();
    pair.same_at("DELETE a Lock under another uid", &but_message, &r, &f);
    // The message names the uid on record, each server's own.
    let message = |reply: &Reply, lock: &Reply| {
        let uid = lock.body["metadata"]["uid"].as_str().unwrap_or("?");
        json!(
            reply.body["message"]
                .as_str()
                .map(|m| m.replace(uid, "<uid>"))
        )
    };
    pair.same(
        "DELETE a Lock under another uid: /message",
        message(&r, &rt),
        message(&f, &ft),
    );

    let (r, f) = pair.both("DELETE", &format!("{locks}/one"), None)?;
    pair.same_at("DELETE Lock", &["/kind", "/metadata/name"], &r, &f);

    // A webhook configuration applied at a resourceVersion it is no longer at (the
    // registration writer's precondition).
    let config = format!(
        "/apis/admissionregistration.k8s.io/v1/validatingwebhookconfigurations/kol-parity-{ns}"
    );
    let apply = format!("{config}?fieldManager=parity&force=true");
    let mut body = json!({"apiVersion": "admissionregistration.k8s.io/v1",
        "kind": "ValidatingWebhookConfiguration", "metadata": {"name": format!("kol-parity-{ns}")},
        "webhooks": []});
    let patch = "application/apply-patch+yaml";
    let created = (
        real.call("PATCH", &apply, patch, Some(&body)),
        fake.call("PATCH", &apply, patch, Some(&body)),
    );
    body["metadata"]["resourceVersion"] = json!("1");
    let (r, f) = (
        real.call("PATCH", &apply, patch, Some(&body)),
        fake.call("PATCH", &apply, patch, Some(&body)),
    );
    real.call("DELETE", &config, "application/json", None)?;
    let ((rc, fc), (r, f)) = ((created.0?, created.1?), (r?, f?));
    pair.same_at("apply a webhook configuration", &["/kind"], &rc, &fc);
    pair.same_at("apply at an old resourceVersion", STATUS, &r, &f);

    // Discovery, as the plugin reads it.
    let (r, f) = pair.both("GET", "/apis/objectlock.dev/v1alpha1", None)?;
    pair.same_at("discovery", &["/kind", "/groupVersion"], &r, &f);
    for i in 0..2 {
        let (rr, fr) = (&r.body["resources"][i], &f.body["resources"]);
        let fr = fr
            .as_array()
            .and_then(|a| a.iter().find(|x| x["name"] == rr["name"]))
            .cloned()
            .unwrap_or(Value::Null);
        for field in [
            "singularName",
            "namespaced",
            "kind",
            "shortNames",
            "categories",
        ] {
            pair.same(
                &format!("discovery {}: {field}", rr["name"]),
                rr[field].clone(),
                fr[field].clone(),
            );
        }
        let verbs = |v: &Value| {
            json!(v["verbs"].as_array().map(|a| {
                a.iter()
                    .filter_map(Value::as_str)
                    .map(str::to_owned)
                    .collect::<BTreeSet<_>>()
            }))
        };
        pair.same(
            &format!("discovery {}: verbs", rr["name"]),
            verbs(rr),
            verbs(&fr),
        );
    }
    real.block_on(server.stop());

    for d in &pair.diffs {
        ctx.note(format!("differs: {d}"));
    }
    ensure!(
        pair.diffs.is_empty(),
        "the fake API server answers differently from the real one in {} place(s)",
        pair.diffs.len()
    );
    Ok(())
}
