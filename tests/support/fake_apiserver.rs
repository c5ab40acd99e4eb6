//! An in-process fake Kubernetes API server for the `objectlock.dev/v1alpha1` CRDs, with the
//! discovery and the few other objects that `kubectl lock` looks up.
//!
//! It speaks the real REST + watch wire format over plain HTTP/1.1 on `127.0.0.1:0`, so a real
//! `kube::Client` (`Api::list`/`get`/`create`/`delete`, `kube::runtime::watcher`) talks to it
//! as it would to a kube-apiserver. Tests drive it through [`FakeApiServer`].
//!
//! What it fakes:
//! - `locks` (namespaced, kind `Lock`) and `clusterlocks` (cluster-scoped, kind `ClusterLock`):
//!   LIST (`limit`/`continue` paging over a consistent snapshot, `resourceVersion` +
//!   `resourceVersionMatch`), GET, POST, DELETE (`preconditions.uid` checked), merge PATCH (a
//!   different `metadata.uid` in the patch refused as immutable; failures injected with [`FakeApiServer::fail_patches`]), and WATCH (`watch=true`, `resourceVersion`,
//!   `timeoutSeconds`, `sendInitialEvents` ending with the `k8s.io/initial-events-end` bookmark).
//! - One global, etcd-like resourceVersion counter; every change is kept as a watch event.
//! - A watch from a resourceVersion older than the last [`FakeApiServer::compact`] gets HTTP 200
//!   and then an `ERROR` event carrying a 410 `Expired` Status, as a real server sends it.
//! - Watch faults ([`WatchFault`]) while LIST works: refused (403), delayed, cut after a while;
//!   and [`FakeApiServer::expire_watches`] (410 on every resume).
//! - A frozen process ([`FakeApiServer::freeze`], as SIGSTOP does to a real one): connections
//!   are still accepted and stay open, nothing is answered and open watches deliver nothing, until
//!   [`FakeApiServer::thaw`]; then what waited is answered, as a process continued with SIGCONT
//!   answers what its kernel queued.
//! - `GET /livez` (`ok`, whatever the query), as kube-apiserver answers it.
//! - Errors are `Status` objects with real reasons and messages (NotFound, Forbidden, ...).
//! - `fieldSelector` (`metadata.name`, `metadata.namespace`) and `labelSelector` equality terms
//!   (`k=v`, `k==v`, `k!=v`, `k`, `!k`); other selector syntax is answered 400, never ignored.
//! - Discovery as `kubectl` reads it: `GET /api`, `/api/v1`, `/apis` and each group version's
//!   `APIResourceList` ([`DISCOVERY`]: a few core, `apps`, `rbac.authorization.k8s.io` and lock
//!   resources with their short names, scopes and verbs, and some subresources).
//! - Other objects, seeded with [`FakeApiServer::add_object`] and answered by GET of one object
//!   (200, or a 404 `NotFound` Status naming it; `PartialObjectMetadata` when the `Accept`
//!   header asks for metadata only, as kube's `get_metadata` does); only the resources in
//!   [`DISCOVERY`]. Their own faults: [`FakeApiServer::set_object_fault`].
//! - The locks' `status` subresource: GET, PATCH as server-side apply with per-manager field
//!   ownership, list-map merging, conflicts and `force` (module `ssa`), and merge PATCH (which
//!   takes the fields it removes from every manager); writes to the main
//!   resource keep the status and a create drops it, as for a CRD with a status subresource.
//! - `events.k8s.io/v1` Events: create, merge patch, get, list with field selectors, stored as
//!   sent (module `ext`).
//!
//! What it does not fake: TLS, authentication, aggregated discovery, LIST or writes of other
//! objects, PUT, other PATCH types, `dryRun` (answered 400), admission, schema validation,
//! managedFields of the main resource, `generateName`,
//! periodic watch bookmarks, protobuf, HTTP/2, and the few seconds a real server waits before
//! answering "Too large resource version".
#![allow(dead_code)] // each test binary uses a different part of this module

// Explicit paths: this file is also included by the load benchmark through `#[path]`.
#[path = "fake_apiserver/ext.rs"]
mod ext;
#[path = "fake_apiserver/ssa.rs"]
mod ssa;
#[path = "fake_apiserver/webhooks.rs"]
mod webhooks;

use std::collections::{BTreeMap, VecDeque};
use std::convert::Infallible;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use bytes::Bytes;
use http::{Method, Request, Response, StatusCode};
use http_body_util::{BodyExt, Full, StreamBody, combinators::UnsyncBoxBody};
use hyper::body::{Frame, Incoming};
use hyper_util::rt::TokioIo;
use serde_json::{Value, json};
use tokio::{net::TcpListener, sync::watch, task::JoinHandle, task::JoinSet, time::Instant};

const GROUP: &str = "objectlock.dev";
const API_VERSION: &str = "objectlock.dev/v1alpha1";
const PREFIX: &str = "/apis/objectlock.dev/v1alpha1/";
const SELF_SUBJECT_REVIEWS: &str = "/apis/authentication.k8s.io/v1/selfsubjectreviews";
/// Who every client of the fake is (`kubectl auth whoami`).
pub const USER: &str = "jane@example.com";
/// The user named in `Forbidden` messages.
pub const FAKE_USER: &str = "system:serviceaccount:kube-object-lock:kube-object-lock";

type Body = UnsyncBoxBody<Bytes, Infallible>;
type Query = BTreeMap<String, String>;
/// `(resource, namespace ("" when cluster-scoped), name)`.
type Key = (Res, String, String);

/// A fault injected into LIST and GET answers (never into watches).
#[derive(Clone, Debug)]
pub enum Fault {
    /// Answer with a `Status` of this HTTP code (403 Forbidden, 500 InternalError, ...).
    Status(u16),
    /// Sleep this long, then answer normally.
    Delay(Duration),
}

/// A fault injected into WATCH requests (never into LIST or GET), as a restarting API server,
/// an identity without `watch`, or a proxy in front of the API server produce them.
#[derive(Clone, Debug)]
pub enum WatchFault {
    /// Refuse every WATCH with a `Status` of this HTTP code (403: may list but not watch).
    Status(u16),
    /// Hold every WATCH this long before answering (an API server that is slow to serve it).
    Delay(Duration),
    /// End every watch stream this long after it started, as a proxy that cuts long requests
    /// does (the client sees the stream end; kube treats an abrupt EOF the same way).
    Cut(Duration),
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
enum Res {
    Lock,
    ClusterLock,
    /// `admissionregistration.k8s.io/v1` (module `webhooks`).
    WebhookConfiguration,
}

impl Res {
    fn plural(self) -> &'static str {
        ["locks", "clusterlocks", "validatingwebhookconfigurations"][self as usize]
    }
    fn kind(self) -> &'static str {
        ["Lock", "ClusterLock", "ValidatingWebhookConfiguration"][self as usize]
    }
    fn group(self) -> &'static str {
        match self {
            Res::WebhookConfiguration => webhooks::GROUP,
            Res::Lock | Res::ClusterLock => GROUP,
        }
    }
    fn api_version(self) -> &'static str {
        match self {
            Res::WebhookConfiguration => webhooks::API_VERSION,
            Res::Lock | Res::ClusterLock => API_VERSION,
        }
    }
}

