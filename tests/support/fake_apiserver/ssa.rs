//! Server-side apply as kube-apiserver does it, for the fields a [`Schema`] names: a lock's
//! `status` subresource ([`STATUS`]: a CRD whose schema marks `status.enforcedBy` (key
//! `instance`) and `status.conditions` (key `type`) as list-maps), and a
//! ValidatingWebhookConfiguration ([`WEBHOOK_CONFIGURATION`]: `webhooks` keyed by `name`, their
//! `matchConditions` keyed by `name`, every other list atomic).
//!
//! - Only the schema's fields of the applied configuration count (for the status, the status
//!   strategy resets the rest); `apiVersion`, `kind` and `metadata.name` must be given and
//!   match the URL.
//! - Each field manager owns the leaf fields it applied; list-map items are merged by key, so
//!   managers applying different items never touch each other.
//! - Applying a value that differs from the current one of a field another manager owns is a
//!   409 conflict naming the field and the manager, unless `force=true`, which takes the field
//!   over. Applying the same value shares ownership.
//! - Fields a manager applied before and leaves out now are removed, unless another manager
//!   still owns them; items and objects left empty go with them. (Every manager here applies:
//!   kube-apiserver also removes an item whose other fields only an `Update` manager holds,
//!   such as a `kubectl patch` of one field; this fake has no such managers.)
//! - A `metadata.resourceVersion` in the applied configuration is a precondition: 409 when the
//!   object is at another (or does not exist).
//! - Nothing changed (values and ownership): no write, no new resourceVersion, no event.
//! - `metadata.managedFields` carries one `Apply` entry per manager (`subresource: status` for
//!   the status), in the FieldsV1 format (`f:status`, `k:{"instance":"cp-1"}`, `.`).

use std::collections::{BTreeMap, BTreeSet};

use serde_json::{Value, json};

/// What an apply of one kind of object writes.
pub struct Schema {
    /// The fields of the applied configuration that count, by path of field names.
    pub roots: &'static [&'static [&'static str]],
    /// The list-maps: path of field names, key field. Every other list is atomic.
    pub list_maps: &'static [(&'static [&'static str], &'static str)],
    /// The subresource the apply is made to, if any.
    pub subresource: Option<&'static str>,
}

/// A lock's `status`.
pub const STATUS: Schema = Schema {
    roots: &[&["status"]],
    list_maps: &[
        (&["status", "enforcedBy"], "instance"),
        (&["status", "conditions"], "type"),
    ],
    subresource: Some("status"),
};

/// A ValidatingWebhookConfiguration: its entries, labels and annotations.
pub const WEBHOOK_CONFIGURATION: Schema = Schema {
    roots: &[
        &["metadata", "labels"],
        &["metadata", "annotations"],
        &["webhooks"],
    ],
    list_maps: &[
        (&["webhooks"], "name"),
        (&["webhooks", "matchConditions"], "name"),
    ],
    subresource: None,
};

/// One step into an object.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub enum Step {
    /// A field of an object.
    Field(String),
    /// The item of a list-map whose key field (`.0`) has the value `.1` (JSON text).
    Item(String, String),
}

pub type Path = Vec<Step>;

/// Field sets by manager, per object.
pub type Managed = BTreeMap<String, BTreeSet<Path>>;

/// Why an apply was refused: HTTP code and Status message.
pub struct Refused {
    pub code: u16,
    pub message: String,
    pub causes: Vec<Value>,
}

fn list_map_key(schema: &Schema, path: &[Step]) -> Option<&'static str> {
    let names: Vec<&str> = path
        .iter()
        .filter_map(|s| match s {
            Step::Field(name) => Some(name.as_str()),
            Step::Item(..) => None,
        })
        .collect();
    (schema.list_maps.iter())
        .find(|(p, _)| *p == names.as_slice())
        .map(|(_, key)| *key)
}

/// The leaf fields of `value` under `path`, with their values, in the order given (new list-map
/// items are stored in that order, as kube-apiserver does).
fn leaves(schema: &Schema, value: &Value, path: &mut Path, out: &mut Vec<(Path, Value)>) {
    match value {
        // An empty object owns nothing (and must not replace what is there).
        Value::Object(map) => {
            for (k, v) in map {
                path.push(Step::Field(k.clone()));
                leaves(schema, v, path, out);
                path.pop();
            }
        }
        Value::Array(items) if list_map_key(schema, path).is_some() => {
            let key = list_map_key(schema, path).unwrap_or_default();
            for item in items {
                path.push(Step::Item(key.to_owned(), item[key].to_string()));
                leaves(schema, item, path, out);
                path.pop();
            }
        }
        other => out.push((path.clone(), other.clone())),
    }
}

/// `…[key=v].key`: the key field of a list-map item.
fn is_key_field(path: &[Step]) -> bool {
    match path {
        [.., Step::Item(key, _), Step::Field(field)] => key == field,
        _ => false,
    }
}

