//! What an UPDATE changes: `oldObject` against `object`, by field path. Pure. Lists compare
//! whole; `null` is absent; server-maintained metadata ([`SERVER_MAINTAINED`]) never counts.

use std::cell::OnceCell;

use serde::Deserialize;
use serde_json::Value;

pub use crate::fieldpath::{FieldPath, PathError};

/// Metadata the API server writes on every change: never counted as one.
pub const SERVER_MAINTAINED: [&str; 3] = [
    "metadata.resourceVersion",
    "metadata.managedFields",
    "metadata.generation",
];

pub fn changed(old: &Value, new: &Value, path: &FieldPath) -> bool {
    !same(path.get(old), path.get(new))
}

/// Equality, with a map member set to `null` the same as an absent one.
fn same(a: Option<&Value>, b: Option<&Value>) -> bool {
    let a = a.filter(|v| !v.is_null());
    let b = b.filter(|v| !v.is_null());
    match (a, b) {
        (Some(Value::Object(x)), Some(Value::Object(y))) => {
            x.iter().all(|(k, v)| same(Some(v), y.get(k)))
                && y.iter().all(|(k, v)| x.contains_key(k) || v.is_null())
        }
        (Some(Value::Array(x)), Some(Value::Array(y))) => {
            x.len() == y.len() && x.iter().zip(y).all(|(v, w)| same(Some(v), Some(w)))
        }
        (a, b) => a == b,
    }
}

/// The first place where `new` differs from `old`, outside `kept` and server-maintained metadata.
pub fn first_change_outside(old: &Value, new: &Value, kept: &[FieldPath]) -> Option<FieldPath> {
    let mut skipped: Vec<FieldPath> = SERVER_MAINTAINED
        .iter()
        .map(|p| FieldPath::parse(p).expect("the server-maintained paths parse"))
        .collect();
    skipped.extend(kept.iter().cloned());
    let mut at = FieldPath::root();
    walk(Some(old), Some(new), &skipped, &mut at)
}

fn walk(
    old: Option<&Value>,
    new: Option<&Value>,
    skipped: &[FieldPath],
    at: &mut FieldPath,
) -> Option<FieldPath> {
    if skipped.iter().any(|s| at.within(s)) {
        return None;
    }
    let old = old.filter(|v| !v.is_null());
    let new = new.filter(|v| !v.is_null());
    // Only a map with something skipped below it needs a walk key by key.
    let below = skipped
        .iter()
        .any(|p| p.keys().len() > at.keys().len() && p.keys().starts_with(at.keys()));
    let (Some(a), Some(b)) = (as_map(old), as_map(new)) else {
        return (!same(old, new)).then(|| at.clone());
    };
    if !below || (a.is_none() && b.is_none()) {
        return (!same(old, new)).then(|| at.clone());
    }
    let keys = a.into_iter().flat_map(|m| m.keys());
    let more = b
        .into_iter()
        .flat_map(|m| m.keys())
        .filter(|k| !a.is_some_and(|a| a.contains_key(*k)));
    for key in keys.chain(more) {
        at.push(key);
        let found = walk(
            a.and_then(|m| m.get(key)),
            b.and_then(|m| m.get(key)),
            skipped,
            at,
        );
        at.pop();
        if found.is_some() {
            return found;
        }
    }
    None
}

/// `Some(None)` for nothing, `Some(Some(map))` for a map, `None` for any other value.
fn as_map(value: Option<&Value>) -> Option<Option<&serde_json::Map<String, Value>>> {
    match value {
        Some(Value::Object(m)) => Some(Some(m)),
        None => Some(None),
        Some(_) => None,
    }
}

/// True when the only change is the removal of finalizers (a Terminating object's controllers).
pub fn only_finalizers_removed(old: &Value, new: &Value) -> bool {
    let finalizers = FieldPath::parse("metadata.finalizers").expect("a valid path");
    let list = |v: &Value| -> Vec<Value> {
        finalizers
            .get(v)
            .and_then(Value::as_array)
            .cloned()
            .unwrap_or_default()
    };
    let (before, after) = (list(old), list(new));
    let removed = after.len() < before.len() && after.iter().all(|f| before.contains(f));
    removed && first_change_outside(old, new, std::slice::from_ref(&finalizers)).is_none()
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Write {
    /// The object itself, or a subresource whose reviews carry it (`pods/resize`, ...).
    Object,
    /// The `status` subresource: it may change the status, and what else it carries counts.
    Status,
    /// The `scale` subresource: `spec.replicas` is the object's (or its CRD's `specReplicasPath`).
    Scale { custom: bool },
}

/// The change of an UPDATE that a lock freezes.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Frozen {
    /// The frozen field that changed; `None` when the objects could not be compared.
    pub path: Option<String>,
    /// Whether a refusal names the field (a lock on fields, a status write, a Terminating object).
    pub named: bool,
}