/// What a request path names: a collection (`name: None`) or one object.
struct Route {
    res: Res,
    ns: Option<String>,
    name: Option<String>,
}

impl Route {
    fn key(&self) -> Key {
        let (ns, name) = (self.ns.clone(), self.name.clone());
        (self.res, ns.unwrap_or_default(), name.unwrap_or_default())
    }
    /// Whether the object stored under `key` belongs to this collection.
    fn holds(&self, key: &Key) -> bool {
        key.0 == self.res && self.ns.as_ref().is_none_or(|ns| *ns == key.1)
    }
}

struct Event {
    rv: u64,
    kind: &'static str,
    key: Key,
    object: Value,
}

#[derive(Default)]
struct State {
    rv: u64,
    objects: BTreeMap<Key, Value>,
    /// Every change ever made; `compacted_rv` says how far back it may still be read.
    history: Vec<Event>,
    compacted_rv: u64,
    drop_generation: u64,
    stopped: bool,
    /// Nothing is answered nor sent while set (see [`FakeApiServer::freeze`]).
    frozen: bool,
    fault: Option<Fault>,
    /// The fault of GETs of objects other than locks.
    object_fault: Option<Fault>,
    watch_fault: Option<WatchFault>,
    /// Codes to answer the next merge PATCHes of locks with, one each.
    patch_faults: VecDeque<u16>,
    /// Objects other than locks, by their path (`/api/v1/namespaces/prod/configmaps/web`).
    others: BTreeMap<String, Value>,
    log: Vec<String>,
    lists: Vec<String>,
    watches: usize,
    /// Status field managers and events.
    ext: ext::ExtState,
}

impl State {
    /// The objects of `res` as they were at `rv`, replayed from the history.
    fn snapshot(&self, res: Res, rv: u64) -> BTreeMap<Key, Value> {
        let mut objects = BTreeMap::new();
        for e in self
            .history
            .iter()
            .take_while(|e| e.rv <= rv)
            .filter(|e| e.key.0 == res)
        {
            if e.kind == "DELETED" {
                objects.remove(&e.key);
            } else {
                objects.insert(e.key.clone(), e.object.clone());
            }
        }
        objects
    }

    /// Applies a change under a new resourceVersion, keeps it as an event, returns the object.
    fn emit(&mut self, kind: &'static str, key: Key, mut object: Value) -> Value {
        self.rv += 1;
        object["metadata"]["resourceVersion"] = json!(self.rv.to_string());
        let event = Event {
            rv: self.rv,
            kind,
            key: key.clone(),
            object: object.clone(),
        };
        self.history.push(event);
        if kind == "DELETED" {
            self.objects.remove(&key);
        } else {
            self.objects.insert(key, object.clone());
        }
        object
    }
}

struct Inner {
    url: String,
    state: Mutex<State>,
    changed: watch::Sender<()>,
    task: Mutex<Option<JoinHandle<()>>>,
}

/// Handle to a running fake API server; clones share the same server.
#[derive(Clone)]
pub struct FakeApiServer {
    inner: Arc<Inner>,
}

impl FakeApiServer {
    /// Binds `127.0.0.1:0` and serves on a spawned task (call it inside a tokio runtime).
    pub async fn start() -> FakeApiServer {
        let listener = TcpListener::bind("127.0.0.1:0")
            .await
            .expect("bind 127.0.0.1:0");
        let addr = listener.local_addr().expect("local_addr");
        let server = FakeApiServer {
            inner: Arc::new(Inner {
                url: format!("http://{addr}"),
                state: Mutex::new(State::default()),
                changed: watch::channel(()).0,
                task: Mutex::new(None),
            }),
        };
        let srv = server.clone();
        let task = tokio::spawn(async move {
            // Dropping this set (when `stop` aborts the task) aborts every open connection.
            let mut connections = JoinSet::new();
            while let Ok((stream, _)) = listener.accept().await {
                let srv = srv.clone();
                let service = hyper::service::service_fn(move |req| srv.clone().handle(req));
                connections.spawn(async move {
                    let conn = hyper::server::conn::http1::Builder::new();
                    let _ = conn.serve_connection(TokioIo::new(stream), service).await;
                });
                while connections.try_join_next().is_some() {}
            }
        });
        *server.inner.task.lock().expect("task lock") = Some(task);
        server
    }

    /// `"http://127.0.0.1:PORT"`.
    pub fn url(&self) -> String {
        self.inner.url.clone()
    }

    /// A real `kube::Client` pointed at this server (default namespace `default`).
    pub fn client(&self) -> kube::Client {
        let config = kube::Config::new(self.url().parse().expect("server url is a valid uri"));
        kube::Client::try_from(config).expect("kube client for the fake apiserver")
    }

    /// Creates a `Lock` (event `ADDED`); if it exists, replaces its spec (event `MODIFIED`).
    pub fn create_lock(&self, namespace: &str, name: &str, spec: Value) {
        let key = (Res::Lock, namespace.to_string(), name.to_string());
        let _ = self.store(key, json!({ "spec": spec }), false);
    }

    /// Creates a `ClusterLock` (event `ADDED`); if it exists, replaces its spec (`MODIFIED`).
    pub fn create_cluster_lock(&self, name: &str, spec: Value) {
        let key = (Res::ClusterLock, String::new(), name.to_string());
        let _ = self.store(key, json!({ "spec": spec }), false);
    }

    /// Deletes a `Lock` (event `DELETED`); false if there was none.
    pub fn delete_lock(&self, namespace: &str, name: &str) -> bool {
        self.remove((Res::Lock, namespace.into(), name.into()))
            .is_some()
    }

    /// Adds an object of a resource in [`DISCOVERY`] to the collection at `collection`, e.g.
    /// `add_object("/apis/apps/v1/namespaces/prod/deployments", json!({"metadata": {"name": "web"}}))`.
    /// `apiVersion`, `kind`, the namespace, a uid and a creationTimestamp are filled in.
    pub fn add_object(&self, collection: &str, mut object: Value) {
        let name = object["metadata"]["name"].as_str().expect("metadata.name");
        let path = format!("{collection}/{name}");
        let route = ObjectRoute::parse(&path).expect("a collection of a discovered resource");
        let entry = route
            .entry()
            .expect("a collection of a discovered resource");
        object["apiVersion"] = json!(route.group_version);
        object["kind"] = entry["kind"].clone();
        let meta = &mut object["metadata"];
        if let Some(ns) = &route.ns {
            meta["namespace"] = json!(ns);
        }
        let mut st = self.state();
        meta["uid"] = json!(format!("00000000-0000-4000-9000-{:012x}", st.others.len()));
        meta["creationTimestamp"] = json!("2026-01-01T00:00:00Z");
        st.others.insert(path, object);
    }

