//! What an UPDATE changes: field paths, and the comparison of a request's `oldObject` with its
//! `object`.
//!
//! Pure: JSON in, answers out. A field path is written as `kubectl explain` and the downward API
//! write them (`spec.template`, `metadata.annotations['example.com/key']`); a list is compared
//! whole. A field set to `null` is the same as an absent one (the API server stores neither).
//! Server-maintained metadata ([`SERVER_MAINTAINED`]) never counts as a change. The object's
//! `status` does count: where the API server keeps it apart (a resource with a status
//! subresource), it resets it before admission, so it arrives unchanged.

use std::cell::OnceCell;
use std::fmt;

use serde::Deserialize;
use serde_json::Value;

/// Metadata the API server writes on every change: never counted as one.
pub const SERVER_MAINTAINED: [&str; 3] = [
    "metadata.resourceVersion",
    "metadata.managedFields",
    "metadata.generation",
];

/// The longest field path the CRD accepts, in characters.
pub const MAX_PATH_CHARS: usize = 512;

/// A field path that does not parse: the message names it.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error(
    "{path:?} is not a field path: {why} (write spec.template or metadata.annotations['example.com/key'])"
)]
pub struct PathError {
    /// The path as written.
    pub path: String,
    /// What is wrong with it.
    pub why: &'static str,
}

/// A parsed field path: the keys from the object's root.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct FieldPath(Vec<String>);

impl FieldPath {
    /// Parses `spec.template.spec.volumes` or `metadata.annotations['example.com/key']`
    /// (`["..."]` too). Field names are letters, digits, `_` and `-`, not starting with a digit
    /// or `-`; a quoted key is anything but its quote, and not empty. The CRD checks the same
    /// grammar with [`PATTERN`].
    pub fn parse(text: &str) -> Result<FieldPath, PathError> {
        let fail = |why| PathError {
            path: text.to_owned(),
            why,
        };
        if text.is_empty() {
            return Err(fail("empty"));
        }
        if text.chars().count() > MAX_PATH_CHARS {
            return Err(fail("longer than 512 characters"));
        }
        let mut keys = Vec::new();
        let mut rest = text;
        let mut first = true;
        while !rest.is_empty() {
            if let Some(quoted) = rest.strip_prefix('[') {
                let quote = quoted
                    .chars()
                    .next()
                    .filter(|c| matches!(c, '\'' | '"'))
                    .ok_or_else(|| fail("a key in brackets must be quoted"))?;
                let inner = &quoted[1..];
                let end = inner
                    .find(quote)
                    .ok_or_else(|| fail("unterminated quoted key"))?;
                if end == 0 {
                    return Err(fail("empty quoted key"));
                }
                keys.push(inner[..end].to_owned());
                rest = inner[end + 1..]
                    .strip_prefix(']')
                    .ok_or_else(|| fail("a quoted key must end with ]"))?;
            } else {
                let name = if first {
                    rest
                } else {
                    rest.strip_prefix('.')
                        .ok_or_else(|| fail("fields are separated by ."))?
                };
                let end = name.find(['.', '[']).unwrap_or(name.len());
                let field = &name[..end];
                let valid_start = field
                    .chars()
                    .next()
                    .is_some_and(|c| c.is_ascii_alphabetic() || c == '_');
                if !valid_start {
                    return Err(fail("a field name starts with a letter or _"));
                }
                if !field
                    .chars()
                    .all(|c| c.is_ascii_alphanumeric() || c == '_' || c == '-')
                {
                    return Err(fail("a field name holds letters, digits, _ and -"));
                }
                keys.push(field.to_owned());
                rest = &name[end..];
            }
            first = false;
        }
        Ok(FieldPath(keys))
    }

    /// The keys from the root.
    pub fn keys(&self) -> &[String] {
        &self.0
    }

    /// The value at this path; a `null` is absent.
    pub fn get<'v>(&self, value: &'v Value) -> Option<&'v Value> {
        self.0
            .iter()
            .try_fold(value, |v, key| v.get(key))
            .filter(|v| !v.is_null())
    }

    /// True when `self` is `other` or lies inside it.
    fn within(&self, other: &FieldPath) -> bool {
        self.0.starts_with(&other.0)
    }
}

/// The regular expression of a field path, for the CRD's CEL rules (RE2, as CEL's `matches`).
/// Quotes are written `\x27` and `\x22` so that the pattern fits in a CEL raw string.
pub const PATTERN: &str = r"^[A-Za-z_][A-Za-z0-9_-]*(\.[A-Za-z_][A-Za-z0-9_-]*|\[\x27[^\x27]+\x27\]|\[\x22[^\x22]+\x22\])*$";

impl fmt::Display for FieldPath {
    /// As parsed: dotted names, quoted keys where a key is not a plain name.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for (i, key) in self.0.iter().enumerate() {
            let plain = key
                .chars()
                .next()
                .is_some_and(|c| c.is_ascii_alphabetic() || c == '_')
                && key
                    .chars()
                    .all(|c| c.is_ascii_alphanumeric() || c == '_' || c == '-');
            match (plain, i) {
                (true, 0) => f.write_str(key)?,
                (true, _) => write!(f, ".{key}")?,
                (false, _) if key.contains('\'') => write!(f, "[\"{key}\"]")?,
                (false, _) => write!(f, "['{key}']")?,
            }
        }
        Ok(())
    }
}