/// The change of an UPDATE that a lock's `fields` / `exceptFields` freeze; `None` if none.
pub fn frozen_change(
    fields: Option<&[String]>,
    except_fields: Option<&[String]>,
    write: Write,
    terminating: bool,
    objects: &Objects,
) -> Option<Frozen> {
    let named =
        fields.is_some() || except_fields.is_some() || write == Write::Status || terminating;
    let Some((old, new)) = objects.pair() else {
        return Some(Frozen { path: None, named });
    };
    let parse = |paths: &[String]| -> Option<Vec<FieldPath>> {
        paths.iter().map(|p| FieldPath::parse(p).ok()).collect()
    };
    // A list that does not parse (the spec reader has already made such a lock whole) locks all.
    let fields = fields.and_then(parse);
    let except = except_fields.and_then(parse).unwrap_or_default();
    let frozen = |path: String| {
        Some(Frozen {
            path: Some(path),
            named,
        })
    };
    if let Write::Scale { custom } = write {
        // The Scales' spec.replicas; the object's field it writes: spec.replicas, or for a
        // custom resource its CRD's specReplicasPath, when it was read.
        let replicas = FieldPath::parse("spec.replicas").expect("a valid path");
        if !changed(old, new, &replicas) {
            return None;
        }
        let field = match (custom, objects.scaled_field()) {
            (false, _) => &replicas,
            (true, Some(field)) => field,
            (true, None) => {
                return frozen("spec.replicas (through the scale subresource)".to_owned());
            }
        };
        let touches = |p: &FieldPath| p.within(field) || field.within(p);
        return match &fields {
            Some(fields) if !fields.iter().any(touches) => None,
            Some(_) => frozen(field.to_string()),
            None if except.iter().any(|p| field.within(p)) => None,
            None => frozen(field.to_string()),
        };
    }
    if terminating && only_finalizers_removed(old, new) {
        return None;
    }
    let status = FieldPath::parse("status").expect("a valid path");
    let free_status = write == Write::Status;
    match fields {
        Some(fields) => fields
            .into_iter()
            .filter(|p| !(free_status && p.within(&status)))
            .find(|p| {
                if free_status && status.within(p) {
                    // A lock on the whole object through a status write: what is not status.
                    first_change_outside(old, new, std::slice::from_ref(&status)).is_some()
                } else {
                    changed(old, new, p)
                }
            })
            .and_then(|p| frozen(p.to_string())),
        None => {
            let mut kept = except;
            if free_status {
                kept.push(status);
            }
            first_change_outside(old, new, &kept).and_then(|p| frozen(p.to_string()))
        }
    }
}

/// The `object` and `oldObject` of an UPDATE, parsed from the body only when a lock covers it.
pub struct Objects<'b> {
    body: Option<&'b [u8]>,
    pair: OnceCell<Option<(Value, Value)>>,
    scaled: Option<FieldPath>,
}

#[derive(Deserialize)]
struct Review {
    request: Pair,
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct Pair {
    #[serde(default)]
    object: Value,
    #[serde(default)]
    old_object: Value,
}

#[cfg(test)]
impl Objects<'static> {
    pub fn from_values(old: Value, new: Value) -> Objects<'static> {
        Objects {
            body: None,
            pair: OnceCell::from(Some((old, new))),
            scaled: None,
        }
    }
}

impl<'b> Objects<'b> {
    pub fn from_review(body: &'b [u8]) -> Objects<'b> {
        Objects {
            body: Some(body),
            pair: OnceCell::new(),
            scaled: None,
        }
    }

    /// No objects: every covered UPDATE counts as a change of everything.
    pub fn unknown() -> Objects<'static> {
        Objects {
            body: None,
            pair: OnceCell::from(None),
            scaled: None,
        }
    }

    /// With the field a custom resource's scale writes; unknown, every lock on a scale freezes it.
    pub fn with_scaled_field(mut self, field: Option<FieldPath>) -> Self {
        self.scaled = field;
        self
    }

    pub fn scaled_field(&self) -> Option<&FieldPath> {
        self.scaled.as_ref()
    }