    /// The `Lock` stored as `namespace/name`, as a GET returns it.
    pub fn lock(&self, namespace: &str, name: &str) -> Option<Value> {
        let key = (Res::Lock, namespace.to_string(), name.to_string());
        self.state().objects.get(&key).cloned()
    }

    /// The `ClusterLock` stored as `name`, as a GET returns it.
    pub fn cluster_lock(&self, name: &str) -> Option<Value> {
        let key = (Res::ClusterLock, String::new(), name.to_string());
        self.state().objects.get(&key).cloned()
    }

    /// LIST requests received so far (faulted ones included; GETs and watches are not LISTs).
    pub fn list_calls(&self) -> usize {
        self.state().lists.len()
    }

    /// LIST requests whose `path?query` contains `path_contains`.
    pub fn list_calls_for(&self, path_contains: &str) -> usize {
        self.state()
            .lists
            .iter()
            .filter(|p| p.contains(path_contains))
            .count()
    }

    /// WATCH requests received so far.
    pub fn watch_calls(&self) -> usize {
        self.state().watches
    }

    /// Every request as `"METHOD /path?query"`, in arrival order.
    pub fn request_log(&self) -> Vec<String> {
        self.state().log.clone()
    }

    /// Injects `fault` into every later LIST and GET until [`FakeApiServer::clear_fault`].
    pub fn set_fault(&self, fault: Fault) {
        self.state().fault = Some(fault);
    }

    /// Ends the fault set by [`FakeApiServer::set_fault`].
    pub fn clear_fault(&self) {
        self.state().fault = None;
    }

    /// Answers the next `count` merge PATCHes of locks with a `Status` of HTTP `code` (a
    /// renewal failing).
    pub fn fail_patches(&self, count: usize, code: u16) {
        self.state()
            .patch_faults
            .extend(std::iter::repeat_n(code, count));
    }

    /// Answers the next `count` PATCHes of a lock's status with a `Status` of HTTP `code`.
    pub fn fail_status_patches(&self, count: usize, code: u16) {
        (self.state().ext.status_faults).extend(std::iter::repeat_n(code, count));
    }

    /// Injects `fault` into every later GET of an object other than a lock (a pod, a
    /// Deployment) until [`FakeApiServer::clear_object_fault`].
    pub fn set_object_fault(&self, fault: Fault) {
        self.state().object_fault = Some(fault);
    }

    /// Ends the fault set by [`FakeApiServer::set_object_fault`].
    pub fn clear_object_fault(&self) {
        self.state().object_fault = None;
    }

    /// GETs of objects other than locks so far whose path contains `path_contains`.
    pub fn object_gets(&self, path_contains: &str) -> usize {
        let st = self.state();
        (st.log.iter())
            .filter(|line| line.starts_with("GET ") && line.contains(path_contains))
            .count()
    }

    /// Injects `fault` into every later WATCH until [`FakeApiServer::clear_watch_fault`].
    /// Open streams go on (call [`FakeApiServer::drop_watches`] to end them).
    pub fn set_watch_fault(&self, fault: WatchFault) {
        self.state().watch_fault = Some(fault);
    }

    /// Ends the fault set by [`FakeApiServer::set_watch_fault`].
    pub fn clear_watch_fault(&self) {
        self.state().watch_fault = None;
    }

    /// Expires every watch, as an etcd compaction under an API server restart does: history is
    /// compacted and open streams end, so every resume gets an `ERROR` 410 event and the client
    /// must list again.
    pub fn expire_watches(&self) {
        self.compact();
        self.drop_watches();
    }

    /// LIST requests whose path is exactly `path` (any query), e.g.
    /// `/apis/objectlock.dev/v1alpha1/namespaces/prod/locks`.
    pub fn list_calls_exact(&self, path: &str) -> usize {
        self.state()
            .lists
            .iter()
            .filter(|p| p.split('?').next() == Some(path))
            .count()
    }

    /// Ends every open watch stream now, cleanly, as a server-side watch timeout does.
    pub fn drop_watches(&self) {
        self.state().drop_generation += 1;
        self.notify();
    }

    /// Compacts history as etcd does. In a real cluster other objects keep moving the global
    /// resourceVersion, so this bumps it once and compacts there: every watch request (new or
    /// resumed) from an older resourceVersion gets an `ERROR` 410 event. Open streams go on.
    pub fn compact(&self) {
        let mut st = self.state();
        st.rv += 1;
        st.compacted_rv = st.rv;
    }

    /// Freezes the server as SIGSTOP freezes a real one: connections are accepted (a kernel
    /// does that for a stopped process) but no request is answered and open watch streams send
    /// nothing, without an error or an end, until [`FakeApiServer::thaw`].
    pub fn freeze(&self) {
        self.state().frozen = true;
        self.notify();
    }

    /// Ends [`FakeApiServer::freeze`]: what waited is answered, streams go on.
    pub fn thaw(&self) {
        self.state().frozen = false;
        self.notify();
    }

    /// Returns once the server is not frozen.
    async fn thawed(&self) {
        let mut changes = self.inner.changed.subscribe();
        while self.state().frozen {
            if changes.changed().await.is_err() {
                return;
            }
        }
    }

    /// Closes the listener and every connection; later connects are refused.
    pub async fn stop(&self) {
        self.state().stopped = true;
        self.notify();
        let task = self.inner.task.lock().expect("task lock").take();
        if let Some(task) = task {
            task.abort();
            let _ = task.await;
        }
    }

