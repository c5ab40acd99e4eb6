//! A scripted fake Kubernetes API server, for what a real one cannot do on demand: freeze
//! (accept and never answer), drop or expire (410) watches, refuse connections, answer scripted
//! error statuses, and count requests. Plain HTTP/1.1 on `127.0.0.1:0`, for a real `kube::Client`.
//!
//! Objects are JSON by path, under one resourceVersion counter: GET, LIST and WATCH (from a
//! resourceVersion) of a collection, POST, DELETE (uid precondition), merge or apply PATCH (a
//! PATCH of `status` replaces it). API semantics are the end-to-end suite's.
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

const PREFIX: &str = "/apis/objectlock.dev/v1alpha1";
type Body = UnsyncBoxBody<Bytes, Infallible>;

/// A scripted answer to the requests a fault is set for.
#[derive(Clone, Debug)]
pub enum Fault {
    /// Answer with a `Status` of this HTTP code (403, 500, 429 with `Retry-After`, ...).
    Status(u16),
    /// Sleep this long, then answer normally.
    Delay(Duration),
    /// (Watches) end the stream this long after it started, as a proxy cutting requests does.
    Cut(Duration),
}

#[derive(Default)]
struct State {
    rv: u64,
    /// Every object by path (`/api/v1/namespaces/prod/pods/db-0`), and scripted answers.
    objects: BTreeMap<String, Value>,
    /// Every change: (resourceVersion, event type, path, object).
    history: Vec<(u64, &'static str, String, Value)>,
    /// A watch from before this resourceVersion gets 410 Gone.
    compacted_rv: u64,
    /// Bumped by [`FakeApiServer::drop_watches`]: open streams of an older generation end.
    generation: u64,
    frozen: bool,
    fault: Option<Fault>,
    object_fault: Option<Fault>,
    watch_fault: Option<Fault>,
    patch_faults: VecDeque<u16>,
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

    pub fn url(&self) -> String {
        self.inner.url.clone()
    }

    /// A real `kube::Client` pointed at this server (default namespace `default`).
    pub fn client(&self) -> kube::Client {
        let config = kube::Config::new(self.url().parse().expect("server url is a valid uri"));
        kube::Client::try_from(config).expect("kube client for the fake apiserver")
    }

    /// Creates (or replaces the spec of) Lock `namespace/name`, ClusterLock `name` for ns "".
    pub fn create_lock(&self, namespace: &str, name: &str, spec: Value) {
        self.change(&lock_path(namespace, name), Some(json!({ "spec": spec })));
    }

    /// Deletes a lock (event `DELETED`); false if there was none.
    pub fn delete_lock(&self, namespace: &str, name: &str) -> bool {
        self.change(&lock_path(namespace, name), None).is_some()
    }

    /// The lock as a GET returns it (namespace "" for a ClusterLock).
    pub fn lock(&self, namespace: &str, name: &str) -> Option<Value> {
        self.state()
            .objects
            .get(&lock_path(namespace, name))
            .cloned()
    }

    /// Adds an object to the collection at `collection`, e.g.
    /// `add_object("/apis/apps/v1/namespaces/prod/deployments", json!({"metadata": {"name": "web"}}))`.
    pub fn add_object(&self, collection: &str, object: Value) {
        let name = object["metadata"]["name"].as_str().expect("metadata.name");
        self.change(&format!("{collection}/{name}"), Some(object));
    }

    /// Answers every GET and POST of `path` with `body` (a discovery document, a review).
    pub fn answer(&self, path: &str, body: Value) {
        self.state().objects.insert(path.into(), body);
    }

    /// Every request as `"METHOD /path?query"`, in arrival order.
    pub fn request_log(&self) -> Vec<String> {
        self.state().log.clone()
    }

    /// LIST requests of locks whose `path?query` contains `path_contains` (faulted ones too).
    pub fn list_calls(&self, path_contains: &str) -> usize {
        let st = self.state();
        let gets = st.log.iter().filter_map(|r| r.strip_prefix("GET "));
        let lists = gets.filter(|t| t.starts_with(PREFIX) && is_collection(t.split('?').next()));
        lists
            .filter(|t| !t.contains("watch=") && t.contains(path_contains))
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

    /// Answers the next `count` PATCHes with a `Status` of `code`.
    pub fn fail_patches(&self, count: usize, code: u16) {
        (self.state().patch_faults).extend(std::iter::repeat_n(code, count));
    }

    /// Compacts history as etcd does: a watch from an older resourceVersion gets `ERROR` 410.
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
    /// open watches send nothing, until `freeze(false)` (then what waited is answered).
    pub fn freeze(&self, frozen: bool) {
        self.state().frozen = frozen;
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

    /// Stores `object` at `path` (ADDED or MODIFIED, keeping the uid of the one it replaces, and
    /// its status unless `object` has one) or, for `None`, deletes it (DELETED), under a new
    /// resourceVersion (as etcd does); returns the object.
    fn change(&self, path: &str, object: Option<Value>) -> Option<Value> {
        let mut st = self.state();
        let old = st.objects.get(path).cloned();
        let (kind, mut object) = match (object, &old) {
            (None, old) => ("DELETED", old.clone()?),
            (Some(mut new), Some(old)) => {
                if new.get("status").is_none() && old.get("status").is_some() {
                    new["status"] = old["status"].clone();
                }
                new["metadata"]["uid"] = old["metadata"]["uid"].clone();
                ("MODIFIED", new)
            }
            (Some(mut new), None) => {
                new["metadata"]["uid"] = json!(format!("00000000-0000-4000-8000-{:012x}", st.rv));
                ("ADDED", new)
            }
        };
        st.rv += 1;
        let (rv, meta) = (st.rv, &mut object["metadata"]);
        let segments: Vec<&str> = path.split('/').collect();
        if let [.., "namespaces", ns, _, _] = segments[..] {
            meta["namespace"] = json!(ns);
        }
        meta["name"] = json!(segments.last());
        meta["resourceVersion"] = json!(rv.to_string());
        meta["creationTimestamp"] = json!("2026-01-01T00:00:00Z");
        st.history.push((rv, kind, path.into(), object.clone()));
        if kind == "DELETED" {
            st.objects.remove(path);
        } else {
            st.objects.insert(path.into(), object.clone());
        }
        drop(st);
        self.notify();
        Some(object)
    }

    async fn handle(self, req: Request<Incoming>) -> Result<Response<Body>, Infallible> {
        self.thawed().await;
        let (parts, body) = req.into_parts();
        let (method, path, query) = (&parts.method, parts.uri.path(), parts.uri.query());
        let target = parts.uri.path_and_query().map_or(path, |p| p.as_str());
        self.state().log.push(format!("{method} {target}"));
        let apply = (parts.headers.get(http::header::CONTENT_TYPE))
            .is_some_and(|t| t.as_bytes().starts_with(b"application/apply-patch"));
        let body = body.collect().await.map(|b| b.to_bytes());
        let body: Value = serde_json::from_slice(&body.unwrap_or_default()).unwrap_or_default();
        let param = |name: &str| {
            let mut pairs = query.unwrap_or("").split('&');
            pairs.find_map(|kv| kv.strip_prefix(name)?.strip_prefix('='))
        };
        let watching = *method == Method::GET && matches!(param("watch"), Some("true" | "1"));
        let verb = if watching { "watch" } else { "read" };
        let fault = match (watching, *method == Method::GET, path.starts_with(PREFIX)) {
            (true, _, _) => self.state().watch_fault.clone(),
            (_, true, true) => self.state().fault.clone(),
            (_, true, false) => self.state().object_fault.clone(),
            _ => None,
        };
        match fault {
            Some(Fault::Status(code)) => return Ok(reply(refuse(code, verb, path))),
            Some(Fault::Delay(delay)) => tokio::time::sleep(delay).await,
            _ => {}
        }
        let current = self.state().objects.get(path).cloned();
        // A uid in a patch or a precondition that is not the object's: it was replaced.
        let replaced =
            |object: &Value, uid: &Value| uid.is_string() && object["metadata"]["uid"] != *uid;
        let answer = match *method {
            Method::GET if watching => {
                let since = param("resourceVersion").and_then(|rv| rv.parse().ok());
                let timeout = param("timeoutSeconds").and_then(|t| t.parse().ok());
                return Ok(self.watch(path, since, timeout));
            }
            Method::GET => match current {
                Some(object) => (200, object),
                None if is_collection(Some(path)) => (200, self.list(path)),
                None => not_found(path),
            },
            // A scripted answer to a POST (`kubectl auth whoami`).
            Method::POST if current.is_some() => (201, current.unwrap_or_default()),
            Method::POST => {
                let name = body["metadata"]["name"].as_str().unwrap_or_default();
                let path = format!("{path}/{name}");
                if self.state().objects.contains_key(&path) {
                    (409, status(409, &format!("{path} already exists")))
                } else {
                    (201, self.change(&path, Some(body)).unwrap_or_default())
                }
            }
            Method::PATCH => {
                let fault = self.state().patch_faults.pop_front();
                let (target, status_only) = path
                    .strip_suffix("/status")
                    .map_or((path, false), |p| (p, true));
                let current = self.state().objects.get(target).cloned();
                match (fault, current) {
                    (Some(code), _) => refuse(code, "patch", path),
                    (None, None) if !apply => not_found(path),
                    (None, Some(object)) if replaced(&object, &body["metadata"]["uid"]) => {
                        let msg = format!("{path} is invalid: metadata.uid: field is immutable");
                        (422, status(422, &msg))
                    }
                    (None, object) => {
                        let mut object = object.unwrap_or_default();
                        if status_only {
                            object["status"] = body["status"].clone();
                        } else {
                            merge_patch(&mut object, &body);
                        }
                        (200, self.change(target, Some(object)).unwrap_or_default())
                    }
                }
            }
            Method::DELETE => match current {
                None => not_found(path),
                Some(object) if replaced(&object, &body["preconditions"]["uid"]) => {
                    let msg = format!("Operation cannot be fulfilled on {path}: the UID differs");
                    let mut conflict = status(409, &msg);
                    conflict["reason"] = json!("Conflict");
                    (409, conflict)
                }
                Some(_) => (200, self.change(path, None).unwrap_or_default()),
            },
            _ => (405, status(405, "not faked")),
        };
        Ok(reply(answer))
    }

    fn list(&self, collection: &str) -> Value {
        let st = self.state();
        let items: Vec<&Value> = (st.objects.iter())
            .filter(|(path, _)| holds(collection, path))
            .map(|(_, object)| object)
            .collect();
        let metadata = json!({ "resourceVersion": st.rv.to_string() });
        json!({ "apiVersion": "v1", "kind": "List", "metadata": metadata, "items": items })
    }

    /// A watch: HTTP 200, one JSON event per line, of the changes after `since` (or from now).
    fn watch(&self, collection: &str, since: Option<u64>, timeout: Option<u64>) -> Response<Body> {
        let (st, mut queue) = (self.state(), VecDeque::new());
        let since = since.unwrap_or(st.rv);
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
            collection: collection.into(),
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
    collection: String,
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
            let new = (st.history.iter())
                .filter(|(rv, _, p, _)| *rv > c.since && holds(&c.collection, p));
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

/// The path of Lock `namespace/name`, or of ClusterLock `name` when `namespace` is "".
fn lock_path(namespace: &str, name: &str) -> String {
    match namespace {
        "" => format!("{PREFIX}/clusterlocks/{name}"),
        ns => format!("{PREFIX}/namespaces/{ns}/locks/{name}"),
    }
}

/// Whether `path` names a collection (`/api/v1/namespaces/prod/pods`), not one object.
fn is_collection(path: Option<&str>) -> bool {
    let segments: Vec<&str> = path.unwrap_or("").split('/').skip(1).collect();
    let group_version = 2 + usize::from(segments.first() != Some(&"api"));
    segments.len() > group_version && (segments.len() - group_version) % 2 == 1
}

/// Whether the object at `path` is in `collection` (`…/v1alpha1/locks`: every namespace's).
fn holds(collection: &str, path: &str) -> bool {
    let (parent, (group_version, plural)) =
        match (path.rsplit_once('/'), collection.rsplit_once('/')) {
            (Some((parent, _)), Some(split)) => (parent, split),
            _ => return false,
        };
    let namespaced = parent
        .strip_prefix(group_version)
        .and_then(|p| p.strip_prefix("/namespaces/"));
    parent == collection
        || namespaced
            .is_some_and(|p| p.split('/').nth(1) == Some(plural) && p.matches('/').count() == 1)
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

fn not_found(path: &str) -> (u16, Value) {
    (404, status(404, &format!("{path} not found")))
}

/// The scripted answer `code` to a `verb` of `path`.
fn refuse(code: u16, verb: &str, path: &str) -> (u16, Value) {
    let injected = "fault injected by FakeApiServer";
    let user = "system:serviceaccount:kube-object-lock:kube-object-lock";
    let message = match code {
        403 => format!("{path} is forbidden: User \"{user}\" cannot {verb} it ({injected})"),
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