fn is_item(item: &Value, key: &str, value: &str) -> bool {
    let value: Value = serde_json::from_str(value).unwrap_or(Value::Null);
    item.get(key) == Some(&value)
}

fn get<'a>(root: &'a Value, path: &[Step]) -> Option<&'a Value> {
    let mut at = root;
    for step in path {
        at = match step {
            Step::Field(k) => at.get(k)?,
            Step::Item(key, value) => at
                .as_array()?
                .iter()
                .find(|item| is_item(item, key, value))?,
        };
    }
    Some(at)
}

fn set(root: &mut Value, path: &[Step], value: Value) {
    let Some((last, parents)) = path.split_last() else {
        *root = value;
        return;
    };
    let mut at = root;
    for (i, step) in parents.iter().enumerate() {
        at = match step {
            Step::Field(k) => {
                if !at.is_object() {
                    *at = json!({});
                }
                let next_is_item =
                    matches!(parents.get(i + 1).or(Some(last)), Some(Step::Item(..)));
                let entry = at
                    .as_object_mut()
                    .expect("made an object")
                    .entry(k.clone())
                    .or_insert_with(|| if next_is_item { json!([]) } else { json!({}) });
                if next_is_item && !entry.is_array() {
                    *entry = json!([]);
                }
                entry
            }
            Step::Item(key, value) => {
                let items = at.as_array_mut().expect("a list-map is an array");
                let index = match items.iter().position(|item| is_item(item, key, value)) {
                    Some(index) => index,
                    None => {
                        let parsed: Value = serde_json::from_str(value).unwrap_or(Value::Null);
                        items.push(json!({ key.clone(): parsed }));
                        items.len() - 1
                    }
                };
                &mut items[index]
            }
        };
    }
    if let Step::Field(k) = last {
        if !at.is_object() {
            *at = json!({});
        }
        at.as_object_mut()
            .expect("made an object")
            .insert(k.clone(), value);
    }
}

fn remove(root: &mut Value, path: &[Step]) {
    let Some((last, parents)) = path.split_last() else {
        return;
    };
    let mut at = root;
    for step in parents {
        let next = match step {
            Step::Field(k) => at.get_mut(k),
            Step::Item(key, value) => at
                .as_array_mut()
                .and_then(|items| items.iter_mut().find(|item| is_item(item, key, value))),
        };
        let Some(next) = next else { return };
        at = next;
    }
    match last {
        Step::Field(k) => {
            if let Some(map) = at.as_object_mut() {
                map.remove(k);
            }
        }
        Step::Item(key, value) => {
            if let Some(items) = at.as_array_mut() {
                items.retain(|item| !is_item(item, key, value));
            }
        }
    }
}

/// Drops objects and arrays left empty by removals (the root `status` too).
fn prune(value: &mut Value) -> bool {
    match value {
        Value::Object(map) => {
            map.retain(|_, v| !prune(v));
            map.is_empty()
        }
        Value::Array(items) => {
            items.retain_mut(|v| !(v.is_object() && prune(v)));
            items.is_empty()
        }
        _ => false,
    }
}

fn describe(path: &[Step]) -> String {
    let mut out = String::new();
    for step in path {
        match step {
            Step::Field(k) => out.push_str(&format!(".{k}")),
            Step::Item(key, value) => out.push_str(&format!("[{key}={value}]")),
        }
    }
    out
}