/// True when the value at `path` differs between `old` and `new` (added, removed, or another
/// value).
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

/// The first place where `new` differs from `old`, outside `kept` and the server-maintained
/// metadata; `None` when they are the same there. Maps are compared key by key, anything else
/// whole.
pub fn first_change_outside(old: &Value, new: &Value, kept: &[FieldPath]) -> Option<FieldPath> {
    let mut skipped: Vec<FieldPath> = SERVER_MAINTAINED
        .iter()
        .map(|p| FieldPath::parse(p).expect("the server-maintained paths parse"))
        .collect();
    skipped.extend(kept.iter().cloned());
    let mut at = FieldPath(Vec::new());
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
        .any(|p| p.0.len() > at.0.len() && p.0.starts_with(&at.0));
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
        at.0.push(key.clone());
        let found = walk(
            a.and_then(|m| m.get(key)),
            b.and_then(|m| m.get(key)),
            skipped,
            at,
        );
        at.0.pop();
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

/// True when the only change from `old` to `new` (server-maintained metadata aside) is the
/// removal of finalizers: what a Terminating object's controllers do.
pub fn only_finalizers_removed(old: &Value, new: &Value) -> bool {
    let finalizers = FieldPath(vec!["metadata".into(), "finalizers".into()]);
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

/// The `object` and `oldObject` of an UPDATE, read from the review's body only when a decision
/// asks for them (a lock covers the update): parsing a large object costs more than all the
/// rest of a review.
pub struct Objects<'b> {
    body: Option<&'b [u8]>,
    pair: OnceCell<Option<(Value, Value)>>,
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

impl<'b> Objects<'b> {
    /// The objects of the AdmissionReview in `body`, read on first use.
    pub fn from_review(body: &'b [u8]) -> Objects<'b> {
        Objects {
            body: Some(body),
            pair: OnceCell::new(),
        }
    }

    /// Objects already read.
    pub fn from_values(old: Value, new: Value) -> Objects<'static> {
        Objects {
            body: None,
            pair: OnceCell::from(Some((old, new))),
        }
    }

    /// No objects: every covered UPDATE counts as a change of everything.
    pub fn unknown() -> Objects<'static> {
        Objects {
            body: None,
            pair: OnceCell::from(None),
        }
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
    fn paths_parse_as_written_and_print_back() {
        for (text, keys) in [
            ("spec", vec!["spec"]),
            (
                "spec.template.spec.volumes",
                vec!["spec", "template", "spec", "volumes"],
            ),
            (
                "metadata.annotations['example.com/key']",
                vec!["metadata", "annotations", "example.com/key"],
            ),
            (
                r#"metadata.labels["app.kubernetes.io/name"]"#,
                vec!["metadata", "labels", "app.kubernetes.io/name"],
            ),
            ("data['a.b'].c", vec!["data", "a.b", "c"]),
            ("spec.my-field_2", vec!["spec", "my-field_2"]),
        ] {
            let parsed = path(text);
            assert_eq!(parsed.keys(), keys, "{text}");
            assert_eq!(path(&parsed.to_string()), parsed, "{text} prints back");
        }
        assert_eq!(
            path(r#"metadata.labels["app.kubernetes.io/name"]"#).to_string(),
            "metadata.labels['app.kubernetes.io/name']"
        );
    }

    #[test]
    fn bad_paths_are_named_with_what_is_wrong() {
        let program = cel::Program::compile(&format!("self.matches(r'{PATTERN}')"))
            .expect("the pattern is a CEL raw string");
        let matches = |text: &str| {
            let mut context = cel::Context::default();
            context.add_variable("self", text).expect("variable");
            program.execute(&context).expect("runs") == cel::Value::Bool(true)
        };
        for (text, why) in [
            ("", "empty"),
            (".spec", "a field name starts with a letter or _"),
            ("spec.", "a field name starts with a letter or _"),
            ("spec..a", "a field name starts with a letter or _"),
            ("spec.containers[0]", "a key in brackets must be quoted"),
            ("spec[name]", "a key in brackets must be quoted"),
            ("metadata.labels['a", "unterminated quoted key"),
            ("metadata.labels['']", "empty quoted key"),
            ("metadata.labels['a']b", "fields are separated by ."),
            ("metadata.labels['a'", "a quoted key must end with ]"),
            (
                "spec/template",
                "a field name holds letters, digits, _ and -",
            ),
            ("9lives", "a field name starts with a letter or _"),
        ] {
            let error = FieldPath::parse(text).expect_err(text);
            assert_eq!(error.why, why, "{text}");
            assert!(error.to_string().contains(&format!("{text:?}")), "{error}");
            assert!(!matches(text), "the CRD pattern accepts {text:?}");
        }
        for good in [
            "spec.template",
            "metadata.annotations['example.com/key']",
            r#"a["it's"].b"#,
        ] {
            assert!(matches(good), "{good}");
            path(good);
        }
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