    fn state(&self) -> MutexGuard<'_, State> {
        self.inner.state.lock().expect("fake apiserver state lock")
    }

    fn notify(&self) {
        self.inner.changed.send_replace(());
    }

    /// Stores `body` under `key` (refusing to replace when `create_only`): ADDED or MODIFIED.
    fn store(&self, key: Key, mut body: Value, create_only: bool) -> Result<Value, Value> {
        let (res, ns, name) = key.clone();
        let mut st = self.state();
        let old = st.objects.get(&key).cloned();
        if old.is_some() && create_only {
            let msg = format!("{}.{} \"{name}\" already exists", res.plural(), res.group());
            return Err(status(409, &msg, details(res, &name)));
        }
        let spec_changed = old.as_ref().is_some_and(|old| old["spec"] != body["spec"]);
        // The status belongs to its subresource: a write of the object never changes it.
        match old.as_ref().and_then(|old| old.get("status")) {
            Some(status) => body["status"] = status.clone(),
            None => _ = body.as_object_mut().map(|b| b.remove("status")),
        }
        let meta = &mut body["metadata"];
        meta["name"] = json!(name);
        if res == Res::Lock {
            meta["namespace"] = json!(ns);
        }
        if let Some(old) = &old {
            if let Some(managed) = old["metadata"].get("managedFields") {
                meta["managedFields"] = managed.clone();
            }
            meta["uid"] = old["metadata"]["uid"].clone();
            meta["creationTimestamp"] = old["metadata"]["creationTimestamp"].clone();
            let generation = old["metadata"]["generation"].as_u64().unwrap_or(1);
            meta["generation"] = json!(generation + u64::from(spec_changed));
        } else {
            let now = k8s_openapi::jiff::Timestamp::now();
            let now = k8s_openapi::apimachinery::pkg::apis::meta::v1::Time(now);
            meta["uid"] = json!(format!("00000000-0000-4000-8000-{:012x}", st.rv + 1));
            meta["creationTimestamp"] = serde_json::to_value(now).expect("timestamp serializes");
            meta["generation"] = json!(1);
        }
        body["apiVersion"] = json!(res.api_version());
        body["kind"] = json!(res.kind());
        let object = st.emit(if old.is_some() { "MODIFIED" } else { "ADDED" }, key, body);
        drop(st);
        self.notify();
        Ok(object)
    }

    /// Removes an object: DELETED, carrying the deletion's resourceVersion (as etcd does).
    fn remove(&self, key: Key) -> Option<Value> {
        let mut st = self.state();
        st.ext.managed.remove(&key);
        let object = st.objects.get(&key).cloned()?;
        let object = st.emit("DELETED", key, object);
        drop(st);
        self.notify();
        Some(object)
    }

    async fn handle(self, req: Request<Incoming>) -> Result<Response<Body>, Infallible> {
        self.thawed().await;
        let (method, uri) = (req.method().clone(), req.uri().clone());
        let target = uri.path_and_query().map_or("/", |p| p.as_str()).to_string();
        self.state().log.push(format!("{method} {target}"));
        let query: Query = (uri.query().unwrap_or_default().split('&'))
            .filter(|kv| !kv.is_empty())
            .map(|kv| kv.split_once('=').unwrap_or((kv, "")))
            .map(|(k, v)| (decode(&k.replace('+', " ")), decode(&v.replace('+', " "))))
            .collect();
        if ext::handles(uri.path()) {
            return Ok(self.handle_ext(req, &query).await);
        }
        if method == Method::GET && uri.path() == "/livez" {
            let ok = Full::new(Bytes::from_static(b"ok")).boxed_unsync();
            return Ok(Response::builder()
                .status(StatusCode::OK)
                .header(http::header::CONTENT_TYPE, "text/plain; charset=utf-8")
                .body(ok)
                .expect("valid response"));
        }
        // `kubectl auth whoami`: every client of the fake is the same user.
        if method == Method::POST && uri.path() == SELF_SUBJECT_REVIEWS {
            let user = json!({ "username": USER, "groups": ["system:authenticated"] });
            let review = json!({ "apiVersion": "authentication.k8s.io/v1",
                "kind": "SelfSubjectReview", "metadata": {}, "status": { "userInfo": user } });
            return Ok(reply(201, review));
        }
        if method == Method::GET
            && let Some(list) = discovery(uri.path())
        {
            return Ok(reply(200, list));
        }
        if let Some(route) = ObjectRoute::parse(uri.path()).filter(|r| r.entry().is_some()) {
            if method != Method::GET {
                return Ok(reply_status(status(405, NOT_ALLOWED, json!({}))));
            }
            let fault = self.state().object_fault.clone();
            if let Some(Fault::Delay(delay)) = fault {
                tokio::time::sleep(delay).await;
            }
            if let Some(Fault::Status(code)) = fault {
                return Ok(reply_status(route.fault(code)));
            }
            let answer = self.state().others.get(&decode(uri.path())).cloned();
            let metadata_only = (req.headers().get_all(http::header::ACCEPT).iter()).any(|v| {
                v.to_str()
                    .is_ok_and(|v| v.contains("as=PartialObjectMetadata"))
            });
            let answer = answer.map(|o| {
                if metadata_only {
                    partial_metadata(o)
                } else {
                    o
                }
            });
            return Ok(answer.map_or_else(|| reply_status(route.not_found()), |o| reply(200, o)));
        }
        let Some(route) = parse_route(uri.path()) else {
            return Ok(reply_status(status(404, NO_SUCH_RESOURCE, json!({}))));
        };
        let watching = matches!(query.get("watch").map(String::as_str), Some("true" | "1"));
        let answer = match (&method, &route.name) {
            (&Method::GET, None) if watching => {
                let fault = self.state().watch_fault.clone();
                match fault {
                    Some(WatchFault::Status(code)) => {
                        self.state().watches += 1;
                        return Ok(reply_status(watch_fault_status(code, &route)));
                    }
                    Some(WatchFault::Delay(delay)) => tokio::time::sleep(delay).await,
                    _ => {}
                }
                return Ok(self.watch(route, query));
            }
            (&Method::GET, name) => {
                if name.is_none() {
                    self.state().lists.push(target);
                }
                let fault = self.state().fault.clone();
                if let Some(Fault::Delay(delay)) = fault {
                    tokio::time::sleep(delay).await;
                }
                match fault {
                    Some(Fault::Status(code)) => Err(fault_status(code, &route)),
                    _ => self.read(&route, &query).map(|obj| (200, obj)),
                }
            }
            (&Method::POST, None)
                if route.res != Res::WebhookConfiguration
                    && route.ns.is_some() == (route.res == Res::Lock) =>
            {
                let body = req.into_body().collect().await.map(|b| b.to_bytes());
                let parsed = serde_json::from_slice::<Value>(&body.unwrap_or_default());
                match parsed {
                    _ if query.contains_key("dryRun") => Err(bad_request("dryRun is not faked")),
                    Err(e) => Err(bad_request(&format!("error decoding request body: {e}"))),
                    Ok(obj) => self.create(&route, obj).map(|obj| (201, obj)),
                }
            }
            (&Method::PATCH, Some(name)) if route.res == Res::WebhookConfiguration => {
                let name = name.clone();
                return Ok(self.apply_webhooks(req, &name, &query).await);
            }
            (&Method::PATCH, Some(name)) => {
                let merge = req
                    .headers()
                    .get(http::header::CONTENT_TYPE)
                    .is_some_and(|t| t.as_bytes().starts_with(b"application/merge-patch+json"));
                let body = req.into_body().collect().await.map(|b| b.to_bytes());
                let fault = self.state().patch_faults.pop_front();
                match (
                    fault,
                    serde_json::from_slice::<Value>(&body.unwrap_or_default()),
                ) {
                    _ if !merge => Err(status(415, "only merge patches are faked", Value::Null)),
                    _ if query.contains_key("dryRun") => Err(bad_request("dryRun is not faked")),
                    (Some(code), _) => Err(fault_status(code, &route)),
                    (None, Err(e)) => {
                        Err(bad_request(&format!("error decoding request body: {e}")))
                    }
                    (None, Ok(patch)) => self.merge(&route, name, &patch).map(|obj| (200, obj)),
                }
            }
            (&Method::DELETE, Some(name)) => {
                // DeleteOptions' `preconditions.uid`: a lock created again under the name is
                // not the one meant.
                let body = req.into_body().collect().await.map(|b| b.to_bytes());
                let options: Value =
                    serde_json::from_slice(&body.unwrap_or_default()).unwrap_or(Value::Null);
                let current = self.state().objects.get(&route.key()).cloned();
                let wanted = options["preconditions"]["uid"].as_str();
                if let (Some(wanted), Some(current)) = (wanted, current)
                    && current["metadata"]["uid"] != wanted
                {
                    let kind = route.res.kind();
                    let message = format!(
                        "Operation cannot be fulfilled on {kind}.{GROUP} \"{name}\": the UID in the \
                         precondition ({wanted}) does not match the UID in record ({}). The object \
                         might have been deleted and then recreated",
                        current["metadata"]["uid"].as_str().unwrap_or_default()
                    );
                    let details = json!({"name": name, "group": GROUP, "kind": kind});
                    let mut conflict = status(409, &message, details);
                    conflict["reason"] = json!("Conflict");
                    return Ok(reply_status(conflict));
                }
                // A custom resource without finalizers is gone at once: the answer is a
                // `Status` of success naming it, not the object.
                let removed = self.remove(route.key()).map(|obj| {
                    let mut details = details(route.res, name);
                    details["uid"] = obj["metadata"]["uid"].clone();
                    let success = json!({ "kind": "Status", "apiVersion": "v1", "metadata": {},
                        "status": "Success", "details": details });
                    (200, success)
                });
                removed.ok_or_else(|| not_found(route.res, name))
            }
            _ => Err(status(405, NOT_ALLOWED, json!({}))),
        };
        Ok(answer.map_or_else(reply_status, |(code, obj)| reply(code, obj)))
    }

    /// POST: the object's own namespace must match the path; the name is required; a missing
    /// `spec` gets the CRDs' default `{}`.
    fn create(&self, route: &Route, mut obj: Value) -> Result<Value, Value> {
        if obj.get("spec").is_none_or(Value::is_null) {
            obj["spec"] = json!({});
        }
        let ns = route.ns.clone().unwrap_or_default();
        if obj["metadata"]["namespace"]
            .as_str()
            .is_some_and(|n| !n.is_empty() && n != ns)
        {
            let msg = "the namespace of the provided object does not match the namespace sent on \
                       the request";
            return Err(bad_request(msg));
        }
        let name = obj["metadata"]["name"]
            .as_str()
            .unwrap_or_default()
            .to_string();
        if name.is_empty() {
            let msg = "metadata.name: Required value: name or generateName is required";
            return Err(status(422, msg, Value::Null));
        }
        self.store((route.res, ns, name), obj, true)
    }

    /// A merge PATCH of a lock: a `metadata.uid` in the patch that differs is a change of an
    /// immutable field (422), as kube-apiserver 1.36 answers it.
    fn merge(&self, route: &Route, name: &str, patch: &Value) -> Result<Value, Value> {
        let old = self.state().objects.get(&route.key()).cloned();
        let mut object = old.ok_or_else(|| not_found(route.res, name))?;
        let uid = &object["metadata"]["uid"];
        if let Some(wanted) = patch["metadata"]["uid"].as_str().filter(|u| uid != u) {
            let invalid = format!("Invalid value: \"{wanted}\": field is immutable");
            let kind = route.res.kind();
            let message = format!("{kind}.{GROUP} \"{name}\" is invalid: metadata.uid: {invalid}");
            let cause =
                json!({"reason": "FieldValueInvalid", "message": invalid, "field": "metadata.uid"});
            let details = json!({"name": name, "group": GROUP, "kind": kind, "causes": [cause]});
            let mut refused = status(422, &message, details);
            refused["reason"] = json!("Invalid");
            return Err(refused);
        }
        ext::merge_patch(&mut object, patch);
        self.store(route.key(), object, false)
    }

    /// GET of one object, or one page of a LIST.
    fn read(&self, route: &Route, query: &Query) -> Result<Value, Value> {
        let st = self.state();
        if let Some(name) = &route.name {
            let object = st.objects.get(&route.key()).cloned();
            return object.ok_or_else(|| not_found(route.res, name));
        }
        let (rv, after) = match query.get("continue").filter(|c| !c.is_empty()) {
            // Our token is "RV/NAMESPACE/NAME" of the last item sent; clients treat it as opaque.
            Some(token) => {
                let mut parts = token.splitn(3, '/').map(str::to_string);
                let bad = || bad_request("continue key is not valid");
                let rv: u64 = parts.next().and_then(|p| p.parse().ok()).ok_or_else(bad)?;
                let after = (parts.next().ok_or_else(bad)?, parts.next().ok_or_else(bad)?);
                if rv < st.compacted_rv {
                    return Err(status(410, CONTINUE_EXPIRED, Value::Null));
                }
                (rv, Some(after))
            }
            None => (list_rv(&st, query)?, None),
        };
        let limit = query
            .get("limit")
            .and_then(|l| l.parse().ok())
            .filter(|l| *l > 0);
        let (mut items, mut last, mut token, mut remaining) = (Vec::new(), None, None, 0u64);
        for (key, obj) in st.snapshot(route.res, rv) {
            let seen = after
                .as_ref()
                .is_some_and(|(ns, name)| (&key.1, &key.2) <= (ns, name));
            if seen || !route.holds(&key) || !selected(&obj, query)? {
                continue;
            }
            if token.is_some() {
                remaining += 1;
                continue;
            }
            if limit == Some(items.len()) {
                token = last
                    .clone()
                    .map(|(_, ns, name): Key| format!("{rv}/{ns}/{name}"));
                remaining = 1;
                continue;
            }
            items.push(obj);
            last = Some(key);
        }
        // As a real server lists custom resources: `continue` always there (empty on the last
        // page), `remainingItemCount` when more pages follow.
        let mut metadata = json!({ "resourceVersion": rv.to_string(), "continue": "" });
        if let Some(token) = token {
            metadata["continue"] = json!(token);
            metadata["remainingItemCount"] = json!(remaining);
        }
        let kind = format!("{}List", route.res.kind());
        let api_version = route.res.api_version();
        Ok(json!({ "apiVersion": api_version, "kind": kind, "metadata": metadata, "items": items }))
    }

    /// Starts a watch: HTTP 200, chunked, one JSON event per line.
    fn watch(&self, route: Route, query: Query) -> Response<Body> {
        let mut st = self.state();
        st.watches += 1;
        if let Err(s) = selected(&json!({}), &query) {
            return reply_status(s);
        }
        let requested = query.get("resourceVersion").cloned().unwrap_or_default();
        let initial = (query.get("sendInitialEvents"))
            .map_or(requested.is_empty() || requested == "0", |v| v == "true");
        let mut queue = VecDeque::new();
        let since = if initial {
            for (key, obj) in st.snapshot(route.res, st.rv) {
                if route.holds(&key) && selected(&obj, &query).unwrap_or(false) {
                    queue.push_back(("ADDED", obj));
                }
            }
            let bookmarks = query
                .get("allowWatchBookmarks")
                .is_some_and(|v| v == "true");
            if query.contains_key("sendInitialEvents") && bookmarks {
                let annotations = json!({ "k8s.io/initial-events-end": "true" });
                let meta =
                    json!({ "resourceVersion": st.rv.to_string(), "annotations": annotations });
                let kind = route.res.kind();
                queue.push_back((
                    "BOOKMARK",
                    json!({ "apiVersion": route.res.api_version(), "kind": kind, "metadata": meta }),
                ));
            }
            st.rv
        } else {
            let Ok(rv) = requested.parse::<u64>() else {
                return reply_status(bad_request("resourceVersion: Invalid value"));
            };
            rv
        };
        let expired = since < st.compacted_rv;
        if expired {
            let msg = format!("too old resource version: {since} ({})", st.compacted_rv);
            queue.push_back(("ERROR", status(410, &msg, Value::Null)));
        }
        // A real server picks 30-60 minutes when timeoutSeconds is not given.
        let timeout = query
            .get("timeoutSeconds")
            .and_then(|t| t.parse().ok())
            .unwrap_or(1800);
        let mut deadline = Instant::now() + Duration::from_secs(timeout);
        if let Some(WatchFault::Cut(after)) = st.watch_fault {
            deadline = deadline.min(Instant::now() + after);
        }
        let cursor = Cursor {
            server: self.clone(),
            generation: st.drop_generation,
            changes: self.inner.changed.subscribe(),
            deadline,
            route,
            query,
            since,
            queue,
            done: expired,
        };
        drop(st);
        let body = StreamBody::new(futures::stream::unfold(cursor, next_event));
        Response::builder()
            .status(StatusCode::OK)
            .header(http::header::CONTENT_TYPE, "application/json")
            .body(body.boxed_unsync())
            .expect("valid watch response")
    }
}

