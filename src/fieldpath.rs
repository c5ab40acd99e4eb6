//! Field paths of a Kubernetes object, as `kubectl explain` and the downward API write them:
//! `spec.template.spec.volumes`, `metadata.annotations['example.com/key']`. The Lock CRD checks
//! the same grammar with [`PATTERN`], and lock files with [`FieldPath::parse`].

use std::fmt;

use serde_json::Value;

/// The longest field path the CRD accepts, in characters.
pub const MAX_PATH_CHARS: usize = 512;

/// A field path that does not parse: the message names it.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error(
    "{path:?} is not a field path: {why} (write spec.template or metadata.annotations['example.com/key'])"
)]
pub struct PathError {
    pub path: String,
    pub why: &'static str,
}

/// A parsed field path: the keys from the object's root.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct FieldPath(Vec<String>);

impl FieldPath {
    /// Parses `spec.template.spec.volumes` or `metadata.annotations['example.com/key']` (`["..."]`
    /// too); names are letters, digits, `_`, `-`, not led by a digit or `-`; quoted keys not empty.
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

    pub(crate) fn root() -> FieldPath {
        FieldPath(Vec::new())
    }

    pub(crate) fn push(&mut self, key: &str) {
        self.0.push(key.to_owned());
    }

    pub(crate) fn pop(&mut self) {
        self.0.pop();
    }

    /// True when `self` is `other` or lies inside it.
    pub fn within(&self, other: &FieldPath) -> bool {
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

#[cfg(test)]
mod tests {
    use super::*;

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
}
