//! The scenarios and their request bodies, all made from the captured AdmissionReviews in
//! `tests/fixtures/` and built before any clock starts.
//!
//! Bodies are the fixtures' own bytes with the request uid, the object's name and its namespace
//! replaced as whole JSON strings, so field order, escapes and every field the API server sends
//! stay as captured. The fixtures are indented, while kube-apiserver 1.36 sends compact JSON and
//! a newline (a ConfigMap update through a real one: 2,343 bytes, 2,342 of them compact JSON),
//! so the whitespace between tokens is taken out as the API server would send it. Each body is
//! checked with the webhook's own parser after the rewrite.

use std::fmt;
use std::path::Path;
use std::sync::Arc;

use anyhow::{Context, bail, ensure};
use bytes::Bytes;

use crate::Choice;

/// The namespace of the configmap fixtures.
const FIXTURE_NAMESPACE: &str = "demo-015226";
/// Distinct objects per namespace in the one-namespace scenarios.
const OBJECTS: usize = 1_000;
/// Namespaces of the round-robin scenario (the webhook's default `cache.max_namespaces`).
pub const NAMESPACES: usize = 10_000;
/// The object each namespace's Lock holds in `namespaces-10k` (no request names it).
const HELD: &str = "bench-held";
/// One request in this many is on a locked object in `locked-1pct`.
const LOCKED_ONE_IN: usize = 100;
/// Size of the data value of the large ConfigMap, in object and in oldObject.
const LARGE_DATA_BYTES: usize = 512 * 1024;
/// Distinct bodies of the large-object scenario (each is about 1.1 MiB).
const LARGE_BODIES: usize = 16;

/// ConfigMap UPDATE and DELETE reviews in `demo-015226`: (fixture, the object's name in it).
/// Every way an update or delete of a namespaced object reaches the webhook: patch, replace,
/// server-side apply, delete, dry-run delete and a DELETECOLLECTION item (no request.name).
const TEMPLATES: [(&str, &str); 7] = [
    ("configmap-update-put.json", "locked-a"),
    ("configmap-update-merge-patch.json", "locked-a"),
    ("configmap-update-server-side-apply.json", "locked-a"),
    ("configmap-delete-unlocked.json", "free-a"),
    ("configmap-delete-locked.json", "locked-a"),
    ("configmap-delete-dryrun.json", "locked-a"),
    ("configmap-deletecollection-item.json", "locked-sweep2"),
];

/// The namespace of the eviction scenarios.
const EVICTION_NAMESPACE: &str = "bench-evict";
/// Pods of the eviction scenarios; every second one is labelled `app: db`.
const PODS: usize = 1_000;

/// A scenario's name.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Name {
    OneNamespace,
    Namespaces10k,
    Locked1Pct,
    LargeObject,
    NewConnection,
    Evictions,
    SelectorEvictions,
}

impl Name {
    pub const ALL: [Name; 7] = [
        Name::OneNamespace,
        Name::Namespaces10k,
        Name::Locked1Pct,
        Name::LargeObject,
        Name::NewConnection,
        Name::Evictions,
        Name::SelectorEvictions,
    ];

    /// The scenarios selected on the command line, in the canonical order, each once.
    pub fn chosen(choices: &[Choice]) -> Vec<Name> {
        Name::ALL
            .into_iter()
            .filter(|name| {
                choices.iter().any(|c| {
                    *c == Choice::All
                        || match name {
                            Name::OneNamespace => *c == Choice::OneNamespace,
                            Name::Namespaces10k => *c == Choice::Namespaces10k,
                            Name::Locked1Pct => *c == Choice::Locked1Pct,
                            Name::LargeObject => *c == Choice::LargeObject,
                            Name::NewConnection => *c == Choice::NewConnection,
                            Name::Evictions => *c == Choice::Evictions,
                            Name::SelectorEvictions => *c == Choice::SelectorEvictions,
                        }
                })
            })
            .collect()
    }