const NO_SUCH_RESOURCE: &str = "the server could not find the requested resource";
const NOT_ALLOWED: &str = "the server does not allow this method on the requested resource";

/// The discovery documents, by group version: what `kubectl api-resources` reads. Core `v1` first,
/// then the groups in `/apis` order.
pub const DISCOVERY: [&str; 4] = ["v1", "apps/v1", "rbac.authorization.k8s.io/v1", API_VERSION];

/// The `APIResourceList.resources` of `group_version`, as kube-apiserver sends them.
fn api_resources(group_version: &str) -> Vec<Value> {
    const VERBS: [&str; 8] = [
        "create",
        "delete",
        "deletecollection",
        "get",
        "list",
        "patch",
        "update",
        "watch",
    ];
    let resource =
        |name: &str, kind: &str, namespaced: bool, short: &[&str], categories: &[&str]| {
            let mut r = json!({ "name": name, "singularName": kind.to_lowercase(),
            "namespaced": namespaced, "kind": kind, "verbs": VERBS });
            if !short.is_empty() {
                r["shortNames"] = json!(short);
            }
            if !categories.is_empty() {
                r["categories"] = json!(categories);
            }
            r
        };
    // Subresources carry no singular name; some answer in another group or kind.
    let sub = |name: &str, kind: &str, group_version: Option<(&str, &str)>, verbs: &[&str]| {
        let mut r = json!({ "name": name, "singularName": "", "namespaced": true, "kind": kind,
            "verbs": verbs });
        if let Some((group, version)) = group_version {
            (r["group"], r["version"]) = (json!(group), json!(version));
        }
        r
    };
    let all = ["all"];
    match group_version {
        "v1" => {
            let mut namespaces = resource("namespaces", "Namespace", false, &["ns"], &[]);
            namespaces["verbs"] = json!([
                "create", "delete", "get", "list", "patch", "update", "watch"
            ]);
            vec![
                resource("configmaps", "ConfigMap", true, &["cm"], &[]),
                namespaces,
                sub("namespaces/finalize", "Namespace", None, &["update"]),
                resource("pods", "Pod", true, &["po"], &all),
                sub(
                    "pods/eviction",
                    "Eviction",
                    Some(("policy", "v1")),
                    &["create"],
                ),
                sub("pods/status", "Pod", None, &["get", "patch", "update"]),
                resource("secrets", "Secret", true, &[], &[]),
                resource("services", "Service", true, &["svc"], &all),
            ]
        }
        "apps/v1" => vec![
            resource("deployments", "Deployment", true, &["deploy"], &all),
            sub(
                "deployments/scale",
                "Scale",
                Some(("autoscaling", "v1")),
                &["get", "patch", "update"],
            ),
            sub(
                "deployments/status",
                "Deployment",
                None,
                &["get", "patch", "update"],
            ),
        ],
        "rbac.authorization.k8s.io/v1" => vec![
            resource("clusterroles", "ClusterRole", false, &[], &[]),
            resource("roles", "Role", true, &[], &[]),
        ],
        API_VERSION => {
            let status = &["get", "patch", "update"];
            let mut clusterlocks_status = sub("clusterlocks/status", "ClusterLock", None, status);
            clusterlocks_status["namespaced"] = json!(false);
            vec![
                resource(
                    "clusterlocks",
                    "ClusterLock",
                    false,
                    &["clk"],
                    &["objectlocks"],
                ),
                clusterlocks_status,
                resource("locks", "Lock", true, &["lk"], &["objectlocks"]),
                sub("locks/status", "Lock", None, status),
            ]
        }
        _ => vec![],
    }
}

