//! `--namespace-selector`: a label selector as kubectl writes one, parsed with apimachinery's
//! rules into the `LabelSelector` the registration carries (kube-core has no parser of the text
//! form). `<` and `>` belong to label queries, not to a `LabelSelector`, and are refused.

use std::collections::BTreeMap;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::{LabelSelector, LabelSelectorRequirement};

use crate::registration::NAMESPACE_NAME_LABEL;

/// Parses `text`; the error says what is wrong, for a message naming the flag.
pub fn parse(text: &str) -> Result<LabelSelector, String> {
    if text.trim().is_empty() {
        return Err(
            "empty: give at least one requirement, e.g. lockable=true (leave the flag out to select every namespace)"
                .to_owned(),
        );
    }
    let mut labels = BTreeMap::new();
    let mut expressions = Vec::new();
    for term in terms(text)? {
        match requirement(term)? {
            Term::Equal(key, value) => {
                if labels.insert(key.clone(), value).is_some() {
                    return Err(format!(
                        "{key} is given twice with = (a namespace has one value per label; use `{key} in (a,b)`)"
                    ));
                }
            }
            Term::Expression(expression) => {
                let reserved =
                    expression.key == NAMESPACE_NAME_LABEL && expression.operator != "NotIn";
                if reserved {
                    return Err(format!(
                        "{term:?}: {NAMESPACE_NAME_LABEL} with in, an existence test or ! cannot be told apart from the narrowing the webhook writes on that label; label the namespaces instead (e.g. lockable=true), or use =, != or notin"
                    ));
                }
                expressions.push(expression);
            }
        }
    }
    Ok(LabelSelector {
        match_labels: (!labels.is_empty()).then_some(labels),
        match_expressions: (!expressions.is_empty()).then_some(expressions),
    })
}

/// One requirement: an equality (`matchLabels`) or a `matchExpressions` item.
enum Term {
    Equal(String, String),
    Expression(LabelSelectorRequirement),
}

/// The requirements of `text`: split at the commas outside parentheses.
fn terms(text: &str) -> Result<Vec<&str>, String> {
    let (mut out, mut depth, mut start) = (Vec::new(), 0usize, 0);
    for (at, c) in text.char_indices() {
        match c {
            '(' if depth == 0 => depth = 1,
            '(' => return Err(format!("{text:?}: parentheses do not nest")),
            ')' if depth == 1 => depth = 0,
            ')' => return Err(format!("{text:?}: `)` without `(`")),
            ',' if depth == 0 => {
                out.push(text[start..at].trim());
                start = at + 1;
            }
            _ => {}
        }
    }
    if depth != 0 {
        return Err(format!("{text:?}: `(` without `)`"));
    }
    out.push(text[start..].trim());
    match out.iter().any(|t| t.is_empty()) {
        true => Err(format!(
            "{text:?}: an empty requirement (two commas in a row, or one at an end)"
        )),
        false => Ok(out),
    }
}

fn requirement(term: &str) -> Result<Term, String> {
    let expression = |key: &str, operator: &str, values: Option<Vec<String>>| {
        Ok(Term::Expression(LabelSelectorRequirement {
            key: key_of(key, term)?,
            operator: operator.to_owned(),
            values,
        }))
    };
    if let Some(key) = term.strip_prefix('!')
        && !key.starts_with('=')
    {
        return expression(key.trim(), "DoesNotExist", None);
    }
    if term.contains(['<', '>']) {
        return Err(format!(
            "{term:?}: < and > compare numbers in label queries; a namespaceSelector has no such operator"
        ));
    }
    for (symbol, not) in [("!=", true), ("==", false), ("=", false)] {
        if let Some((key, value)) = term.split_once(symbol) {
            let (key, value) = (key_of(key.trim(), term)?, value_of(value.trim(), term)?);
            return match not {
                true => expression(&key, "NotIn", Some(vec![value])),
                false => Ok(Term::Equal(key, value)),
            };
        }
    }
    if let Some((head, list)) = term.split_once('(') {
        let mut words = head.split_whitespace();
        let (Some(key), Some(word), None) = (words.next(), words.next(), words.next()) else {
            return Err(format!(
                "{term:?}: expected KEY in (VALUES) or KEY notin (VALUES)"
            ));
        };
        let operator = match word {
            "in" => "In",
            "notin" => "NotIn",
            other => {
                return Err(format!(
                    "{term:?}: unknown operator {other:?} (in or notin)"
                ));
            }
        };
        let Some(list) = list.trim_end().strip_suffix(')') else {
            return Err(format!("{term:?}: text after `)`"));
        };
        if list.trim().is_empty() {
            return Err(format!("{term:?}: {word} needs at least one value"));
        }
        let values = (list.split(','))
            .map(|v| value_of(v.trim(), term))
            .collect::<Result<Vec<_>, _>>()?;
        return expression(key, operator, Some(values));
    }
    if term.split_whitespace().count() > 1 {
        return Err(format!(
            "{term:?}: expected KEY, !KEY, KEY=VALUE, KEY!=VALUE, KEY in (VALUES) or KEY notin (VALUES)"
        ));
    }
    expression(term, "Exists", None)
}

