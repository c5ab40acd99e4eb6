//! The lock `status` subresource (GET, PATCH as server-side apply or merge patch) and
//! `events.k8s.io/v1` Events (POST, merge PATCH, GET, LIST with field selectors), stored as
//! sent: what kube-apiserver accepts of them is checked by the end-to-end suite
//! (`enforcement-visible`, `warn-events`). Field selectors:
//! `regarding.{kind,namespace,name,uid,apiVersion}`, `reason`, `reportingController`, `type`,
//! `metadata.{name,namespace}`. Events are not watched and never expire.

use std::collections::{BTreeMap, VecDeque};

use bytes::Bytes;
use http::{Method, Request, Response};
use http_body_util::BodyExt;
use hyper::body::Incoming;
use serde_json::{Value, json};

use super::{
    API_VERSION, Body, FakeApiServer, Query, Res, bad_request, not_found, reply, reply_status, ssa,
    status,
};

const EVENTS_PREFIX: &str = "/apis/events.k8s.io/v1/";
const APPLY: &str = "application/apply-patch+yaml";
const MERGE: &str = "application/merge-patch+json";

/// What the extension keeps.
#[derive(Default)]
pub struct ExtState {
    /// Field managers of each lock's status.
    pub managed: BTreeMap<(Res, String, String), ssa::Managed>,
    /// Events by (namespace, name).
    pub events: BTreeMap<(String, String), Value>,
    /// Event writes received: `create` or `patch`, with the namespace/name.
    pub event_writes: Vec<String>,
    /// An apply (manager, configuration) that lands just before the next PATCH of a webhook
    /// configuration: another writer's edit racing it.
    pub webhooks_edit: Option<(String, Value)>,
    /// HTTP codes to answer the next status PATCHes with.
    pub status_faults: VecDeque<u16>,
    /// HTTP codes to answer the next applies of a webhook configuration with.
    pub webhook_faults: VecDeque<u16>,
}

/// The status subresource path of a lock: `(res, namespace, name)`.
fn status_route(path: &str) -> Option<(Res, String, String)> {
    let rest = path.strip_prefix(super::PREFIX)?;
    let segments: Vec<String> = rest.split('/').map(super::decode).collect();
    let segments: Vec<&str> = segments.iter().map(String::as_str).collect();
    match segments[..] {
        ["namespaces", ns, "locks", name, "status"] if !ns.is_empty() && !name.is_empty() => {
            Some((Res::Lock, ns.to_owned(), name.to_owned()))
        }
        ["clusterlocks", name, "status"] if !name.is_empty() => {
            Some((Res::ClusterLock, String::new(), name.to_owned()))
        }
        _ => None,
    }
}

/// Whether the extension answers this request.
pub fn handles(path: &str) -> bool {
    path.starts_with(EVENTS_PREFIX) || status_route(path).is_some()
}

impl FakeApiServer {
    /// Answers a request [`handles`] accepts.
    pub(super) async fn handle_ext(&self, req: Request<Incoming>, query: &Query) -> Response<Body> {
        let (method, path) = (req.method().clone(), req.uri().path().to_owned());
        let content_type = req
            .headers()
            .get(http::header::CONTENT_TYPE)
            .and_then(|v| v.to_str().ok())
            .unwrap_or_default()
            .split(';')
            .next()
            .unwrap_or_default()
            .trim()
            .to_owned();
        let body = req
            .into_body()
            .collect()
            .await
            .map(|b| b.to_bytes())
            .unwrap_or_default();
        if query.contains_key("dryRun") {
            return reply_status(bad_request("dryRun is not faked"));
        }
        let answer = match status_route(&path) {
            Some(key) => self.status_request(&method, key, &content_type, &body, query),
            None => self.events_request(&method, &path, &content_type, &body, query),
        };
        answer.map_or_else(reply_status, |(code, obj)| reply(code, obj))
    }

