//! A scripted fake Kubernetes API server, for what a real one cannot do on demand: freeze
//! (accept and never answer), drop or expire (410) watches, refuse connections, answer scripted
//! error statuses, and count requests. Plain HTTP/1.1 on `127.0.0.1:0`, for a real `kube::Client`.
//!
//! It holds Locks and ClusterLocks (LIST, GET, POST, DELETE, merge PATCH, WATCH from a
//! resourceVersion; a PATCH of `status` replaces it, as for one field manager), and any other
//! object as a path → JSON store (GET; POST adds; PATCH merges). API semantics (server-side
//! apply between managers, validation, discovery) are the end-to-end suite's.
#![allow(dead_code)] // each test binary uses a different part of this module

use std::collections::{BTreeMap, VecDeque};
use std::convert::Infallible;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use bytes::Bytes;
use http::{Method, Request, Response};
use http_body_util::{BodyExt, Full, StreamBody, combinators::UnsyncBoxBody};
use hyper::body::{Frame, Incoming};
use hyper_util::rt::TokioIo;
use serde_json::{Value, json};
use tokio::{net::TcpListener, sync::watch, task::JoinHandle, task::JoinSet, time::Instant};

const PREFIX: &str = "/apis/objectlock.dev/v1alpha1/";
type Body = UnsyncBoxBody<Bytes, Infallible>;
/// `(plural, namespace ("" when cluster-scoped), name)`.
type Key = (&'static str, String, String);

/// The key of Lock `namespace/name`, or of ClusterLock `name` when `namespace` is "".
fn key(namespace: &str, name: &str) -> Key {
    let plural = if namespace.is_empty() {
        "clusterlocks"
    } else {
        "locks"
    };
    (plural, namespace.into(), name.into())
}

/// A scripted answer to the requests a fault is set for.
#[derive(Clone, Debug)]
pub enum Fault {
    /// Answer with a `Status` of this HTTP code (403, 500, 429 with `Retry-After`, ...).
    Status(u16),
    /// Sleep this long, then answer normally.
    Delay(Duration),
    /// (Watches only) end the stream this long after it started, as a proxy cutting long
    /// requests does.
    Cut(Duration),
}

#[derive(Default)]
struct State {
    rv: u64,
    locks: BTreeMap<Key, Value>,
    /// Every change to a lock: (resourceVersion, event type, key, object).
    history: Vec<(u64, &'static str, Key, Value)>,
    /// A watch from before this resourceVersion gets 410 Gone.
    compacted_rv: u64,
    /// Bumped by [`FakeApiServer::drop_watches`]: open streams of an older generation end.
    generation: u64,
    frozen: bool,
    fault: Option<Fault>,
    object_fault: Option<Fault>,
    watch_fault: Option<Fault>,
    patch_faults: VecDeque<u16>,
    /// Objects other than locks, by path (`/api/v1/namespaces/prod/pods/db-0`).
    others: BTreeMap<String, Value>,
    /// Every request as `"METHOD /path?query"`.
    log: Vec<String>,
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
        let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
        let server = FakeApiServer {
            inner: Arc::new(Inner {
                url: format!("http://{}", listener.local_addr().expect("local_addr")),
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

    /// Creates Lock `namespace/name` (ClusterLock `name` when `namespace` is ""), event
    /// `ADDED`; if it exists, replaces its spec (event `MODIFIED`).
    pub fn create_lock(&self, namespace: &str, name: &str, spec: Value) {
        self.put(key(namespace, name), json!({ "spec": spec }));
    }

    /// Deletes a lock (event `DELETED`); false if there was none.
    pub fn delete_lock(&self, namespace: &str, name: &str) -> bool {
        self.remove(&key(namespace, name)).is_some()
    }

    /// The lock as a GET returns it (namespace "" for a ClusterLock).
    pub fn lock(&self, namespace: &str, name: &str) -> Option<Value> {
        self.state().locks.get(&key(namespace, name)).cloned()
    }

    /// Adds an object, with a uid, to the collection at `collection`, e.g.
    /// `add_object("/apis/apps/v1/namespaces/prod/deployments", json!({"metadata": {"name": "web"}}))`.
    pub fn add_object(&self, collection: &str, mut object: Value) {
        let name = object["metadata"]["name"].as_str().expect("metadata.name");
        let path = format!("{collection}/{name}");
        let mut st = self.state();
        let uid = format!("00000000-0000-4000-9000-{:012x}", st.others.len());
        object["metadata"]["uid"] = json!(uid);
        st.others.insert(path, object);
    }

    /// Answers every GET and POST of `path` (any query) with `body`, e.g. a discovery document.
    pub fn answer(&self, path: &str, body: Value) {
        self.state().others.insert(path.into(), body);
    }

    /// The objects other than locks whose path starts with `prefix` (events written, ...).
    pub fn objects(&self, prefix: &str) -> Vec<Value> {
        let st = self.state();
        let found = st.others.iter().filter(|(p, _)| p.starts_with(prefix));
        found.map(|(_, object)| object.clone()).collect()
    }

    /// Every request as `"METHOD /path?query"`, in arrival order.
    pub fn request_log(&self) -> Vec<String> {
        self.state().log.clone()
    }

    /// LIST requests of locks whose `path?query` contains `path_contains` (faulted ones too).
    pub fn list_calls(&self, path_contains: &str) -> usize {
        self.lists(|target| !target.contains("watch=") && target.contains(path_contains))
    }

    pub fn watch_calls(&self) -> usize {
        self.lists(|target| target.contains("watch="))
    }

    fn lists(&self, wanted: impl Fn(&str) -> bool) -> usize {
        let st = self.state();
        let gets = st.log.iter().filter_map(|r| r.strip_prefix("GET "));
        let lists = gets.filter(|t| t.starts_with(PREFIX));
        let lists = lists.filter(|t| t.split('?').next().is_some_and(|p| p.ends_with("locks")));
        lists.filter(|t| wanted(t)).count()
    }

    /// GETs of objects other than locks so far whose path contains `path_contains`.
    pub fn object_gets(&self, path_contains: &str) -> usize {
        let st = self.state();
        let gets = st.log.iter().filter_map(|r| r.strip_prefix("GET "));
        gets.filter(|t| !t.starts_with(PREFIX) && t.contains(path_contains))
            .count()
    }

    /// Injects `fault` into every later LIST and GET of locks (`None`: ends it).
    pub fn set_fault(&self, fault: Option<Fault>) {
        self.state().fault = fault;
    }

    /// Injects `fault` into every later GET of another object (`None`: ends it).
    pub fn set_object_fault(&self, fault: Option<Fault>) {
        self.state().object_fault = fault;
    }

    /// Injects `fault` into every later WATCH (`None`: ends it); open streams go on.
    pub fn set_watch_fault(&self, fault: Option<Fault>) {
        self.state().watch_fault = fault;
    }

    /// Answers the next `count` PATCHes of locks (or their status) with a `Status` of `code`.
    pub fn fail_patches(&self, count: usize, code: u16) {
        (self.state().patch_faults).extend(std::iter::repeat_n(code, count));
    }

    /// Compacts history as etcd does (bumping the resourceVersion, as other objects would):
    /// every watch from an older resourceVersion gets an `ERROR` 410 event. Open streams go on.
    pub fn compact(&self) {
        let mut st = self.state();
        st.rv += 1;
        st.compacted_rv = st.rv;
    }

    /// Ends every open watch stream now, cleanly, as a server-side watch timeout does.
    pub fn drop_watches(&self) {
        self.state().generation += 1;
        self.notify();
    }

    /// Freezes the server as SIGSTOP does: connections are accepted, nothing is answered and
    /// open watches send nothing, until [`FakeApiServer::thaw`] (then what waited is answered).
    pub fn freeze(&self) {
        self.state().frozen = true;
        self.notify();
    }

    pub fn thaw(&self) {
        self.state().frozen = false;
        self.notify();
    }

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

    /// Records a change under a new resourceVersion; returns the object as stored.
    fn emit(&self, kind: &'static str, key: Key, mut object: Value) -> Value {
        let mut st = self.state();
        st.rv += 1;
        let rv = st.rv;
        object["metadata"]["resourceVersion"] = json!(rv.to_string());
        st.history.push((rv, kind, key.clone(), object.clone()));
        if kind == "DELETED" {
            st.locks.remove(&key);
        } else {
            st.locks.insert(key, object.clone());
        }
        drop(st);
        self.notify();
        object
    }

    /// Stores `body` under `key`, keeping the uid and status of the lock it replaces.
    fn put(&self, key: Key, mut body: Value) -> Value {
        let old = self.state().locks.get(&key).cloned();
        let (plural, ns, name) = key.clone();
        let cluster = plural == "clusterlocks";
        body["apiVersion"] = json!("objectlock.dev/v1alpha1");
        body["kind"] = json!(if cluster { "ClusterLock" } else { "Lock" });
        // The status belongs to its subresource: a write of the spec keeps it.
        if let Some(status) = old.as_ref().and_then(|o| o.get("status")) {
            body["status"] = status.clone();
        }
        let rv = self.state().rv;
        let new_uid = || json!(format!("00000000-0000-4000-8000-{rv:012x}"));
        let meta = &mut body["metadata"];
        meta["name"] = json!(name);
        if !cluster {
            meta["namespace"] = json!(ns);
        }
        meta["uid"] = old
            .as_ref()
            .map_or_else(new_uid, |o| o["metadata"]["uid"].clone());
        meta["creationTimestamp"] = json!("2026-01-01T00:00:00Z");
        self.emit(if old.is_some() { "MODIFIED" } else { "ADDED" }, key, body)
    }

    fn remove(&self, key: &Key) -> Option<Value> {
        let object = self.state().locks.get(key).cloned()?;
        Some(self.emit("DELETED", key.clone(), object))
    }

    async fn handle(self, req: Request<Incoming>) -> Result<Response<Body>, Infallible> {
        self.thawed().await;
        let (parts, body) = req.into_parts();
        let (method, path, query) = (&parts.method, parts.uri.path(), parts.uri.query());
        let target = parts.uri.path_and_query().map_or(path, |p| p.as_str());
        self.state().log.push(format!("{method} {target}"));
        let body = body.collect().await.map(|b| b.to_bytes());
        let body: Value = serde_json::from_slice(&body.unwrap_or_default()).unwrap_or_default();
        let segments: Vec<&str> = path.strip_prefix(PREFIX).unwrap_or("").split('/').collect();
        let (plural, ns, name, status) = match segments[..] {
            ["locks"] => ("locks", None, None, false),
            ["clusterlocks"] => ("clusterlocks", None, None, false),
            ["clusterlocks", n] => ("clusterlocks", None, Some(n), false),
            ["clusterlocks", n, "status"] => ("clusterlocks", None, Some(n), true),
            ["namespaces", ns, "locks"] => ("locks", Some(ns), None, false),
            ["namespaces", ns, "locks", n] => ("locks", Some(ns), Some(n), false),
            ["namespaces", ns, "locks", n, "status"] => ("locks", Some(ns), Some(n), true),
            _ => return Ok(reply(self.other(method, path, body).await)),
        };
        let key: Key = (plural, ns.unwrap_or("").into(), name.unwrap_or("").into());
        let what = format!("{plural}.objectlock.dev \"{}\"", key.2);
        let param = |name: &str| {
            let mut pairs = query.unwrap_or("").split('&');
            pairs.find_map(|kv| kv.strip_prefix(name)?.strip_prefix('='))
        };
        if *method == Method::GET && name.is_none() && matches!(param("watch"), Some("true" | "1"))
        {
            let injected = self.state().watch_fault.clone();
            match injected {
                Some(Fault::Status(code)) => return Ok(reply(fault(code, "watch", &what))),
                Some(Fault::Delay(delay)) => tokio::time::sleep(delay).await,
                _ => {}
            }
            let since = param("resourceVersion").and_then(|rv| rv.parse().ok());
            let timeout = param("timeoutSeconds").and_then(|t| t.parse().ok());
            let ns = ns.map(str::to_string);
            let holds = move |(p, n, _): &Key| *p == plural && ns.as_ref().is_none_or(|ns| ns == n);
            return Ok(self.watch(Box::new(holds), since, timeout));
        }
        if *method == Method::GET {
            let verb = if name.is_some() { "get" } else { "list" };
            let injected = self.state().fault.clone();
            if let Some(answer) = inject(injected, verb, &what).await {
                return Ok(reply(answer));
            }
        }
        Ok(reply(
            self.lock_request(method, key, ns, status, body, &what),
        ))
    }

    fn lock_request(
        &self,
        method: &Method,
        key: Key,
        ns: Option<&str>,
        status_only: bool,
        body: Value,
        what: &str,
    ) -> (u16, Value) {
        let not_found = || (404, status(404, &format!("{what} not found")));
        let current = self.state().locks.get(&key).cloned();
        // A uid in a patch or a precondition that is not the lock's: it was replaced meanwhile.
        let replaced =
            |lock: &Value, uid: &Value| uid.is_string() && lock["metadata"]["uid"] != *uid;
        match *method {
            Method::GET if key.2.is_empty() => {
                let st = self.state();
                let items: Vec<Value> = (st.locks.iter())
                    .filter(|((p, n, _), _)| *p == key.0 && ns.is_none_or(|ns| ns == n))
                    .map(|(_, lock)| lock.clone())
                    .collect();
                let metadata = json!({ "resourceVersion": st.rv.to_string() });
                let v = "objectlock.dev/v1alpha1";
                let list = json!({ "apiVersion": v, "kind": "List", "metadata": metadata, "items": items });
                (200, list)
            }
            Method::GET => current.map_or_else(not_found, |lock| (200, lock)),
            Method::POST => {
                let name = body["metadata"]["name"].as_str().unwrap_or_default();
                let key = (key.0, key.1, name.to_string());
                if self.state().locks.contains_key(&key) {
                    let what = format!("{}.objectlock.dev \"{name}\"", key.0);
                    return (409, status(409, &format!("{what} already exists")));
                }
                (201, self.put(key, body))
            }
            Method::PATCH => {
                if let Some(code) = self.state().patch_faults.pop_front() {
                    return fault(code, "patch", what);
                }
                let Some(mut lock) = current else {
                    return not_found();
                };
                if replaced(&lock, &body["metadata"]["uid"]) {
                    let msg = format!("{what} is invalid: metadata.uid: field is immutable");
                    return (422, status(422, &msg));
                }
                if status_only {
                    lock["status"] = body["status"].clone();
                    return (200, self.emit("MODIFIED", key, lock));
                }
                merge_patch(&mut lock, &body);
                (200, self.put(key, lock))
            }
            Method::DELETE => match current {
                None => not_found(),
                Some(lock) if replaced(&lock, &body["preconditions"]["uid"]) => {
                    let msg = format!("Operation cannot be fulfilled on {what}: the UID differs");
                    let mut conflict = status(409, &msg);
                    conflict["reason"] = json!("Conflict");
                    (409, conflict)
                }
                Some(_) => (200, self.remove(&key).expect("present")),
            },
            _ => (405, status(405, "not faked")),
        }
    }

    /// Any other path: GET of what was added; POST adds (or answers what was); PATCH merges.
    async fn other(&self, method: &Method, path: &str, body: Value) -> (u16, Value) {
        let mut segments = path.rsplit('/');
        let (name, plural) = (segments.next().unwrap_or(""), segments.next().unwrap_or(""));
        let what = format!("{plural} \"{name}\"");
        if *method == Method::GET {
            let injected = self.state().object_fault.clone();
            if let Some(answer) = inject(injected, "get", &what).await {
                return answer;
            }
        }
        let mut st = self.state();
        match (method, st.others.get(path)) {
            (&Method::GET | &Method::POST, Some(object)) => (200, object.clone()),
            (&Method::GET, None) => (404, status(404, &format!("{what} not found"))),
            (&Method::POST, None) => {
                let name = body["metadata"]["name"].as_str().unwrap_or_default();
                st.others.insert(format!("{path}/{name}"), body.clone());
                (201, body)
            }
            _ => {
                let object = st.others.entry(path.into()).or_insert(json!({}));
                merge_patch(object, &body);
                (200, object.clone())
            }
        }
    }

    /// A watch: HTTP 200, one JSON event per line, from `since` (or the current objects).
    fn watch(
        &self,
        holds: Box<dyn Fn(&Key) -> bool + Send>,
        since: Option<u64>,
        timeout: Option<u64>,
    ) -> Response<Body> {
        let st = self.state();
        let mut queue = VecDeque::new();
        let since = since.filter(|rv| *rv > 0).unwrap_or_else(|| {
            let current = st.locks.iter().filter(|(k, _)| holds(k));
            queue.extend(current.map(|(_, lock)| ("ADDED", lock.clone())));
            st.rv
        });
        let expired = since < st.compacted_rv;
        if expired {
            let msg = format!("too old resource version: {since} ({})", st.compacted_rv);
            queue.push_back(("ERROR", status(410, &msg)));
        }
        let mut deadline = Instant::now() + Duration::from_secs(timeout.unwrap_or(1800));
        if let Some(Fault::Cut(after)) = st.watch_fault {
            deadline = deadline.min(Instant::now() + after);
        }
        let cursor = Cursor {
            server: self.clone(),
            holds,
            since,
            generation: st.generation,
            changes: self.inner.changed.subscribe(),
            deadline,
            queue,
            done: expired,
        };
        drop(st);
        let events = StreamBody::new(futures::stream::unfold(cursor, next_event));
        Response::new(events.boxed_unsync())
    }
}

/// One open watch stream.
struct Cursor {
    server: FakeApiServer,
    holds: Box<dyn Fn(&Key) -> bool + Send>,
    /// Every change up to this resourceVersion has been looked at.
    since: u64,
    generation: u64,
    changes: watch::Receiver<()>,
    deadline: Instant,
    queue: VecDeque<(&'static str, Value)>,
    done: bool,
}

async fn next_event(mut c: Cursor) -> Option<(Result<Frame<Bytes>, Infallible>, Cursor)> {
    loop {
        // A frozen server sends nothing, not even what it had ready.
        c.server.thawed().await;
        if let Some((kind, object)) = c.queue.pop_front() {
            let line = format!("{{\"type\":\"{kind}\",\"object\":{object}}}\n");
            return Some((Ok(Frame::data(Bytes::from(line))), c));
        }
        if c.done {
            return None;
        }
        c.changes.borrow_and_update();
        {
            let st = c.server.state();
            if st.generation != c.generation {
                return None;
            }
            let new = (st.history.iter()).filter(|(rv, _, key, _)| *rv > c.since && (c.holds)(key));
            c.queue
                .extend(new.map(|(_, kind, _, object)| (*kind, object.clone())));
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

/// Sleeps for a `Delay`; for a `Status`, the answer to send instead.
async fn inject(fault: Option<Fault>, verb: &str, what: &str) -> Option<(u16, Value)> {
    match fault? {
        Fault::Status(code) => Some(self::fault(code, verb, what)),
        Fault::Delay(delay) | Fault::Cut(delay) => {
            tokio::time::sleep(delay).await;
            None
        }
    }
}

/// RFC 7386 JSON merge patch.
fn merge_patch(target: &mut Value, patch: &Value) {
    let Some(fields) = patch.as_object() else {
        *target = patch.clone();
        return;
    };
    if !target.is_object() {
        *target = json!({});
    }
    for (key, value) in fields {
        if value.is_null() {
            target.as_object_mut().map(|t| t.remove(key));
        } else {
            merge_patch(&mut target[key.as_str()], value);
        }
    }
}

/// A failure `Status` as kube-apiserver writes it.
fn status(code: u16, message: &str) -> Value {
    let reason = match code {
        403 => "Forbidden",
        404 => "NotFound",
        409 => "AlreadyExists",
        410 => "Expired",
        422 => "Invalid",
        429 => "TooManyRequests",
        _ => "InternalError",
    };
    json!({ "kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure",
        "message": message, "reason": reason, "code": code })
}

/// The scripted answer `code` to a `verb` of `what` (`pods "db-0"`).
fn fault(code: u16, verb: &str, what: &str) -> (u16, Value) {
    let injected = "fault injected by FakeApiServer";
    let message = match code {
        403 => format!(
            "{what} is forbidden: User \"system:serviceaccount:kube-object-lock:kube-object-lock\" cannot {verb} it ({injected})"
        ),
        _ => format!("Internal error occurred: {injected}"),
    };
    (code, status(code, &message))
}

fn reply((code, body): (u16, Value)) -> Response<Body> {
    let mut answer = Response::builder()
        .status(code)
        .header(http::header::CONTENT_TYPE, "application/json");
    if code == 429 {
        answer = answer.header(http::header::RETRY_AFTER, "1");
    }
    let body = Full::new(Bytes::from(body.to_string())).boxed_unsync();
    answer.body(body).expect("valid response")
}