    pub fn as_str(self) -> &'static str {
        match self {
            Name::OneNamespace => "one-namespace",
            Name::Namespaces10k => "namespaces-10k",
            Name::Locked1Pct => "locked-1pct",
            Name::LargeObject => "large-object",
            Name::NewConnection => "new-connection",
            Name::Evictions => "evictions",
            Name::SelectorEvictions => "selector-evictions",
        }
    }
}

impl fmt::Display for Name {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// One scenario, ready to run.
pub struct Scenario {
    pub name: Name,
    /// One line saying what is sent.
    pub about: String,
    /// Sent round-robin across all connections.
    pub bodies: Arc<Vec<Bytes>>,
    /// Locks to create in the fake API server before the webhook starts: (namespace, name).
    pub locks: Vec<(String, String)>,
    /// The spec of those Locks (`{"reason": "load benchmark"}` unless a scenario says otherwise).
    pub lock_spec: serde_json::Value,
    /// Other objects to seed the fake API server with: (collection path, object).
    pub objects: Vec<(String, serde_json::Value)>,
    /// A new TCP and TLS connection for every request.
    pub new_connection: bool,
    /// The fraction of requests the webhook must deny.
    pub expected_denied: f64,
}

/// Builds the bodies of a scenario.
pub fn build(name: Name) -> anyhow::Result<Scenario> {
    let templates = templates()?;
    let one_namespace = |names: usize| -> anyhow::Result<Vec<Bytes>> {
        (0..names)
            .map(|i| templates[i % templates.len()].instantiate(i, FIXTURE_NAMESPACE, &object(i)))
            .collect()
    };
    let scenario = match name {
        Name::OneNamespace | Name::NewConnection => Scenario {
            name,
            about: format!(
                "{} ConfigMap UPDATE/DELETE reviews of {OBJECTS} objects in one namespace, none locked{}",
                TEMPLATES.len(),
                if name == Name::NewConnection {
                    "; a new TCP+TLS connection per request"
                } else {
                    ""
                }
            ),
            bodies: Arc::new(one_namespace(OBJECTS)?),
            locks: Vec::new(),
            new_connection: name == Name::NewConnection,
            expected_denied: 0.0,
            ..Scenario::plain(name)
        },
        Name::Namespaces10k => Scenario {
            name,
            about: format!(
                "the same reviews over {NAMESPACES} namespaces, round-robin; each namespace holds one Lock ({NAMESPACES} Locks) on another object, so none is denied"
            ),
            bodies: Arc::new(
                (0..NAMESPACES)
                    .map(|i| {
                        let template = &templates[i % templates.len()];
                        template.instantiate(i, &namespace(i), &object(i % OBJECTS))
                    })
                    .collect::<anyhow::Result<_>>()?,
            ),
            locks: (0..NAMESPACES)
                .map(|i| (namespace(i), HELD.to_owned()))
                .collect(),
            new_connection: false,
            expected_denied: 0.0,
            ..Scenario::plain(name)
        },
        Name::Locked1Pct => Scenario {
            name,
            about: format!(
                "one namespace, {} of {OBJECTS} objects locked: 1% of requests are denied",
                OBJECTS / LOCKED_ONE_IN
            ),
            bodies: Arc::new(one_namespace(OBJECTS)?),
            locks: (0..OBJECTS)
                .step_by(LOCKED_ONE_IN)
                .map(|i| (FIXTURE_NAMESPACE.to_owned(), object(i)))
                .collect(),
            new_connection: false,
            expected_denied: 1.0 / LOCKED_ONE_IN as f64,
            ..Scenario::plain(name)
        },
        Name::LargeObject => {
            let template = large_template()?;
            Scenario {
                name,
                about: format!(
                    "ConfigMap UPDATE with {} KiB of data in object and in oldObject ({} KiB bodies)",
                    LARGE_DATA_BYTES / 1024,
                    template.bytes.len() / 1024
                ),
                bodies: Arc::new(
                    (0..LARGE_BODIES)
                        .map(|i| template.instantiate(i, FIXTURE_NAMESPACE, &object(i)))
                        .collect::<anyhow::Result<_>>()?,
                ),
                locks: Vec::new(),
                new_connection: false,
                expected_denied: 0.0,
                ..Scenario::plain(name)
            }
        }
        Name::Evictions | Name::SelectorEvictions => {
            let template = Template::in_namespace(
                "pod-eviction-create.json",
                compact(&fixture("pod-eviction-create.json")?)?,
                "evict-me",
                "lock-demo",
            )?;
            let selector = name == Name::SelectorEvictions;
            Scenario {
                name,
                about: if selector {
                    format!(
                        "evictions of {PODS} pods in a namespace holding a selector Lock (app=db): one label GET each, every second pod selected and denied"
                    )
                } else {
                    format!(
                        "evictions of {PODS} pods in a namespace holding a named Lock on another pod: no label read, none denied"
                    )
                },
                bodies: Arc::new(
                    (0..PODS)
                        .map(|i| template.instantiate(i, EVICTION_NAMESPACE, &pod(i)))
                        .collect::<anyhow::Result<_>>()?,
                ),
                locks: vec![(EVICTION_NAMESPACE.to_owned(), HELD.to_owned())],
                lock_spec: if selector {
                    serde_json::json!({"selector": {"matchLabels": {"app": "db"}}, "reason": "load benchmark"})
                } else {
                    serde_json::json!({"reason": "load benchmark"})
                },
                objects: (0..PODS)
                    .map(|i| {
                        let app = if i % 2 == 0 { "db" } else { "web" };
                        let pod = serde_json::json!({"metadata": {"name": pod(i), "labels": {"app": app}},
                            "spec": {"containers": [{"name": "c", "image": "registry.invalid/db:1"}]}});
                        (format!("/api/v1/namespaces/{EVICTION_NAMESPACE}/pods"), pod)
                    })
                    .collect(),
                new_connection: false,
                expected_denied: if selector { 0.5 } else { 0.0 },
            }
        }
    };
    Ok(scenario)
}

impl Scenario {
    /// The fields most scenarios leave as they are.
    pub fn plain(name: Name) -> Scenario {
        Scenario {
            name,
            about: String::new(),
            bodies: Arc::new(Vec::new()),
            locks: Vec::new(),
            lock_spec: serde_json::json!({"reason": "load benchmark"}),
            objects: Vec::new(),
            new_connection: false,
            expected_denied: 0.0,
        }
    }
}

/// DELETE reviews of `bench-enf-I` in `bench-ns-I` for I in `0..n`: the objects the
/// lock-to-enforcement measurement locks one by one.
pub fn enforcement_bodies(n: usize) -> anyhow::Result<Vec<Bytes>> {
    let template = Template::new(
        "configmap-delete-locked.json",
        fixture("configmap-delete-locked.json")?,
        "locked-a",
    )?;
    (0..n)
        .map(|i| template.instantiate(i, &namespace(i), &enforced_object(i)))
        .collect()
}

/// The object of the `i`th lock-to-enforcement sample, in namespace [`namespace`]`(i)`.
pub fn enforced_object(i: usize) -> String {
    format!("bench-enf-{i:04}")
}

/// `bench-ns-NNNNN`.
pub fn namespace_of(i: usize) -> String {
    namespace(i)
}

fn pod(i: usize) -> String {
    format!("bench-pod-{i:04}")
}

fn object(i: usize) -> String {
    format!("bench-cm-{i:04}")
}

fn namespace(i: usize) -> String {
    format!("bench-ns-{i:05}")
}

/// A fixture and the strings to replace in it.
struct Template {
    file: &'static str,
    bytes: String,
    uid: String,
    name: &'static str,
    namespace: &'static str,
}

fn fixture(file: &str) -> anyhow::Result<String> {
    let path = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/fixtures")
        .join(file);
    std::fs::read_to_string(&path).with_context(|| format!("cannot read {}", path.display()))
}

/// `json` without the whitespace between tokens, ending in a newline, as Go's encoder writes it.
/// Strings are kept byte for byte (a re-serialization would change their escapes).
fn compact(json: &str) -> anyhow::Result<String> {
    let mut out = String::with_capacity(json.len());
    let (mut in_string, mut escaped) = (false, false);
    for c in json.chars() {
        if in_string {
            out.push(c);
            match c {
                _ if escaped => escaped = false,
                '\\' => escaped = true,
                '"' => in_string = false,
                _ => {}
            }
        } else if !c.is_ascii_whitespace() {
            in_string = c == '"';
            out.push(c);
        }
    }
    out.push('\n');
    let value = |text: &str| serde_json::from_str::<serde_json::Value>(text);
    ensure!(
        value(&out)? == value(json)?,
        "compacting changed the document"
    );
    Ok(out)
}

fn templates() -> anyhow::Result<Vec<Template>> {
    TEMPLATES
        .iter()
        .map(|&(file, name)| Template::new(file, compact(&fixture(file)?)?, name))
        .collect()
}

/// `configmap-update-put.json` with its one-key data replaced by a 512 KiB value in both
/// objects: a config file of `key = "value"` lines, so the JSON string has escapes to scan.
fn large_template() -> anyhow::Result<Template> {
    let file = "configmap-update-put.json";
    let mut bytes = fixture(file)?;
    let mut text = String::with_capacity(LARGE_DATA_BYTES + 64);
    let mut line = 0;
    while text.len() < LARGE_DATA_BYTES {
        text.push_str(&format!(
            "setting.{line:06} = \"value of setting {line:06}\"\n"
        ));
        line += 1;
    }
    text.truncate(LARGE_DATA_BYTES);
    for (old, value) in [("put", "new"), ("v", "old")] {
        let before = format!("\"k\": \"{old}\"");
        ensure!(
            bytes.matches(&before).count() == 1,
            "{file}: expected one {before}"
        );
        let data = serde_json::to_string(&format!("{value}\n{text}"))?;
        bytes = bytes.replace(&before, &format!("\"k\": {data}"));
    }
    Template::new(file, compact(&bytes)?, "locked-a")
}

impl Template {
    fn new(file: &'static str, bytes: String, name: &'static str) -> anyhow::Result<Template> {
        Template::in_namespace(file, bytes, name, FIXTURE_NAMESPACE)
    }