    fn status_request(
        &self,
        method: &Method,
        key: (Res, String, String),
        content_type: &str,
        body: &Bytes,
        query: &Query,
    ) -> Result<(u16, Value), Value> {
        let res = key.0;
        let object = self.state().objects.get(&key).cloned();
        let Some(mut object) = object else {
            return Err(not_found(res, &key.2));
        };
        match *method {
            Method::GET => return Ok((200, object)),
            Method::PATCH => {
                if let Some(code) = self.state().ext.status_faults.pop_front() {
                    return Err(status(code, "injected status write failure", Value::Null));
                }
            }
            _ => return Err(status(405, super::NOT_ALLOWED, json!({}))),
        }
        if content_type == MERGE {
            return self.merge_status(key, object, body);
        }
        if content_type != APPLY {
            let msg = format!(
                "the body of the request was in an unknown format - this fake accepts only {APPLY} and {MERGE} on status, got {content_type:?}"
            );
            return Err(status(415, &msg, Value::Null));
        }
        let manager = query.get("fieldManager").cloned().unwrap_or_default();
        if manager.is_empty() {
            let msg = "PatchOptions.meta.k8s.io \"\" is invalid: fieldManager: Required value: is required for apply patch";
            return Err(status(422, msg, Value::Null));
        }
        let force = query.get("force").is_some_and(|f| f == "true");
        let config: Value = serde_json::from_slice(body)
            .map_err(|e| bad_request(&format!("error decoding YAML: {e}")))?;
        let mut st = self.state();
        let mut managed = st.ext.managed.get(&key).cloned().unwrap_or_default();
        let changed = ssa::apply(
            &ssa::STATUS,
            &mut object,
            &mut managed,
            &config,
            &manager,
            force,
            API_VERSION,
        )
        .map_err(|refused| {
            let reason = if refused.code == 409 {
                "Conflict"
            } else {
                "BadRequest"
            };
            let mut s = status(refused.code, &refused.message, Value::Null);
            s["reason"] = json!(reason);
            if !refused.causes.is_empty() {
                s["details"] = json!({ "causes": refused.causes });
            }
            s
        })?;
        if !changed {
            return Ok((200, st.objects.get(&key).cloned().unwrap_or(object)));
        }
        let now = k8s_openapi::jiff::Timestamp::now().to_string();
        object["metadata"]["managedFields"] =
            ssa::managed_fields(&ssa::STATUS, &managed, API_VERSION, &now);
        st.ext.managed.insert(key.clone(), managed);
        let written = st.emit("MODIFIED", key, object);
        drop(st);
        self.notify();
        Ok((200, written))
    }

    /// A merge patch of the status: only `status` counts (the status strategy); fields it
    /// removes leave every manager's set. (The `Update` entry a real server adds for the
    /// patcher is not kept.)
    fn merge_status(
        &self,
        key: (Res, String, String),
        mut object: Value,
        body: &Bytes,
    ) -> Result<(u16, Value), Value> {
        let patch: Value = serde_json::from_slice(body)
            .map_err(|e| bad_request(&format!("error decoding request body: {e}")))?;
        // A resourceVersion in the patch is a precondition.
        let version = patch["metadata"]["resourceVersion"].as_str();
        if version.is_some_and(|v| object["metadata"]["resourceVersion"] != v) {
            let message = format!(
                "Operation cannot be fulfilled on {}.{} \"{}\": the object has been modified; \
                 please apply your changes to the latest version and try again",
                key.0.plural(),
                key.0.group(),
                key.2
            );
            let mut conflict = status(409, &message, super::details(key.0, &key.2));
            conflict["reason"] = json!("Conflict");
            return Err(conflict);
        }
        let before = object.clone();
        if let Some(status) = patch.get("status") {
            merge_patch(&mut object["status"], status);
        }
        if object == before {
            return Ok((200, object));
        }
        let mut st = self.state();
        let mut managed = st.ext.managed.get(&key).cloned().unwrap_or_default();
        ssa::forget_missing(&object, &mut managed);
        let now = k8s_openapi::jiff::Timestamp::now().to_string();
        object["metadata"]["managedFields"] =
            ssa::managed_fields(&ssa::STATUS, &managed, API_VERSION, &now);
        st.ext.managed.insert(key.clone(), managed);
        let written = st.emit("MODIFIED", key, object);
        drop(st);
        self.notify();
        Ok((200, written))
    }