/// The discovery document at `path`, if it is one.
fn discovery(path: &str) -> Option<Value> {
    let group_version = match path {
        "/api" => {
            let address = json!({ "clientCIDR": "0.0.0.0/0", "serverAddress": "10.0.0.1:6443" });
            return Some(
                json!({ "kind": "APIVersions", "versions": ["v1"], "serverAddressByClientCIDRs": [address] }),
            );
        }
        "/apis" => {
            let groups: Vec<Value> = DISCOVERY[1..]
                .iter()
                .map(|gv| {
                    let (group, version) = gv.split_once('/').expect("group/version");
                    let version = json!({ "groupVersion": gv, "version": version });
                    json!({ "name": group, "versions": [version], "preferredVersion": version })
                })
                .collect();
            return Some(json!({ "kind": "APIGroupList", "apiVersion": "v1", "groups": groups }));
        }
        "/api/v1" => "v1",
        _ => path
            .strip_prefix("/apis/")
            .filter(|gv| *gv != "v1" && DISCOVERY.contains(gv))?,
    };
    let mut list = json!({ "kind": "APIResourceList", "groupVersion": group_version,
        "resources": api_resources(group_version) });
    // The core list is the only one a real server sends without an apiVersion.
    if group_version != "v1" {
        list["apiVersion"] = json!("v1");
    }
    Some(list)
}

