//! `manifests alerts`: Prometheus alert rules over the webhook's metrics, as a rule file or a
//! Prometheus Operator `PrometheusRule`. Invariant: each alert links the section of
//! docs/operations.md named after it, and none fires on a healthy, idle cluster.

use serde::{Deserialize, Serialize};
use serde_json::{Value, json};

use super::{ManifestsError, NAME, yaml};
use crate::cli::AlertsArgs;

/// Where the runbooks are by default: the operations guide in the source tree.
pub const DEFAULT_RUNBOOK_URL: &str = "docs/operations.md";
pub const DEFAULT_JOB: &str = NAME;
/// Below the highest finite bucket of `admission_duration_seconds` (25 µs doubled 18 times,
/// 6.5536 s): a quantile above it reads as that bound, so a threshold must stay below it.
const MAX_SLOW_SECONDS: f64 = 6.5;

#[derive(Serialize, Deserialize)]
struct Rule {
    alert: String,
    expr: String,
    #[serde(rename = "for")]
    wait: String,
    labels: Value,
    annotations: Annotations,
}

#[derive(Serialize, Deserialize)]
struct Annotations {
    summary: String,
    description: String,
    #[serde(default)]
    runbook_url: String,
}

/// A group of rules; a rule file's and a PrometheusRule's `spec` are `{groups: [...]}`.
#[derive(Serialize)]
struct Group {
    name: &'static str,
    rules: Vec<Rule>,
}

#[derive(Serialize)]
struct Groups {
    groups: [Group; 1],
}

#[derive(Serialize)]
#[serde(rename_all = "camelCase")]
struct PrometheusRule {
    api_version: &'static str,
    kind: &'static str,
    metadata: Value,
    spec: Groups,
}

/// The rules of alerts.yaml with the options filled in.
fn rules(options: &AlertsArgs) -> Vec<Rule> {
    // Half the API server's wait, below the top bucket: p99 there leaves the other half for
    // the network, TLS and the API server's own queue.
    let slow = (f64::from(options.timeout_seconds) / 2.0).min(MAX_SLOW_SECONDS);
    let fill = |text: &str| {
        (text.replace("{slow}", &slow.to_string()))
            .replace("{timeout}", &options.timeout_seconds.to_string())
            .replace("{job}", &options.job)
    };
    let mut rules: Vec<Rule> =
        serde_saphyr::from_str(include_str!("alerts.yaml")).expect("alerts.yaml is valid");
    for rule in &mut rules {
        rule.expr = fill(&rule.expr);
        rule.annotations.description = fill(&rule.annotations.description);
        rule.annotations.runbook_url =
            format!("{}#{}", options.runbook_url, rule.alert.to_lowercase());
    }
    rules
}

/// What `manifests alerts` prints: a rule file, or with `--prometheus-operator` a PrometheusRule.
pub fn alerts(args: &AlertsArgs) -> Result<String, ManifestsError> {
    if !(1..=30).contains(&args.timeout_seconds) {
        return Err(ManifestsError::Timeout(args.timeout_seconds));
    }
    let (job, timeout) = (&args.job, args.timeout_seconds);
    let groups = Groups {
        groups: [Group {
            name: NAME,
            rules: rules(args),
        }],
    };
    if !args.prometheus_operator {
        return Ok(format!(
            "# Alert rules for kube-object-lock (manifests alerts --job {job} --timeout-seconds {timeout}).\n{}",
            yaml(&groups)?
        ));
    }
    let rule = PrometheusRule {
        api_version: "monitoring.coreos.com/v1",
        kind: "PrometheusRule",
        metadata: json!({"name": NAME, "labels": {"app.kubernetes.io/name": NAME}}),
        spec: groups,
    };
    Ok(format!(
        "# Alert rules for kube-object-lock (manifests alerts --prometheus-operator --job {job} --timeout-seconds {timeout}).\n# Add the labels your Prometheus' ruleSelector selects.\n---\n{}",
        yaml(&rule)?
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn args(prometheus_operator: bool, timeout_seconds: i32) -> AlertsArgs {
        AlertsArgs {
            prometheus_operator,
            job: DEFAULT_JOB.to_owned(),
            timeout_seconds,
            runbook_url: DEFAULT_RUNBOOK_URL.to_owned(),
        }
    }

    /// Both forms hold the same groups, each alert with its runbook section.
    #[test]
    fn both_forms_hold_the_same_groups() {
        let file: Value =
            serde_saphyr::from_str(&alerts(&args(false, 5)).expect("renders")).expect("yaml");
        let operator: Value =
            serde_saphyr::from_str(&alerts(&args(true, 5)).expect("renders")).expect("yaml");
        assert_eq!(operator["kind"], "PrometheusRule");
        assert_eq!(file["groups"], operator["spec"]["groups"]);
        let rules = file["groups"][0]["rules"].as_array().expect("rules");
        assert_eq!(rules.len(), 10);
        for rule in rules {
            let name = rule["alert"].as_str().expect("name");
            let annotations = &rule["annotations"];
            assert_eq!(
                annotations["runbook_url"],
                format!("docs/operations.md#{}", name.to_lowercase())
            );
            assert!(
                annotations["summary"]
                    .as_str()
                    .is_some_and(|s| !s.is_empty())
            );
            assert!(rule["for"].as_str().is_some(), "{name}");
        }
    }

    /// The committed files under deploy/alerts/ are what the code generates.
    #[test]
    fn committed_rules_match_the_code() {
        let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("deploy/alerts");
        let regenerate = "regenerate with: cargo run -- manifests alerts > deploy/alerts/kube-object-lock.rules.yaml && cargo run -- manifests alerts --prometheus-operator > deploy/alerts/prometheus-rule.yaml";
        for (file, generated) in [
            ("kube-object-lock.rules.yaml", alerts(&args(false, 5))),
            ("prometheus-rule.yaml", alerts(&args(true, 5))),
        ] {
            let committed = std::fs::read_to_string(root.join(file)).expect(file);
            assert!(
                committed == generated.expect("renders"),
                "deploy/alerts/{file} is stale; {regenerate}"
            );
        }
    }

    /// The latency threshold is half the timeout, kept below the top bucket.
    #[test]
    fn the_latency_threshold_follows_the_timeout() {
        let expr = |timeout| {
            let rules = rules(&args(false, timeout));
            let slow = rules
                .into_iter()
                .find(|r| r.alert == "KubeObjectLockReviewsSlow");
            slow.expect("alert").expr
        };
        assert!(expr(5).ends_with("> 2.5"), "{}", expr(5));
        assert!(expr(30).ends_with("> 6.5"), "{}", expr(30));
        let err = alerts(&args(false, 31)).expect_err("out of range");
        assert!(err.to_string().contains("--timeout-seconds"), "{err}");
    }
}