    fn events_request(
        &self,
        method: &Method,
        path: &str,
        content_type: &str,
        body: &Bytes,
        query: &Query,
    ) -> Result<(u16, Value), Value> {
        let rest = path.strip_prefix(EVENTS_PREFIX).unwrap_or_default();
        let segments: Vec<String> = rest.split('/').map(super::decode).collect();
        let segments: Vec<&str> = segments.iter().map(String::as_str).collect();
        let (ns, name) = match segments[..] {
            ["events"] => (None, None),
            ["namespaces", ns, "events"] => (Some(ns), None),
            ["namespaces", ns, "events", name] => (Some(ns), Some(name)),
            _ => return Err(status(404, super::NO_SUCH_RESOURCE, json!({}))),
        };
        match (method, ns, name) {
            (&Method::GET, ns, None) => self.list_events(ns, query),
            (&Method::GET, Some(ns), Some(name)) => {
                let event = self
                    .state()
                    .ext
                    .events
                    .get(&(ns.into(), name.into()))
                    .cloned();
                event.map(|e| (200, e)).ok_or_else(|| event_not_found(name))
            }
            (&Method::POST, Some(ns), None) => {
                let event: Value = serde_json::from_slice(body)
                    .map_err(|e| bad_request(&format!("error decoding request body: {e}")))?;
                self.create_event(ns, event).map(|e| (201, e))
            }
            (&Method::PATCH, Some(ns), Some(name)) => {
                if content_type != MERGE {
                    let msg = format!(
                        "the body of the request was in an unknown format - this fake accepts only {MERGE} on events, got {content_type:?}"
                    );
                    return Err(status(415, &msg, Value::Null));
                }
                let patch: Value = serde_json::from_slice(body)
                    .map_err(|e| bad_request(&format!("error decoding request body: {e}")))?;
                self.patch_event(ns, name, &patch).map(|e| (200, e))
            }
            _ => Err(status(405, super::NOT_ALLOWED, json!({}))),
        }
    }

    fn list_events(&self, ns: Option<&str>, query: &Query) -> Result<(u16, Value), Value> {
        let selector = query.get("fieldSelector").cloned().unwrap_or_default();
        let mut terms = vec![];
        for term in selector.split(',').map(str::trim).filter(|t| !t.is_empty()) {
            let (field, value, equal) = match term.split_once("!=") {
                Some((f, v)) => (f, v, false),
                None => match term.split_once("==").or_else(|| term.split_once('=')) {
                    Some((f, v)) => (f, v, true),
                    None => return Err(bad_request(&format!("invalid selector: {term}"))),
                },
            };
            let pointer = match field.trim() {
                "regarding.kind" => "/regarding/kind",
                "regarding.namespace" => "/regarding/namespace",
                "regarding.name" => "/regarding/name",
                "regarding.uid" => "/regarding/uid",
                "regarding.apiVersion" => "/regarding/apiVersion",
                "reason" => "/reason",
                "reportingController" => "/reportingController",
                "type" => "/type",
                "metadata.name" => "/metadata/name",
                "metadata.namespace" => "/metadata/namespace",
                other => return Err(bad_request(&format!("field label not supported: {other}"))),
            };
            terms.push((pointer, value.trim().to_owned(), equal));
        }
        let st = self.state();
        let items: Vec<Value> = st
            .ext
            .events
            .iter()
            .filter(|((event_ns, _), _)| ns.is_none_or(|ns| ns == event_ns))
            .map(|(_, e)| e)
            .filter(|e| {
                terms.iter().all(|(pointer, value, equal)| {
                    let actual = e.pointer(pointer).and_then(Value::as_str).unwrap_or("");
                    (actual == value) == *equal
                })
            })
            .cloned()
            .collect();
        let rv = st.rv.to_string();
        Ok((
            200,
            json!({ "apiVersion": "events.k8s.io/v1", "kind": "EventList",
                "metadata": { "resourceVersion": rv }, "items": items }),
        ))
    }