    fn in_namespace(
        file: &'static str,
        bytes: String,
        name: &'static str,
        namespace: &'static str,
    ) -> anyhow::Result<Template> {
        let parsed = kube_object_lock::admission::review::parse(bytes.as_bytes())
            .map_err(|e| anyhow::anyhow!("{file}: {e}"))?;
        let req = &parsed.request;
        ensure!(
            req.object_name() == Some(name) && req.object_namespace() == Some(namespace),
            "{file}: expected {namespace}/{name}, found {:?}/{:?}",
            req.object_namespace(),
            req.object_name()
        );
        Ok(Template {
            file,
            uid: req.uid.to_string(),
            bytes,
            name,
            namespace,
        })
    }

    /// This fixture with a fresh uid, for object `name` in `namespace`.
    fn instantiate(&self, i: usize, namespace: &str, name: &str) -> anyhow::Result<Bytes> {
        let uid = format!("00000000-0000-4000-8000-{i:012x}");
        let quoted = |s: &str| format!("\"{s}\"");
        let body = self
            .bytes
            .replace(&quoted(&self.uid), &quoted(&uid))
            .replace(&quoted(self.name), &quoted(name))
            .replace(&quoted(self.namespace), &quoted(namespace));
        let parsed = kube_object_lock::admission::review::parse(body.as_bytes())
            .map_err(|e| anyhow::anyhow!("{}: rewritten body does not parse: {e}", self.file))?;
        let req = &parsed.request;
        if req.uid != uid
            || req.object_name() != Some(name)
            || req.object_namespace() != Some(namespace)
        {
            bail!(
                "{}: rewrite did not take: uid {}, object {:?}/{:?}",
                self.file,
                req.uid,
                req.object_namespace(),
                req.object_name()
            );
        }
        Ok(Bytes::from(body))
    }
}