/// A GET of one object outside the lock group: `/api/v1/[namespaces/NS/]PLURAL/NAME` or
/// `/apis/GROUP/VERSION/[namespaces/NS/]PLURAL/NAME`.
struct ObjectRoute {
    group_version: String,
    ns: Option<String>,
    plural: String,
    name: String,
}

impl ObjectRoute {
    fn parse(path: &str) -> Option<ObjectRoute> {
        let segments: Vec<String> = path.split('/').map(decode).collect();
        let (group_version, rest) = match segments.get(1)?.as_str() {
            "api" => (segments.get(2)?.clone(), segments.get(3..)?),
            "apis" => (
                format!("{}/{}", segments.get(2)?, segments.get(3)?),
                segments.get(4..)?,
            ),
            _ => return None,
        };
        let (ns, plural, name) = match rest {
            [namespaces, ns, plural, name] if namespaces == "namespaces" => {
                (Some(ns), plural, name)
            }
            [plural, name] => (None, plural, name),
            _ => return None,
        };
        if group_version == API_VERSION || [plural, name].iter().any(|s| s.is_empty()) {
            return None;
        }
        let (ns, plural, name) = (ns.cloned(), plural.clone(), name.clone());
        Some(ObjectRoute {
            group_version,
            ns,
            plural,
            name,
        })
    }

    /// The discovery entry of the resource, when it is served in this scope.
    fn entry(&self) -> Option<Value> {
        api_resources(&self.group_version)
            .into_iter()
            .find(|r| r["name"] == self.plural.as_str() && r["namespaced"] == self.ns.is_some())
    }

    /// The Status a real server sends for `code` on this GET.
    fn fault(&self, code: u16) -> Value {
        let (plural, name) = (&self.plural, &self.name);
        let group = self.group_version.split_once('/').map_or("", |(g, _)| g);
        let resource = if group.is_empty() {
            plural.clone()
        } else {
            format!("{plural}.{group}")
        };
        let scope = match &self.ns {
            Some(ns) => format!("in the namespace \"{ns}\""),
            None => "at the cluster scope".to_string(),
        };
        match code {
            403 => {
                let msg = format!(
                    "{resource} \"{name}\" is forbidden: User \"{FAKE_USER}\" cannot get resource \
                     \"{plural}\" in API group \"{group}\" {scope}"
                );
                status(
                    403,
                    &msg,
                    json!({ "name": name, "group": group, "kind": plural }),
                )
            }
            _ => {
                let cause = "fault injected by FakeApiServer";
                let msg = format!("Internal error occurred: {cause}");
                status(code, &msg, json!({ "causes": [{ "message": cause }] }))
            }
        }
    }

    fn not_found(&self) -> Value {
        let (plural, name) = (&self.plural, &self.name);
        let mut details = json!({ "name": name, "kind": plural });
        let resource = match self.group_version.split_once('/') {
            Some((group, _)) => {
                details["group"] = json!(group);
                format!("{plural}.{group}")
            }
            None => plural.clone(),
        };
        status(404, &format!("{resource} \"{name}\" not found"), details)
    }
}

const CONTINUE_EXPIRED: &str = "The provided continue parameter is too old to display a \
    consistent list result. You can start a new list without the continue parameter, or use the \
    continue value from the response to resume the list in a new watch.";

