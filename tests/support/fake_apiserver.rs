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
/// The user named in `Forbidden` messages.
pub const FAKE_USER: &str = "system:serviceaccount:kube-object-lock:kube-object-lock";
const INJECTED: &str = "fault injected by FakeApiServer";

type Body = UnsyncBoxBody<Bytes, Infallible>;
type Query = BTreeMap<String, String>;
/// `(plural, namespace ("" when cluster-scoped), name)`.
type Key = (&'static str, String, String);

/// A fault injected into the answers of LIST and GET (of Locks, or of other objects).
#[derive(Clone, Debug)]
pub enum Fault {
    /// Answer with a `Status` of this HTTP code (403, 500, 429 with `Retry-After`, ...).
    Status(u16),
    /// Sleep this long, then answer normally.
    Delay(Duration),
}

/// A fault injected into WATCH requests (never into LIST or GET).
#[derive(Clone, Debug)]
pub enum WatchFault {
    /// Refuse every WATCH with a `Status` of this HTTP code (403: may list but not watch).
    Status(u16),
    /// Hold every WATCH this long before answering.
    Delay(Duration),
    /// End every watch stream this long after it started, as a proxy cutting long requests does.
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
    stopped: bool,
    frozen: bool,
    fault: Option<Fault>,
    object_fault: Option<Fault>,
    watch_fault: Option<WatchFault>,
    patch_faults: VecDeque<u16>,
    /// Objects other than locks, by path (`/api/v1/namespaces/prod/pods/db-0`).
    others: BTreeMap<String, Value>,
    /// Every request as `"METHOD /path?query"`, with its JSON body (`Null` when none).
    log: Vec<(String, Value)>,
    watches: usize,
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
        self.put(
            ("locks", namespace.into(), name.into()),
            json!({ "spec": spec }),
        );
    }

    /// Creates a `ClusterLock` (event `ADDED`); if it exists, replaces its spec (`MODIFIED`).
    pub fn create_cluster_lock(&self, name: &str, spec: Value) {
        self.put(
            ("clusterlocks", String::new(), name.into()),
            json!({ "spec": spec }),
        );
    }

    /// Deletes a `Lock` (event `DELETED`); false if there was none.
    pub fn delete_lock(&self, namespace: &str, name: &str) -> bool {
        self.remove(&("locks", namespace.into(), name.into()))
            .is_some()
    }

    /// The `Lock` stored as `namespace/name`, as a GET returns it.
    pub fn lock(&self, namespace: &str, name: &str) -> Option<Value> {
        (self.state().locks)
            .get(&("locks", namespace.into(), name.into()))
            .cloned()
    }

    /// The `ClusterLock` stored as `name`, as a GET returns it.
    pub fn cluster_lock(&self, name: &str) -> Option<Value> {
        (self.state().locks)
            .get(&("clusterlocks", String::new(), name.into()))
            .cloned()
    }

    /// Adds an object to the collection at `collection`, e.g.
    /// `add_object("/apis/apps/v1/namespaces/prod/deployments", json!({"metadata": {"name": "web"}}))`;
    /// a uid and the namespace (of a namespaced collection) are filled in.
    pub fn add_object(&self, collection: &str, mut object: Value) {
        let name = object["metadata"]["name"].as_str().expect("metadata.name");
        let path = format!("{collection}/{name}");
        let segments: Vec<&str> = collection.split('/').collect();
        if let Some(i) = segments.iter().position(|s| *s == "namespaces")
            && let Some(ns) = segments.get(i + 1).filter(|_| i + 2 < segments.len())
        {
            object["metadata"]["namespace"] = json!(ns);
        }
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
        let found = st
            .others
            .iter()
            .filter(|(path, _)| path.starts_with(prefix));
        found.map(|(_, object)| object.clone()).collect()
    }

    /// Every request as `"METHOD /path?query"`, in arrival order.
    pub fn request_log(&self) -> Vec<String> {
        self.state().log.iter().map(|(r, _)| r.clone()).collect()
    }

    /// The JSON bodies of the requests whose `"METHOD /path?query"` starts with `prefix`.
    pub fn bodies(&self, prefix: &str) -> Vec<Value> {
        let st = self.state();
        let sent = st.log.iter().filter(|(r, _)| r.starts_with(prefix));
        sent.map(|(_, body)| body.clone()).collect()
    }

    /// LIST requests of locks received so far (faulted ones included).
    pub fn list_calls(&self) -> usize {
        self.lists(|_| true)
    }

    /// LIST requests of locks whose `path?query` contains `path_contains`.
    pub fn list_calls_for(&self, path_contains: &str) -> usize {
        self.lists(|target| target.contains(path_contains))
    }

    /// LIST requests of locks whose path is exactly `path` (any query).
    pub fn list_calls_exact(&self, path: &str) -> usize {
        self.lists(|target| target.split('?').next() == Some(path))
    }

    fn lists(&self, wanted: impl Fn(&str) -> bool) -> usize {
        let st = self.state();
        let lists = st.log.iter().filter_map(|(r, _)| r.strip_prefix("GET "));
        let lists = lists.filter(|t| t.starts_with(PREFIX) && !t.contains("watch="));
        let lists = lists.filter(|t| t.split('?').next().is_some_and(|p| p.ends_with("locks")));
        lists.filter(|t| wanted(t)).count()
    }

    /// WATCH requests received so far.
    pub fn watch_calls(&self) -> usize {
        self.state().watches
    }

    /// GETs of objects other than locks so far whose path contains `path_contains`.
    pub fn object_gets(&self, path_contains: &str) -> usize {
        let st = self.state();
        let gets = st.log.iter().filter_map(|(r, _)| r.strip_prefix("GET "));
        gets.filter(|t| !t.starts_with(PREFIX) && t.contains(path_contains))
            .count()
    }

    /// Injects `fault` into every later LIST and GET of locks until [`FakeApiServer::clear_fault`].
    pub fn set_fault(&self, fault: Fault) {
        self.state().fault = Some(fault);
    }

    pub fn clear_fault(&self) {
        self.state().fault = None;
    }

    /// Injects `fault` into every later GET of another object until
    /// [`FakeApiServer::clear_object_fault`].
    pub fn set_object_fault(&self, fault: Fault) {
        self.state().object_fault = Some(fault);
    }

    pub fn clear_object_fault(&self) {
        self.state().object_fault = None;
    }

    /// Injects `fault` into every later WATCH until [`FakeApiServer::clear_watch_fault`]; open
    /// streams go on.
    pub fn set_watch_fault(&self, fault: WatchFault) {
        self.state().watch_fault = Some(fault);
    }

    pub fn clear_watch_fault(&self) {
        self.state().watch_fault = None;
    }

    /// Answers the next `count` merge PATCHes of locks with a `Status` of HTTP `code`.
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

    /// Compacts and drops the watches: every resume gets 410 and must list again.
    pub fn expire_watches(&self) {
        self.compact();
        self.drop_watches();
    }

    /// Freezes the server as SIGSTOP does: connections are accepted, nothing is answered and
    /// open watches send nothing, until [`FakeApiServer::thaw`].
    pub fn freeze(&self) {
        self.state().frozen = true;
        self.notify();
    }

    /// Ends [`FakeApiServer::freeze`]: what waited is answered, streams go on.
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

    /// Records a change under a new resourceVersion; returns the object as stored.
    fn emit(&self, kind: &'static str, key: Key, mut object: Value) -> Value {
        let mut st = self.state();
        st.rv += 1;
        object["metadata"]["resourceVersion"] = json!(st.rv.to_string());
        let rv = st.rv;
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

    /// Stores `body` under `key`, keeping the uid of the lock it replaces: ADDED or MODIFIED.
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
        let meta = &mut body["metadata"];
        meta["name"] = json!(name);
        if !cluster {
            meta["namespace"] = json!(ns);
        }
        let uid = old.as_ref().map(|o| o["metadata"]["uid"].clone());
        let rv = self.state().rv;
        meta["uid"] = uid.unwrap_or_else(|| json!(format!("00000000-0000-4000-8000-{rv:012x}")));
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
        let (method, path) = (parts.method, parts.uri.path().to_string());
        let target = parts.uri.path_and_query().map_or("/", |p| p.as_str());
        let body = body
            .collect()
            .await
            .map(|b| b.to_bytes())
            .unwrap_or_default();
        let body: Value = serde_json::from_slice(&body).unwrap_or(Value::Null);
        (self.state().log).push((format!("{method} {target}"), body.clone()));
        // Only plain values are read (watch, resourceVersion, timeoutSeconds): no decoding.
        let query: Query = (parts.uri.query().unwrap_or("").split('&'))
            .filter_map(|kv| kv.split_once('='))
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect();
        let segments: Vec<&str> = path
            .strip_prefix(PREFIX)
            .map_or(vec![], |p| p.split('/').collect());
        let (plural, ns, name, sub) = match segments[..] {
            ["locks"] => ("locks", None, None, None),
            ["clusterlocks"] => ("clusterlocks", None, None, None),
            ["clusterlocks", n] => ("clusterlocks", None, Some(n), None),
            ["clusterlocks", n, s] => ("clusterlocks", None, Some(n), Some(s)),
            ["namespaces", ns, "locks"] => ("locks", Some(ns), None, None),
            ["namespaces", ns, "locks", n] => ("locks", Some(ns), Some(n), None),
            ["namespaces", ns, "locks", n, s] => ("locks", Some(ns), Some(n), Some(s)),
            _ => return Ok(self.other(&method, &path, body).await),
        };
        let key: Key = (plural, ns.unwrap_or("").into(), name.unwrap_or("").into());
        let what = name.map_or(format!("{plural}.objectlock.dev"), |n| {
            format!("{plural}.objectlock.dev \"{n}\"")
        });
        let answer = match (method, name) {
            (Method::GET, None)
                if matches!(query.get("watch").map(String::as_str), Some("true" | "1")) =>
            {
                self.state().watches += 1;
                let injected = self.state().watch_fault.clone();
                match injected {
                    Some(WatchFault::Status(code)) => return Ok(fault(code, "watch", &what)),
                    Some(WatchFault::Delay(delay)) => tokio::time::sleep(delay).await,
                    _ => {}
                }
                return Ok(self.watch(plural, ns.map(str::to_string), &query));
            }
            (Method::GET, _) => {
                let injected = self.state().fault.clone();
                match injected {
                    Some(Fault::Status(code)) => {
                        return Ok(fault(
                            code,
                            if name.is_some() { "get" } else { "list" },
                            &what,
                        ));
                    }
                    Some(Fault::Delay(delay)) => tokio::time::sleep(delay).await,
                    None => {}
                }
                let st = self.state();
                if name.is_some() {
                    st.locks.get(&key).cloned().ok_or(404)
                } else {
                    let items: Vec<Value> = (st.locks.iter())
                        .filter(|((p, n, _), _)| *p == plural && ns.is_none_or(|ns| ns == n))
                        .map(|(_, lock)| lock.clone())
                        .collect();
                    let metadata = json!({ "resourceVersion": st.rv.to_string(), "continue": "" });
                    Ok(
                        json!({ "apiVersion": "objectlock.dev/v1alpha1", "kind": "List",
                        "metadata": metadata, "items": items }),
                    )
                }
            }
            (Method::POST, None) => {
                let key = (
                    plural,
                    key.1,
                    body["metadata"]["name"].as_str().unwrap_or("").into(),
                );
                if self.state().locks.contains_key(&key) {
                    let what = format!("{plural}.objectlock.dev \"{}\"", key.2);
                    return Ok(reply(409, status(409, &format!("{what} already exists"))));
                }
                let mut body = body;
                if body.get("spec").is_none_or(Value::is_null) {
                    body["spec"] = json!({});
                }
                return Ok(reply(201, self.put(key, body)));
            }
            (Method::PATCH, Some(_)) => {
                if let Some(code) = self.state().patch_faults.pop_front() {
                    return Ok(fault(code, "patch", &what));
                }
                let lock = self.state().locks.get(&key).cloned();
                let Some(mut lock) = lock else {
                    return Ok(reply(404, status(404, &format!("{what} not found"))));
                };
                // A uid in the patch that differs is a change of an immutable field.
                if body["metadata"]["uid"]
                    .as_str()
                    .is_some_and(|u| lock["metadata"]["uid"] != u)
                {
                    let msg = format!("{what} is invalid: metadata.uid: field is immutable");
                    return Ok(reply(422, status(422, &msg)));
                }
                if sub.is_some() {
                    // The status as one field manager applies it: all of it is replaced.
                    lock["status"] = body["status"].clone();
                    return Ok(reply(200, self.emit("MODIFIED", key, lock)));
                }
                merge_patch(&mut lock, &body);
                Ok(self.put(key, lock))
            }
            (Method::DELETE, Some(_)) => {
                let current = self.state().locks.get(&key).cloned();
                let wanted = body["preconditions"]["uid"].as_str();
                match current {
                    None => Err(404),
                    Some(lock) if wanted.is_some_and(|u| lock["metadata"]["uid"] != u) => {
                        let msg = format!(
                            "Operation cannot be fulfilled on {what}: the UID in the precondition does not match"
                        );
                        let mut conflict = status(409, &msg);
                        conflict["reason"] = json!("Conflict");
                        return Ok(reply(409, conflict));
                    }
                    Some(_) => {
                        let gone = self.remove(&key).expect("present");
                        let details = json!({ "name": key.2, "kind": plural, "uid": gone["metadata"]["uid"] });
                        Ok(
                            json!({ "kind": "Status", "apiVersion": "v1", "metadata": {},
                            "status": "Success", "details": details }),
                        )
                    }
                }
            }
            _ => Err(405),
        };
        Ok(match answer {
            Ok(object) => reply(200, object),
            Err(404) => reply(404, status(404, &format!("{what} not found"))),
            Err(code) => reply(code, status(code, "the method is not faked here")),
        })
    }

    /// Any other path: GET, POST, PATCH and PUT of a path → JSON store.
    async fn other(&self, method: &Method, path: &str, body: Value) -> Response<Body> {
        let mut segments = path.rsplit('/');
        let (name, plural) = (segments.next().unwrap_or(""), segments.next().unwrap_or(""));
        let what = format!("{plural} \"{name}\"");
        if *method == Method::GET {
            let injected = self.state().object_fault.clone();
            match injected {
                Some(Fault::Status(code)) => return fault(code, "get", &what),
                Some(Fault::Delay(delay)) => tokio::time::sleep(delay).await,
                None => {}
            }
        }
        let mut st = self.state();
        match *method {
            Method::GET => match st.others.get(path) {
                Some(object) => reply(200, object.clone()),
                None => reply(404, status(404, &format!("{what} not found"))),
            },
            Method::POST if st.others.contains_key(path) => reply(201, st.others[path].clone()),
            Method::POST => {
                let name = body["metadata"]["name"].as_str().unwrap_or_default();
                st.others.insert(format!("{path}/{name}"), body.clone());
                reply(201, body)
            }
            Method::PATCH | Method::PUT => {
                let object = st.others.entry(path.into()).or_insert(json!({}));
                merge_patch(object, &body);
                reply(200, object.clone())
            }
            _ => reply(405, status(405, "the method is not faked here")),
        }
    }

    /// A watch: HTTP 200, one JSON event per line, from `resourceVersion` (or the current
    /// objects when none is given).
    fn watch(&self, plural: &'static str, ns: Option<String>, query: &Query) -> Response<Body> {
        let st = self.state();
        let holds = move |(p, n, _): &Key| *p == plural && ns.as_ref().is_none_or(|ns| ns == n);
        let mut queue = VecDeque::new();
        let since = match query.get("resourceVersion").map(|rv| rv.parse::<u64>()) {
            Some(Ok(rv)) if rv > 0 => rv,
            _ => {
                let current = st.locks.iter().filter(|(k, _)| holds(k));
                queue.extend(current.map(|(_, lock)| ("ADDED", lock.clone())));
                st.rv
            }
        };
        let expired = since < st.compacted_rv;
        if expired {
            let msg = format!("too old resource version: {since} ({})", st.compacted_rv);
            queue.push_back(("ERROR", status(410, &msg)));
        }
        let timeout = query.get("timeoutSeconds").and_then(|t| t.parse().ok());
        let mut deadline = Instant::now() + Duration::from_secs(timeout.unwrap_or(1800));
        if let Some(WatchFault::Cut(after)) = st.watch_fault {
            deadline = deadline.min(Instant::now() + after);
        }
        let cursor = Cursor {
            server: self.clone(),
            holds: Box::new(holds),
            since,
            generation: st.generation,
            changes: self.inner.changed.subscribe(),
            deadline,
            queue,
            done: expired,
        };
        drop(st);
        let events = futures::stream::unfold(cursor, next_event);
        let body = StreamBody::new(events).boxed_unsync();
        Response::builder()
            .header(http::header::CONTENT_TYPE, "application/json")
            .body(body)
            .expect("valid watch response")
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
            if st.stopped || st.generation != c.generation {
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
        405 => "MethodNotAllowed",
        409 => "AlreadyExists",
        410 => "Expired",
        422 => "Invalid",
        429 => "TooManyRequests",
        503 => "ServiceUnavailable",
        _ => "InternalError",
    };
    json!({ "kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure",
        "message": message, "reason": reason, "code": code })
}

/// The scripted answer `code` to a `verb` of `what` (`pods "db-0"`).
fn fault(code: u16, verb: &str, what: &str) -> Response<Body> {
    let message = match code {
        403 => format!("{what} is forbidden: User \"{FAKE_USER}\" cannot {verb} it ({INJECTED})"),
        _ => format!("Internal error occurred: {INJECTED}"),
    };
    let mut answer = reply(code, status(code, &message));
    if code == 429 {
        (answer.headers_mut()).insert(
            http::header::RETRY_AFTER,
            http::HeaderValue::from_static("1"),
        );
    }
    answer
}

fn reply(code: u16, body: Value) -> Response<Body> {
    let bytes = serde_json::to_vec(&body).expect("json serializes");
    Response::builder()
        .status(code)
        .header(http::header::CONTENT_TYPE, "application/json")
        .body(Full::new(Bytes::from(bytes)).boxed_unsync())
        .expect("valid response")
}