    /// `(oldObject, object)`, when both are JSON objects.
    pub fn pair(&self) -> Option<(&Value, &Value)> {
        self.pair
            .get_or_init(|| {
                let review: Review = serde_json::from_slice(self.body?).ok()?;
                let Pair { object, old_object } = review.request;
                (object.is_object() && old_object.is_object()).then_some((old_object, object))
            })
            .as_ref()
            .map(|(old, new)| (old, new))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn path(text: &str) -> FieldPath {
        FieldPath::parse(text).expect(text)
    }

    #[test]
    fn a_path_changes_when_its_value_does() {
        let old = json!({
            "metadata": {"annotations": {"example.com/key": "1", "other": "x"}, "labels": {"a": "1"}},
            "spec": {"replicas": 2, "template": {"spec": {"volumes": [{"name": "a"}], "x": null}},
                     "list": [1, 2]},
        });
        let with = |f: &dyn Fn(&mut Value)| {
            let mut new = old.clone();
            f(&mut new);
            new
        };
        // (what changed, path, counted)
        let cases: Vec<(Value, &str, bool)> = vec![
            (old.clone(), "spec", false),
            // Nested maps: a change deep inside counts for every path above it, not beside it.
            (
                with(&|v| v["spec"]["template"]["spec"]["volumes"][0]["name"] = json!("b")),
                "spec.template",
                true,
            ),
            (
                with(&|v| v["spec"]["template"]["spec"]["volumes"][0]["name"] = json!("b")),
                "spec.replicas",
                false,
            ),
            // Lists are compared whole: reordered is changed.
            (
                with(&|v| v["spec"]["list"] = json!([2, 1])),
                "spec.list",
                true,
            ),
            // Quoted keys.
            (
                with(&|v| v["metadata"]["annotations"]["example.com/key"] = json!("2")),
                "metadata.annotations['example.com/key']",
                true,
            ),
            (
                with(&|v| v["metadata"]["annotations"]["other"] = json!("y")),
                "metadata.annotations['example.com/key']",
                false,
            ),
            // Absent and null are the same.
            (
                with(&|v| {
                    v["spec"]["template"]["spec"]
                        .as_object_mut()
                        .unwrap()
                        .remove("x")
                        .map(drop)
                        .unwrap_or(())
                }),
                "spec.template",
                false,
            ),
            (
                with(&|v| v["spec"]["missing"] = json!(null)),
                "spec.missing",
                false,
            ),
            // An added field, and a removed one.
            (with(&|v| v["spec"]["added"] = json!(1)), "spec.added", true),
            (with(&|v| v["spec"]["added"] = json!(1)), "spec", true),
            (
                with(&|v| {
                    v["metadata"].as_object_mut().unwrap().remove("labels");
                }),
                "metadata.labels",
                true,
            ),
            // A field under a scalar is absent, not an error.
            (old.clone(), "spec.replicas.deeper", false),
        ];
        for (new, at, expected) in cases {
            assert_eq!(changed(&old, &new, &path(at)), expected, "{at}: {new}");
        }
    }

    #[test]
    fn the_first_change_outside_skips_kept_and_server_maintained_fields() {
        let old = json!({
            "metadata": {"name": "web", "resourceVersion": "1", "generation": 1,
                         "managedFields": [{"manager": "kubectl"}],
                         "annotations": {"example.com/key": "1"}},
            "spec": {"replicas": 2, "template": {"spec": {"volumes": []}}},
            "status": {"ready": 1},
        });
        let with = |f: &dyn Fn(&mut Value)| {
            let mut new = old.clone();
            f(&mut new);
            new
        };
        let server = with(&|v| {
            v["metadata"]["resourceVersion"] = json!("2");
            v["metadata"]["generation"] = json!(2);
            v["metadata"]["managedFields"] = json!([{"manager": "apply"}]);
        });
        let annotated = with(&|v| v["metadata"]["annotations"]["example.com/key"] = json!("2"));
        let labelled = with(&|v| v["metadata"]["labels"] = json!({"a": "b"}));
        let scaled = with(&|v| v["spec"]["replicas"] = json!(3));
        let reported = with(&|v| v["status"]["ready"] = json!(2));
        let none: &[FieldPath] = &[];
        let annotations = [path("metadata.annotations")];
        let the_key = [path("metadata.annotations['example.com/key']")];
        let status = [path("status")];
        // (new, kept, first change)
        let cases: Vec<(&Value, &[FieldPath], Option<&str>)> = vec![
            (&old, none, None),
            (&server, none, None),
            (&annotated, none, Some("metadata.annotations")),
            (&annotated, &annotations, None),
            (&annotated, &the_key, None),
            (&labelled, &annotations, Some("metadata.labels")),
            (&scaled, &annotations, Some("spec")),
            (&reported, none, Some("status")),
            (&reported, &status, None),
            (&labelled, &status, Some("metadata.labels")),
        ];
        for (new, kept, expected) in cases {
            let found = first_change_outside(&old, new, kept).map(|p| p.to_string());
            assert_eq!(found.as_deref(), expected, "{new} keeping {kept:?}");
        }
    }

    #[test]
    fn a_scale_writes_spec_replicas_or_the_field_its_crd_names() {
        let scale = |n: u32| json!({"kind": "Scale", "spec": {"replicas": n}});
        let strings = |v: &[&str]| v.iter().map(|s| (*s).to_owned()).collect::<Vec<_>>();
        let builtin = Write::Scale { custom: false };
        let custom = Write::Scale { custom: true };
        let size = Some(path("spec.size"));
        // (write, the CRD's field, fields, exceptFields, replicas after, frozen path)
        type Case = (
            Write,
            Option<FieldPath>,
            Option<&'static [&'static str]>,
            Option<&'static [&'static str]>,
            u32,
            Option<&'static str>,
        );
        let cases: Vec<Case> = vec![
            (builtin, None, None, None, 2, None),
            (builtin, None, None, None, 3, Some("spec.replicas")),
            (builtin, None, Some(&["spec.template"]), None, 3, None),
            (
                builtin,
                None,
                Some(&["spec"]),
                None,
                3,
                Some("spec.replicas"),
            ),
            (builtin, None, None, Some(&["spec.replicas"]), 3, None),
            (custom, None, None, None, 2, None),
            (
                custom,
                None,
                Some(&["spec.other"]),
                None,
                3,
                Some("spec.replicas (through the scale subresource)"),
            ),
            (custom, size.clone(), None, None, 3, Some("spec.size")),
            (
                custom,
                size.clone(),
                Some(&["spec.size"]),
                None,
                3,
                Some("spec.size"),
            ),
            (
                custom,
                size.clone(),
                Some(&["spec.replicas"]),
                None,
                3,
                None,
            ),
            (
                custom,
                size.clone(),
                Some(&["spec"]),
                None,
                3,
                Some("spec.size"),
            ),
            (custom, size.clone(), None, Some(&["spec.size"]), 3, None),
            (
                custom,
                size.clone(),
                None,
                Some(&["spec.replicas"]),
                3,
                Some("spec.size"),
            ),
        ];
        for (write, field, fields, except, after, expected) in cases {
            let objects =
                Objects::from_values(scale(2), scale(after)).with_scaled_field(field.clone());
            let (fields, except) = (fields.map(strings), except.map(strings));
            let found = frozen_change(fields.as_deref(), except.as_deref(), write, false, &objects);
            assert_eq!(
                found.and_then(|f| f.path).as_deref(),
                expected,
                "{write:?} {field:?} fields {fields:?} except {except:?} to {after}"
            );
        }
    }

    #[test]
    fn only_the_removal_of_finalizers_is_a_removal() {
        let old = json!({"metadata": {"finalizers": ["a", "b"], "resourceVersion": "1"},
                         "data": {"k": "v"}});
        let with = |f: &dyn Fn(&mut Value)| {
            let mut new = old.clone();
            f(&mut new);
            new
        };
        for (new, expected) in [
            (with(&|v| v["metadata"]["finalizers"] = json!(["b"])), true),
            (with(&|v| v["metadata"]["finalizers"] = json!(null)), true),
            (
                with(&|v| {
                    v["metadata"]["finalizers"] = json!([]);
                    v["metadata"]["resourceVersion"] = json!("2");
                }),
                true,
            ),
            (old.clone(), false),
            (
                with(&|v| v["metadata"]["finalizers"] = json!(["b", "a"])),
                false,
            ),
            (with(&|v| v["metadata"]["finalizers"] = json!(["c"])), false),
            (
                with(&|v| {
                    v["metadata"]["finalizers"] = json!(["a"]);
                    v["data"]["k"] = json!("w");
                }),
                false,
            ),
        ] {
            assert_eq!(only_finalizers_removed(&old, &new), expected, "{new}");
        }
    }

    #[test]
    fn objects_are_read_from_the_review_once_asked() {
        let body = br#"{"request":{"uid":"u","object":{"a":1},"oldObject":{"a":2},"x":[1]}}"#;
        let objects = Objects::from_review(body);
        assert_eq!(objects.pair(), Some((&json!({"a": 2}), &json!({"a": 1}))));
        assert_eq!(
            Objects::from_review(br#"{"request":{"object":null}}"#).pair(),
            None
        );
        assert_eq!(Objects::from_review(b"not json").pair(), None);
        assert_eq!(Objects::unknown().pair(), None);
    }
}