    /// Stores an Event as given (kube-apiserver's validation is exercised by the end-to-end
    /// suite, never copied here).
    fn create_event(&self, ns: &str, mut event: Value) -> Result<Value, Value> {
        let name = event["metadata"]["name"]
            .as_str()
            .unwrap_or_default()
            .to_owned();
        let mut st = self.state();
        let key = (ns.to_owned(), name.clone());
        if st.ext.events.contains_key(&key) {
            let msg = format!("events.events.k8s.io \"{name}\" already exists");
            return Err(status(
                409,
                &msg,
                json!({ "name": name, "group": "events.k8s.io", "kind": "events" }),
            ));
        }
        st.rv += 1;
        let meta = &mut event["metadata"];
        meta["namespace"] = json!(ns);
        meta["resourceVersion"] = json!(st.rv.to_string());
        meta["uid"] = json!(format!("00000000-0000-4000-a000-{:012x}", st.rv));
        meta["creationTimestamp"] = json!(k8s_openapi::jiff::Timestamp::now().to_string());
        event["apiVersion"] = json!("events.k8s.io/v1");
        event["kind"] = json!("Event");
        st.ext.event_writes.push(format!("create {ns}/{name}"));
        st.ext.events.insert(key, event.clone());
        Ok(event)
    }

    fn patch_event(&self, ns: &str, name: &str, patch: &Value) -> Result<Value, Value> {
        let mut st = self.state();
        let key = (ns.to_owned(), name.to_owned());
        let Some(old) = st.ext.events.get(&key).cloned() else {
            return Err(event_not_found(name));
        };
        let mut new = old.clone();
        merge_patch(&mut new, patch);
        st.rv += 1;
        new["metadata"]["resourceVersion"] = json!(st.rv.to_string());
        st.ext.event_writes.push(format!("patch {ns}/{name}"));
        st.ext.events.insert(key, new.clone());
        Ok(new)
    }

    /// Every Event, as stored.
    pub fn events(&self) -> Vec<Value> {
        self.state().ext.events.values().cloned().collect()
    }

    /// Event writes received so far (`create NS/NAME`, `patch NS/NAME`).
    pub fn event_writes(&self) -> Vec<String> {
        self.state().ext.event_writes.clone()
    }

    /// The field managers of a Lock's status (`namespace` `None`: a ClusterLock).
    pub fn status_managers(&self, namespace: Option<&str>, name: &str) -> Vec<String> {
        let res = if namespace.is_some() {
            Res::Lock
        } else {
            Res::ClusterLock
        };
        let key = (
            res,
            namespace.unwrap_or_default().to_owned(),
            name.to_owned(),
        );
        self.state()
            .ext
            .managed
            .get(&key)
            .map(|m| m.keys().cloned().collect())
            .unwrap_or_default()
    }
}

/// RFC 7386 JSON merge patch.
pub(super) fn merge_patch(target: &mut Value, patch: &Value) {
    let Value::Object(patch) = patch else {
        *target = patch.clone();
        return;
    };
    if !target.is_object() {
        *target = json!({});
    }
    let map = target.as_object_mut().expect("made an object");
    for (k, v) in patch {
        if v.is_null() {
            map.remove(k);
        } else {
            merge_patch(map.entry(k.clone()).or_insert(Value::Null), v);
        }
    }
}

fn event_not_found(name: &str) -> Value {
    let msg = format!("events.events.k8s.io \"{name}\" not found");
    status(
        404,
        &msg,
        json!({ "name": name, "group": "events.k8s.io", "kind": "events" }),
    )
}