/// Applies `config` (an applied configuration) to `object` as `manager`. Returns whether the
/// object or the ownership changed.
pub fn apply(
    schema: &Schema,
    object: &mut Value,
    managed: &mut Managed,
    config: &Value,
    manager: &str,
    force: bool,
    api_version: &str,
) -> Result<bool, Refused> {
    let bad = |message: String| Refused {
        code: 400,
        message,
        causes: vec![],
    };
    if config["apiVersion"].as_str() != Some(api_version) {
        return Err(bad(format!(
            "apiVersion {} does not match {api_version}",
            config["apiVersion"]
        )));
    }
    if config["kind"] != object["kind"] {
        return Err(bad(format!(
            "kind {} does not match {}",
            config["kind"], object["kind"]
        )));
    }
    let (given, url) = (&config["metadata"]["name"], &object["metadata"]["name"]);
    if given != url {
        return Err(bad(format!(
            "the name of the object ({}) does not match the name on the URL ({})",
            given.as_str().unwrap_or_default(),
            url.as_str().unwrap_or_default()
        )));
    }
    // A resourceVersion given is a precondition, as in an update (checked on a real API server).
    let given = config["metadata"]["resourceVersion"].as_str();
    if given.is_some_and(|v| object["metadata"]["resourceVersion"].as_str() != Some(v)) {
        let kind = object["kind"].as_str().unwrap_or_default().to_lowercase();
        let group = api_version.split('/').next().unwrap_or_default();
        return Err(Refused {
            code: 409,
            message: format!(
                "Operation cannot be fulfilled on {kind}s.{group} {url}: the object has been modified; please apply your changes to the latest version and try again"
            ),
            causes: vec![],
        });
    }
    let mut ordered = Vec::new();
    for root in schema.roots {
        let path: Path = root.iter().map(|f| Step::Field((*f).to_owned())).collect();
        if let Some(value) = get(config, &path).filter(|v| !v.is_null()) {
            leaves(schema, value, &mut path.clone(), &mut ordered);
        }
    }
    let applied: BTreeMap<Path, Value> = ordered.iter().cloned().collect();
    // Conflicts: another manager owns a field this apply sets to a different value.
    let mut conflicts = vec![];
    for (path, value) in &applied {
        if get(object, path) == Some(value) {
            continue;
        }
        for (other, fields) in managed.iter() {
            if other != manager && fields.contains(path) {
                conflicts.push((other.clone(), path.clone()));
            }
        }
    }
    if !conflicts.is_empty() && !force {
        let causes: Vec<Value> = conflicts
            .iter()
            .map(|(other, path)| {
                json!({ "reason": "FieldManagerConflict",
                    "message": format!("conflict with \"{other}\" using {api_version}"),
                    "field": describe(path) })
            })
            .collect();
        let listed: Vec<String> = conflicts
            .iter()
            .map(|(other, path)| {
                format!(
                    "conflict with \"{other}\" using {api_version}: {}",
                    describe(path)
                )
            })
            .collect();
        let n = conflicts.len();
        let plural = if n == 1 { "conflict" } else { "conflicts" };
        return Err(Refused {
            code: 409,
            message: format!("Apply failed with {n} {plural}: {}", listed.join("\n")),
            causes,
        });
    }
    let before = (object.clone(), managed.clone());
    for (other, path) in &conflicts {
        if let Some(fields) = managed.get_mut(other) {
            fields.remove(path);
        }
    }
    let previous = managed.remove(manager).unwrap_or_default();
    for (path, value) in &ordered {
        set(object, path, value.clone());
    }
    // Key fields go last: an item is found by its key.
    let (keys, others): (Vec<&Path>, Vec<&Path>) = previous
        .iter()
        .filter(|p| !applied.contains_key(*p))
        .filter(|p| !managed.values().any(|fields| fields.contains(*p)))
        .partition(|p| is_key_field(p));
    for path in others.into_iter().chain(keys) {
        remove(object, path);
    }
    for root in schema.roots {
        let Some((last, parents)) = root.split_last() else {
            continue;
        };
        let mut at = Some(&mut *object);
        for field in parents {
            at = at.and_then(|v| v.get_mut(*field));
        }
        if let Some(parent) = at.and_then(Value::as_object_mut)
            && parent.get_mut(*last).is_some_and(prune)
        {
            parent.remove(*last);
        }
    }
    if !applied.is_empty() {
        managed.insert(manager.to_owned(), applied.into_keys().collect());
    }
    managed.retain(|_, fields| !fields.is_empty());
    Ok((object.clone(), managed.clone()) != before)
}

/// `metadata.managedFields` for `managed`, as kube-apiserver shows status applies.
/// Drops from every manager's set the fields `object` no longer has (a write other than an
/// apply removed them), and the managers left with nothing.
pub fn forget_missing(object: &Value, managed: &mut Managed) {
    for fields in managed.values_mut() {
        fields.retain(|path| get(object, path).is_some());
    }
    managed.retain(|_, fields| !fields.is_empty());
}

pub fn managed_fields(schema: &Schema, managed: &Managed, api_version: &str, time: &str) -> Value {
    let entries: Vec<Value> = managed
        .iter()
        .map(|(manager, fields)| {
            let mut root = json!({});
            for path in fields {
                let mut at = &mut root;
                for step in path {
                    let name = match step {
                        Step::Field(k) => format!("f:{k}"),
                        Step::Item(key, value) => format!("k:{{\"{key}\":{value}}}"),
                    };
                    let item = matches!(step, Step::Item(..));
                    at = at
                        .as_object_mut()
                        .expect("an object")
                        .entry(name)
                        .or_insert_with(|| json!({}));
                    if item {
                        at.as_object_mut()
                            .expect("an object")
                            .insert(".".into(), json!({}));
                    }
                }
            }
            let mut entry = json!({ "manager": manager, "operation": "Apply",
                "apiVersion": api_version, "time": time, "fieldsType": "FieldsV1",
                "fieldsV1": root });
            if let Some(subresource) = schema.subresource {
                entry["subresource"] = json!(subresource);
            }
            entry
        })
        .collect();
    Value::Array(entries)
}
