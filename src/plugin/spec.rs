//! A lock's `spec` as JSON: written by `kubectl lock`, read by `list` and `unlock`.
//!
//! Fields (all optional): `reason`, `operations`, `resources` (`[{apiGroups, resources}]`),
//! `selector` (a LabelSelector), `exempt` (`{users, groups, serviceAccounts}`), `expiresAt`
//! (RFC 3339) and `mode` (`Enforce` or `Warn`).

use k8s_openapi::jiff::Timestamp;
use serde_json::{Map, Value, json};

use super::cli::Operation;
use super::discovery::qualified;

/// What `kubectl lock` writes into a new lock's spec.
pub(super) struct NewSpec<'a> {
    pub group: &'a str,
    pub plural: &'a str,
    pub reason: Option<&'a str>,
    /// Sorted, without repeats; empty: every operation.
    pub operations: &'a [Operation],
    pub exempt_users: &'a [String],
    pub expires_at: Option<Timestamp>,
    pub warn: bool,
}

impl NewSpec<'_> {
    /// The spec, covering `plural` in `group` only.
    pub fn to_json(&self) -> Value {
        let mut spec = Map::new();
        let rule = json!({ "apiGroups": [self.group], "resources": [self.plural] });
        spec.insert("resources".into(), json!([rule]));
        if let Some(reason) = self.reason {
            spec.insert("reason".into(), json!(reason));
        }
        if !self.operations.is_empty() {
            let operations: Vec<_> = self.operations.iter().map(|o| o.as_str()).collect();
            spec.insert("operations".into(), json!(operations));
        }
        if !self.exempt_users.is_empty() {
            spec.insert("exempt".into(), json!({ "users": self.exempt_users }));
        }
        if let Some(at) = self.expires_at {
            spec.insert("expiresAt".into(), json!(at.to_string()));
        }
        if self.warn {
            spec.insert("mode".into(), json!("Warn"));
        }
        Value::Object(spec)
    }

    /// `UPDATE, DELETE; warn only; exempt alice; until 2026-11-22T05:00:00Z`.
    pub fn summary(&self) -> String {
        let operations = match self.operations {
            [] => "UPDATE, DELETE".to_owned(),
            some => some
                .iter()
                .map(|o| o.as_str())
                .collect::<Vec<_>>()
                .join(", "),
        };
        let mut parts = vec![operations];
        if self.warn {
            parts.push("warn only".into());
        }
        if !self.exempt_users.is_empty() {
            parts.push(format!("exempt {}", self.exempt_users.join(", ")));
        }
        if let Some(at) = self.expires_at {
            parts.push(format!("until {at}"));
        }
        parts.join("; ")
    }
}

/// The strings of a JSON array; empty when it is missing or not an array.
fn strings(value: &Value) -> Vec<&str> {
    value
        .as_array()
        .map(|items| items.iter().filter_map(Value::as_str).collect())
        .unwrap_or_default()
}

/// The `(apiGroups, resources)` of each entry of `spec.resources`; a missing list means any.
fn rules(spec: &Value) -> Vec<(Vec<&str>, Vec<&str>)> {
    fn or_any(list: Vec<&str>) -> Vec<&str> {
        if list.is_empty() { vec!["*"] } else { list }
    }
    let rules = spec["resources"].as_array().into_iter().flatten();
    rules
        .map(|r| {
            (
                or_any(strings(&r["apiGroups"])),
                or_any(strings(&r["resources"])),
            )
        })
        .collect()
}

/// Whether the spec covers objects of `plural` in `group` (no `resources`: every resource).
pub(super) fn covers(spec: &Value, group: &str, plural: &str) -> bool {
    let rules = rules(spec);
    rules.is_empty()
        || rules.iter().any(|(groups, resources)| {
            groups.iter().any(|g| *g == group || *g == "*")
                && resources.iter().any(|r| *r == plural || *r == "*")
        })
}

/// The COVERS column: `deployments.apps`, `any resource named web`, `selector app=web`.
pub(super) fn describe_covers(name: &str, spec: &Value) -> String {
    let resources: Vec<String> = rules(spec)
        .iter()
        .flat_map(|(groups, resources)| {
            groups
                .iter()
                .flat_map(move |g| resources.iter().map(move |r| qualified(g, r)))
        })
        .collect();
    let selector = spec.get("selector").filter(|s| s.is_object());
    match (resources.is_empty(), selector) {
        (true, None) => format!("any resource named {name}"),
        (true, Some(selector)) => format!("selector {}", describe_selector(selector)),
        (false, None) => resources.join(","),
        (false, Some(selector)) => format!(
            "{} selector {}",
            resources.join(","),
            describe_selector(selector)
        ),
    }
}

/// The one resource whose object of the lock's name can be looked up: a single group and
/// resource, no wildcard and no selector.
pub(super) fn single_resource(spec: &Value) -> Option<(String, String)> {
    if spec.get("selector").is_some_and(|s| !s.is_null()) {
        return None;
    }
    match rules(spec).as_slice() {
        [(groups, resources)] => match (groups.as_slice(), resources.as_slice()) {
            ([group], [plural]) if *group != "*" && *plural != "*" && !plural.contains('/') => {
                Some(((*group).to_owned(), (*plural).to_owned()))
            }
            _ => None,
        },
        _ => None,
    }
}