/// A label key: `[prefix/]name`, the prefix a DNS subdomain (at most 253 characters), the name
/// at most 63 characters of alphanumerics, `-`, `_` and `.`, starting and ending alphanumeric.
fn key_of(key: &str, term: &str) -> Result<String, String> {
    let (prefix, name) = match key.split_once('/') {
        Some((prefix, name)) => (Some(prefix), name),
        None => (None, key),
    };
    let prefix_ok = prefix.is_none_or(|p| {
        p.len() <= 253
            && p.split('.').all(|part| {
                !part.is_empty()
                    && part
                        .bytes()
                        .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-')
                    && !part.starts_with('-')
                    && !part.ends_with('-')
            })
    });
    if !prefix_ok || name.is_empty() || !is_label_text(name) {
        return Err(format!(
            "{term:?}: {key:?} is not a label key ([prefix/]name: a DNS subdomain prefix, a name of at most 63 alphanumerics, '-', '_' or '.', starting and ending alphanumeric)"
        ));
    }
    Ok(key.to_owned())
}

/// A label value: empty, or at most 63 characters as a key's name.
fn value_of(value: &str, term: &str) -> Result<String, String> {
    if value.is_empty() || is_label_text(value) {
        return Ok(value.to_owned());
    }
    Err(format!(
        "{term:?}: {value:?} is not a label value (at most 63 alphanumerics, '-', '_' or '.', starting and ending alphanumeric)"
    ))
}

fn is_label_text(text: &str) -> bool {
    let edge = |b: Option<u8>| b.is_some_and(|b| b.is_ascii_alphanumeric());
    text.len() <= 63
        && edge(text.bytes().next())
        && edge(text.bytes().last())
        && (text.bytes()).all(|b| b.is_ascii_alphanumeric() || matches!(b, b'-' | b'_' | b'.'))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn expression(key: &str, operator: &str, values: Option<&[&str]>) -> LabelSelectorRequirement {
        LabelSelectorRequirement {
            key: key.to_owned(),
            operator: operator.to_owned(),
            values: values.map(|v| v.iter().map(|s| (*s).to_owned()).collect()),
        }
    }

    #[test]
    fn every_form_kubectl_writes() {
        let parsed = parse(
            "lockable=true, team==db,tier!=dev , zone in (a, b),stage notin (test),owned,!legacy,example.com/x=",
        )
        .expect("valid");
        assert_eq!(
            parsed.match_labels,
            Some(
                [("lockable", "true"), ("team", "db"), ("example.com/x", "")]
                    .map(|(k, v)| (k.to_owned(), v.to_owned()))
                    .into()
            )
        );
        assert_eq!(
            parsed.match_expressions,
            Some(vec![
                expression("tier", "NotIn", Some(&["dev"])),
                expression("zone", "In", Some(&["a", "b"])),
                expression("stage", "NotIn", Some(&["test"])),
                expression("owned", "Exists", None),
                expression("legacy", "DoesNotExist", None),
            ])
        );
        // What the API server matches, kube-core matches the same way.
        let selector = kube::core::Selector::try_from(parse("lockable=true").expect("valid"))
            .expect("convertible");
        assert_eq!(selector.to_string(), "lockable=true");
        assert_eq!(parse("a").expect("valid").match_labels, None);
    }

    #[test]
    fn bad_selectors_say_what_is_wrong() {
        for (text, needle) in [
            ("", "empty"),
            ("  ", "empty"),
            ("a=1,,b=2", "empty requirement"),
            ("a=1,", "empty requirement"),
            ("a in (x", "`(` without `)`"),
            ("a in x)", "`)` without `(`"),
            ("a in ((x))", "do not nest"),
            ("a in ()", "at least one value"),
            ("a within (x)", "unknown operator"),
            ("a in (x) y", "text after"),
            ("a b", "expected KEY"),
            ("a>1", "< and >"),
            ("a=1,a=2", "given twice"),
            ("-a=1", "not a label key"),
            ("Example.com/a=1", "not a label key"),
            ("a/b/c", "not a label key"),
            ("/a", "not a label key"),
            ("a=b c", "not a label value"),
            ("a=-b", "not a label value"),
            (&format!("a={}", "x".repeat(64)), "not a label value"),
            (
                "kubernetes.io/metadata.name in (prod)",
                "cannot be told apart",
            ),
            ("!kubernetes.io/metadata.name", "cannot be told apart"),
        ] {
            let error = parse(text).expect_err(text);
            assert!(error.contains(needle), "{text:?}: {error}");
        }
        // The name label is the operator's with = (matchLabels), != and notin.
        for text in [
            "kubernetes.io/metadata.name=prod",
            "kubernetes.io/metadata.name!=dev",
            "kubernetes.io/metadata.name notin (dev,test)",
        ] {
            assert!(parse(text).is_ok(), "{text}");
        }
    }
}