/// One open watch stream.
struct Cursor {
    server: FakeApiServer,
    route: Route,
    query: Query,
    /// Every event up to this resourceVersion has been looked at.
    since: u64,
    generation: u64,
    changes: watch::Receiver<()>,
    deadline: Instant,
    /// Events ready to send: (type, object).
    queue: VecDeque<(&'static str, Value)>,
    done: bool,
}

async fn next_event(mut c: Cursor) -> Option<(Result<Frame<Bytes>, Infallible>, Cursor)> {
    loop {
        // A frozen server sends nothing, not even what it had ready.
        c.server.thawed().await;
        if let Some((kind, object)) = c.queue.pop_front() {
            // Written by hand to keep a real server's field order: "type" first.
            let line = format!("{{\"type\":\"{kind}\",\"object\":{object}}}\n");
            return Some((Ok(Frame::data(Bytes::from(line))), c));
        }
        if c.done {
            return None;
        }
        c.changes.borrow_and_update();
        {
            let st = c.server.state();
            if st.stopped || st.drop_generation != c.generation {
                return None;
            }
            let start = st.history.partition_point(|e| e.rv <= c.since);
            for e in &st.history[start..] {
                if c.route.holds(&e.key) && selected(&e.object, &c.query).unwrap_or(false) {
                    c.queue.push_back((e.kind, e.object.clone()));
                }
            }
            c.since = st.rv;
        }
        if c.queue.is_empty() {
            tokio::select! {
                changed = c.changes.changed() => if changed.is_err() { return None },
                () = tokio::time::sleep_until(c.deadline) => return None,
            }
        }
    }
}

fn parse_route(path: &str) -> Option<Route> {
    if let Some(route) = webhooks::route(path) {
        return Some(route);
    }
    let segments: Vec<String> = path.strip_prefix(PREFIX)?.split('/').map(decode).collect();
    let segments: Vec<&str> = segments.iter().map(String::as_str).collect();
    let (res, ns, name) = match segments[..] {
        ["locks"] => (Res::Lock, None, None),
        ["clusterlocks"] => (Res::ClusterLock, None, None),
        ["clusterlocks", name] => (Res::ClusterLock, None, Some(name)),
        ["namespaces", ns, "locks"] => (Res::Lock, Some(ns), None),
        ["namespaces", ns, "locks", name] => (Res::Lock, Some(ns), Some(name)),
        _ => return None,
    };
    if ns.is_some_and(str::is_empty) || name.is_some_and(str::is_empty) {
        return None;
    }
    let (ns, name) = (ns.map(str::to_string), name.map(str::to_string));
    Some(Route { res, ns, name })
}

/// The resourceVersion a LIST without `continue` reads at.
fn list_rv(st: &State, query: &Query) -> Result<u64, Value> {
    let requested = query.get("resourceVersion").map_or("", String::as_str);
    if requested.is_empty() || requested == "0" {
        return Ok(st.rv);
    }
    let Ok(rv) = requested.parse::<u64>() else {
        return Err(bad_request("resourceVersion: Invalid value"));
    };
    if rv > st.rv {
        let msg = format!("Too large resource version: {rv}, current: {}", st.rv);
        let cause =
            json!({ "reason": "ResourceVersionTooLarge", "message": "Too large resource version" });
        return Err(status(
            504,
            &msg,
            json!({ "causes": [cause], "retryAfterSeconds": 1 }),
        ));
    }
    let exact = query
        .get("resourceVersionMatch")
        .is_some_and(|m| m == "Exact");
    if exact && rv < st.compacted_rv {
        let msg = format!("too old resource version: {rv} ({})", st.compacted_rv);
        return Err(status(410, &msg, Value::Null));
    }
    Ok(if exact { rv } else { st.rv })
}

/// Whether `obj` matches the query's `fieldSelector` and `labelSelector` (equality terms only).
/// Selector syntax this fake does not understand is a 400, so a test never passes by accident.
fn selected(obj: &Value, query: &Query) -> Result<bool, Value> {
    let meta = &obj["metadata"];
    for (param, labels) in [("fieldSelector", false), ("labelSelector", true)] {
        let value = |key: &str| match (labels, key.trim()) {
            (true, key) => Ok(meta["labels"][key].as_str()),
            (false, "metadata.name") => Ok(meta["name"].as_str()),
            (false, "metadata.namespace") => Ok(Some(meta["namespace"].as_str().unwrap_or(""))),
            (false, key) => Err(bad_request(&format!("field label not supported: {key}"))),
        };
        let terms = query
            .get(param)
            .map_or("", String::as_str)
            .split(',')
            .map(str::trim);
        for term in terms.filter(|t| !t.is_empty()) {
            let is_key = |k: &str| {
                k.chars()
                    .all(|c| c.is_ascii_alphanumeric() || "-_./".contains(c))
            };
            let matches = if let Some((k, v)) = term.split_once("!=") {
                value(k)? != Some(v.trim())
            } else if let Some((k, v)) = term.split_once("==").or_else(|| term.split_once('=')) {
                value(k)? == Some(v.trim())
            } else if let Some(k) = term.strip_prefix('!').filter(|k| labels && is_key(k)) {
                value(k)?.is_none()
            } else if labels && is_key(term) {
                value(term)?.is_some()
            } else {
                return Err(bad_request(&format!(
                    "unable to parse requirement: {param}={term}"
                )));
            };
            if !matches {
                return Ok(false);
            }
        }
    }
    Ok(true)
}

/// Percent-decoding of one path segment or query key/value.
fn decode(s: &str) -> String {
    let (bytes, mut out, mut i) = (s.as_bytes(), Vec::new(), 0);
    while i < bytes.len() {
        let hex = bytes
            .get(i + 1..i + 3)
            .and_then(|h| std::str::from_utf8(h).ok());
        match (bytes[i], hex.and_then(|h| u8::from_str_radix(h, 16).ok())) {
            (b'%', Some(byte)) => (out.push(byte), i += 3),
            (byte, _) => (out.push(byte), i += 1),
        };
    }
    String::from_utf8_lossy(&out).into_owned()
}

/// A failure `Status` as kube-apiserver writes it.
fn status(code: u16, message: &str, details: Value) -> Value {
    let reason = match code {
        400 => "BadRequest",
        401 => "Unauthorized",
        403 => "Forbidden",
        404 => "NotFound",
        405 => "MethodNotAllowed",
        409 => "AlreadyExists",
        410 => "Expired",
        415 => "UnsupportedMediaType",
        422 => "Invalid",
        429 => "TooManyRequests",
        503 => "ServiceUnavailable",
        504 => "Timeout",
        _ => "InternalError",
    };
    let mut s = json!({ "kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure",
        "message": message, "reason": reason, "code": code });
    if !details.is_null() {
        s["details"] = details;
    }
    s
}

fn bad_request(message: &str) -> Value {
    status(400, message, Value::Null)
}

fn details(res: Res, name: &str) -> Value {
    let mut details = json!({ "group": res.group(), "kind": res.plural() });
    if !name.is_empty() {
        details["name"] = json!(name);
    }
    details
}

fn not_found(res: Res, name: &str) -> Value {
    let msg = format!("{}.{} \"{name}\" not found", res.plural(), res.group());
    status(404, &msg, details(res, name))
}

/// `object` as a metadata-only GET returns it (`Accept: application/json;as=PartialObjectMetadata`).
fn partial_metadata(object: Value) -> Value {
    json!({ "kind": "PartialObjectMetadata", "apiVersion": "meta.k8s.io/v1",
        "metadata": object["metadata"].clone() })
}

/// The Status a real server sends for `code` on this LIST or GET.
fn fault_status(code: u16, route: &Route) -> Value {
    let (plural, group) = (route.res.plural(), route.res.group());
    let (verb, name) = match &route.name {
        Some(name) => ("get", format!(" \"{name}\"")),
        None => ("list", String::new()),
    };
    let scope = match &route.ns {
        Some(ns) => format!("in the namespace \"{ns}\""),
        None => "at the cluster scope".to_string(),
    };
    match code {
        403 => {
            let msg = format!(
                "{plural}.{group}{name} is forbidden: User \"{FAKE_USER}\" cannot {verb} resource \
                 \"{plural}\" in API group \"{group}\" {scope}"
            );
            status(
                403,
                &msg,
                details(route.res, route.name.as_deref().unwrap_or_default()),
            )
        }
        401 => status(401, "Unauthorized", Value::Null),
        _ => {
            let cause = "fault injected by FakeApiServer";
            let msg = format!("Internal error occurred: {cause}");
            status(code, &msg, json!({ "causes": [{ "message": cause }] }))
        }
    }
}

/// The Status a real server sends for `code` on a WATCH of this collection.
fn watch_fault_status(code: u16, route: &Route) -> Value {
    if code != 403 {
        return fault_status(code, route);
    }
    let (plural, group) = (route.res.plural(), route.res.group());
    let scope = match &route.ns {
        Some(ns) => format!("in the namespace \"{ns}\""),
        None => "at the cluster scope".to_string(),
    };
    let msg = format!(
        "{plural}.{group} is forbidden: User \"{FAKE_USER}\" cannot watch resource \"{plural}\" \
         in API group \"{group}\" {scope}"
    );
    status(403, &msg, details(route.res, ""))
}

fn reply_status(status: Value) -> Response<Body> {
    let code = status["code"].as_u64().and_then(|c| u16::try_from(c).ok());
    reply(code.unwrap_or(500), status)
}

fn reply(code: u16, body: Value) -> Response<Body> {
    let bytes = serde_json::to_vec(&body).expect("json serializes");
    Response::builder()
        .status(code)
        .header(http::header::CONTENT_TYPE, "application/json")
        .body(Full::new(Bytes::from(bytes)).boxed_unsync())
        .expect("valid response")
}