/// A LabelSelector as kubectl writes one: `app=web,tier in (a,b),!canary`.
fn describe_selector(selector: &Value) -> String {
    let mut terms: Vec<String> = selector["matchLabels"]
        .as_object()
        .map(|labels| {
            labels
                .iter()
                .map(|(k, v)| format!("{k}={}", v.as_str().unwrap_or_default()))
                .collect()
        })
        .unwrap_or_default();
    for expression in selector["matchExpressions"]
        .as_array()
        .into_iter()
        .flatten()
    {
        let key = expression["key"].as_str().unwrap_or_default();
        let values = strings(&expression["values"]).join(",");
        terms.push(match expression["operator"].as_str().unwrap_or_default() {
            "In" => format!("{key} in ({values})"),
            "NotIn" => format!("{key} notin ({values})"),
            "Exists" => key.to_owned(),
            "DoesNotExist" => format!("!{key}"),
            other => format!("{key} {other} ({values})"),
        });
    }
    if terms.is_empty() {
        "(everything)".to_owned()
    } else {
        terms.join(",")
    }
}

/// The MODE column: `Enforce` unless the spec says otherwise.
pub(super) fn mode(spec: &Value) -> String {
    spec["mode"].as_str().unwrap_or("Enforce").to_owned()
}

/// The EXPIRES column: the time left (`1h59m`), `expired`, or `never`.
pub(super) fn time_left(spec: &Value, now: Timestamp) -> String {
    let Some(text) = spec["expiresAt"].as_str() else {
        return "never".to_owned();
    };
    let Ok(at) = text.parse::<Timestamp>() else {
        return text.to_owned();
    };
    let left = at.duration_since(now).as_secs();
    if left <= 0 {
        return "expired".to_owned();
    }
    let (days, hours, minutes) = (left / 86_400, left % 86_400 / 3600, left % 3600 / 60);
    match (days, hours, minutes) {
        (0, 0, 0) => format!("{left}s"),
        (0, 0, m) => format!("{m}m"),
        (0, h, 0) => format!("{h}h"),
        (0, h, m) => format!("{h}h{m}m"),
        (d, 0, _) => format!("{d}d"),
        (d, h, _) => format!("{d}d{h}h"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_new_spec_has_only_what_was_asked() {
        let at: Timestamp = "2026-11-22T05:00:00Z".parse().expect("time");
        let users = vec!["alice".to_owned()];
        let full = NewSpec {
            group: "apps",
            plural: "deployments",
            reason: Some("release freeze"),
            operations: &[Operation::Delete],
            exempt_users: &users,
            expires_at: Some(at),
            warn: true,
        };
        assert_eq!(
            full.to_json(),
            json!({
                "resources": [{ "apiGroups": ["apps"], "resources": ["deployments"] }],
                "reason": "release freeze",
                "operations": ["DELETE"],
                "exempt": { "users": ["alice"] },
                "expiresAt": "2026-11-22T05:00:00Z",
                "mode": "Warn",
            })
        );
        assert_eq!(
            full.summary(),
            "DELETE; warn only; exempt alice; until 2026-11-22T05:00:00Z"
        );
        let bare = NewSpec {
            group: "",
            plural: "configmaps",
            reason: None,
            operations: &[],
            exempt_users: &[],
            expires_at: None,
            warn: false,
        };
        assert_eq!(
            bare.to_json(),
            json!({ "resources": [{ "apiGroups": [""], "resources": ["configmaps"] }] })
        );
        assert_eq!(bare.summary(), "UPDATE, DELETE");
    }

    #[test]
    fn what_a_spec_covers() {
        let deployments =
            json!({ "resources": [{ "apiGroups": ["apps"], "resources": ["deployments"] }] });
        assert!(covers(&deployments, "apps", "deployments"));
        assert!(!covers(&deployments, "", "services"));
        assert!(covers(&json!({}), "", "services"));
        let wild = json!({ "resources": [{ "apiGroups": ["*"], "resources": ["*"] }] });
        assert!(covers(&wild, "rbac.authorization.k8s.io", "roles"));

        assert_eq!(describe_covers("web", &deployments), "deployments.apps");
        assert_eq!(describe_covers("web", &json!({})), "any resource named web");
        let two = json!({ "resources": [{ "apiGroups": ["", "apps"], "resources": ["configmaps"] }],
            "selector": { "matchLabels": { "app": "web" },
              "matchExpressions": [{ "key": "tier", "operator": "In", "values": ["a", "b"] },
                                   { "key": "canary", "operator": "DoesNotExist" }] } });
        assert_eq!(
            describe_covers("web", &two),
            "configmaps,configmaps.apps selector app=web,tier in (a,b),!canary"
        );
        let selector = json!({ "selector": { "matchLabels": { "app": "web" } } });
        assert_eq!(describe_covers("web", &selector), "selector app=web");

        assert_eq!(
            single_resource(&deployments),
            Some(("apps".into(), "deployments".into()))
        );
        for not_one in [json!({}), two, selector, wild] {
            assert_eq!(single_resource(&not_one), None, "{not_one}");
        }
    }

    #[test]
    fn time_left_is_short() {
        let now: Timestamp = "2026-01-01T00:00:00Z".parse().expect("time");
        let left = |at: &str| time_left(&json!({ "expiresAt": at }), now);
        assert_eq!(time_left(&json!({}), now), "never");
        assert_eq!(left("2025-12-31T23:59:59Z"), "expired");
        assert_eq!(left("2026-01-01T00:00:00Z"), "expired");
        assert_eq!(left("2026-01-01T00:00:42Z"), "42s");
        assert_eq!(left("2026-01-01T00:30:59Z"), "30m");
        assert_eq!(left("2026-01-01T01:59:59Z"), "1h59m");
        assert_eq!(left("2026-01-01T02:00:00Z"), "2h");
        assert_eq!(left("2026-01-03T04:05:00Z"), "2d4h");
        assert_eq!(left("2026-01-08T00:00:00Z"), "7d");
        assert_eq!(left("soon"), "soon");
        assert_eq!(mode(&json!({})), "Enforce");
        assert_eq!(mode(&json!({ "mode": "Warn" })), "Warn");
    }
}
