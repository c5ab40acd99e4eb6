//! `manifests alerts`: Prometheus alert rules over the webhook's metrics, as a rule file or a
//! Prometheus Operator `PrometheusRule`. Invariant: each alert links the section of
//! docs/operations.md named after it, and none fires on a healthy, idle cluster.

use serde::Serialize;
use serde_json::{Value, json};

use super::{ManifestsError, NAME, yaml};

/// Where the runbooks are by default: the operations guide in the source tree.
pub const DEFAULT_RUNBOOK_URL: &str = "docs/operations.md";
/// The `job` label of the scrape configuration by default.
pub const DEFAULT_JOB: &str = NAME;
/// Below the highest finite bucket of `admission_duration_seconds` (25 µs doubled 18 times,
/// 6.5536 s): a quantile above it reads as that bound, so a threshold must stay below it.
const MAX_SLOW_SECONDS: f64 = 6.5;

#[derive(Debug, Clone, PartialEq)]
pub struct AlertOptions {
    /// The `job` label Prometheus gives the webhook's targets.
    pub job: String,
    pub timeout_seconds: i32,
    /// The operations guide; each alert's runbook is `URL#alertname-in-lower-case`.
    pub runbook_url: String,
}

impl AlertOptions {
    /// Checks the timeout as `manifests cluster` does.
    pub fn new(job: &str, timeout_seconds: i32, runbook_url: &str) -> Result<Self, ManifestsError> {
        if !(1..=30).contains(&timeout_seconds) {
            return Err(ManifestsError::Timeout(timeout_seconds));
        }
        Ok(AlertOptions {
            job: job.to_owned(),
            timeout_seconds,
            runbook_url: runbook_url.to_owned(),
        })
    }
}

struct Alert {
    name: &'static str,
    expr: String,
    wait: &'static str,
    severity: &'static str,
    summary: &'static str,
    description: String,
}

/// The alerts, in the order of the runbook.
fn alerts(options: &AlertOptions) -> Vec<Alert> {
    let job = &options.job;
    // Half the API server's wait, below the top bucket: p99 there leaves the other half for
    // the network, TLS and the API server's own queue.
    let slow = (f64::from(options.timeout_seconds) / 2.0).min(MAX_SLOW_SECONDS);
    vec![
        Alert {
            name: "KubeObjectLockInstanceDown",
            expr: format!("up{{job=\"{job}\"}} == 0"),
            wait: "3m",
            severity: "critical",
            summary: "A kube-object-lock instance cannot be scraped.",
            description: "{{ $labels.instance }} has not answered Prometheus for 3 minutes (longer than a restart takes). The API server next to it calls it for every UPDATE and DELETE: with failurePolicy Fail they are refused, with Ignore they go through unchecked. Check the service on that host (systemctl status kube-object-lock; journalctl -u kube-object-lock) and that the metrics listener (metrics.listen) is reachable from Prometheus.".to_owned(),
        },
        Alert {
            name: "KubeObjectLockNotScraped",
            expr: format!("absent(up{{job=\"{job}\"}})"),
            wait: "10m",
            severity: "warning",
            summary: "Prometheus has no kube-object-lock target.",
            description: format!("No target with job=\"{job}\" for 10 minutes: nothing watches the webhook, and its other alerts cannot fire. Check the scrape configuration (static_configs, file_sd_configs or a ScrapeConfig) and that its job label is the one these rules were generated for (manifests alerts --job)."),
        },
        Alert {
            name: "KubeObjectLockIndexStale",
            expr: "max by (instance, kind) (kube_object_lock_lock_source_mode{mode=\"fallback\"}) == 1".to_owned(),
            wait: "5m",
            severity: "warning",
            summary: "The lock index is stale: lookups go to the API server.",
            description: "{{ $labels.instance }} has not had a live watch of {{ $labels.kind }} objects for 5 minutes: its index is past kube.stale_after, so every lookup LISTs the API server (slower, and failing while the API server does), and the narrowed registration follows only each re-list. 5 minutes rides over an API server restart. Its log says why (the line 'lock index stale', its reason): an API server that is unreachable or frozen, a watch that is forbidden (RBAC: list and watch on locks and clusterlocks), or a watch that keeps going silent.".to_owned(),
        },
        Alert {
            name: "KubeObjectLockLookupsFailing",
            expr: "sum by (instance, decision) (increase(kube_object_lock_lookup_errors_total[5m])) > 0".to_owned(),
            wait: "5m",
            severity: "critical",
            summary: "Lock lookups fail: requests are answered by on_lookup_error.",
            description: "{{ $labels.instance }} could not read the locks for some requests in every 5-minute window for 5 minutes, and answered them with on_lookup_error={{ $labels.decision }}: with deny, changes are refused whether locked or not; with allow, they go through without a lock check. The reason label of kube_object_lock_lookup_errors_total says why (timeout, forbidden, api). Check that the API server answers within kube.lookup_timeout, the webhook's RBAC, and KubeObjectLockIndexStale.".to_owned(),
        },
        Alert {
            name: "KubeObjectLockRegistrationNotWritten",
            expr: "max by (instance, name) (kube_object_lock_registration_current) == 0".to_owned(),
            wait: "10m",
            severity: "critical",
            summary: "The webhook configuration is not kept up to date.",
            description: "{{ $labels.instance }} has not confirmed for 10 minutes that the ValidatingWebhookConfiguration {{ $labels.name }} names the locked objects (failed writes retry within 30 s, so this is not a passing error). The API server sends only what the configuration names: a Lock made meanwhile may not be enforced. kube_object_lock_registration_writes_total says how writes fail (missing: apply manifests cluster; forbidden: RBAC; error: see the log). With a registration from manifests cluster --broad, set registration.narrow = false.".to_owned(),
        },
        Alert {
            name: "KubeObjectLockRegistrationFighting",
            expr: "sum by (instance) (increase(kube_object_lock_registration_undone_total[10m])) > 3 or sum by (instance) (increase(kube_object_lock_registration_writes_total{outcome=\"conflict\"}[10m])) > 10".to_owned(),
            wait: "10m",
            severity: "warning",
            summary: "Another writer keeps changing the webhook configuration.",
            description: "For 10 minutes {{ $labels.instance }} has kept putting back what another writer changed in the webhook configuration (more than 3 times in 10 minutes; an operator's edit is once), or its writes keep being refused as planned from an old version (more than 10 conflicts in 10 minutes). Every write makes every API server reload its webhooks. Usually instances of two versions, or with different registration settings, during an upgrade that did not finish; or a deployment tool re-applying manifests cluster. Make the instances' versions and registration settings agree.".to_owned(),
        },
        Alert {
            name: "KubeObjectLockCertificateExpiring",
            expr: "kube_object_lock_certificate_expiry_timestamp_seconds - time() < 14 * 86400 and kube_object_lock_certificate_expiry_timestamp_seconds > 0".to_owned(),
            wait: "10m",
            severity: "warning",
            summary: "The serving certificate expires within 14 days.",
            description: "The certificate {{ $labels.instance }} serves expires in {{ $value | humanizeDuration }}; after that the API server refuses the TLS handshake and every call fails (failurePolicy decides what happens to the request). 14 days leaves time for a renewal to go through change control. Renew tls.cert and tls.key (kube-object-lock certs, or your CA); the webhook reloads them without a restart (tls.reload_interval, or SIGHUP).".to_owned(),
        },
        Alert {
            name: "KubeObjectLockReviewsSlow",
            expr: format!("histogram_quantile(0.99, sum by (instance, le) (rate(kube_object_lock_admission_duration_seconds_bucket[5m]))) > {slow}"),
            wait: "10m",
            severity: "warning",
            summary: "Reviews take more than half the webhook's timeoutSeconds.",
            description: format!("The slowest 1% of reviews on {{{{ $labels.instance }}}} took {{{{ $value | humanizeDuration }}}} or more for 10 minutes, more than half of timeoutSeconds ({timeout} s, the rules were generated with manifests alerts --timeout-seconds {timeout}); past the timeout the API server gives up and applies failurePolicy. Usually lookups that wait on a slow API server (the index stale: see KubeObjectLockIndexStale; kube.lookup_timeout bounds the wait) or a host short of CPU.", timeout = options.timeout_seconds),
        },
        Alert {
            name: "KubeObjectLockStatusWritesFailing",
            expr: "sum by (instance) (increase(kube_object_lock_status_writes_total{outcome=~\"forbidden|error\"}[15m])) > 0".to_owned(),
            wait: "15m",
            severity: "warning",
            summary: "Lock status writes fail.",
            description: "{{ $labels.instance }} has failed to write its entry of lock statuses in every 15-minute window for 15 minutes (failed writes retry within 30 s). Locks are still enforced, but kubectl get locks and kubectl lock list no longer show which instances enforce them. Check the log (lock status) and RBAC: patch on locks/status and clusterlocks/status.".to_owned(),
        },
        Alert {
            name: "KubeObjectLockEventWritesFailing",
            expr: "sum by (instance) (increase(kube_object_lock_event_writes_total{outcome=\"failure\"}[15m])) > 0".to_owned(),
            wait: "15m",
            severity: "warning",
            summary: "Refusal events are not written.",
            description: "{{ $labels.instance }} has failed to write Kubernetes Events of its refusals in every 15-minute window for 15 minutes. Refusals still happen, but kubectl describe lock no longer shows them. Check the log and RBAC: create and patch on events.k8s.io events.".to_owned(),
        },
    ]
}

/// One rule as Prometheus reads it, its fields in the usual order.
#[derive(Serialize)]
struct Rule {
    alert: &'static str,
    expr: String,
    #[serde(rename = "for")]
    wait: &'static str,
    labels: Labels,
    annotations: Annotations,
}

#[derive(Serialize)]
struct Labels {
    severity: &'static str,
}

#[derive(Serialize)]
struct Annotations {
    summary: &'static str,
    description: String,
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
    groups: Vec<Group>,
}

#[derive(Serialize)]
#[serde(rename_all = "camelCase")]
struct PrometheusRule {
    api_version: &'static str,
    kind: &'static str,
    metadata: Value,
    spec: Groups,
}

fn groups(options: &AlertOptions) -> Groups {
    let rules: Vec<Rule> = alerts(options)
        .into_iter()
        .map(|alert| Rule {
            alert: alert.name,
            expr: alert.expr,
            wait: alert.wait,
            labels: Labels {
                severity: alert.severity,
            },
            annotations: Annotations {
                summary: alert.summary,
                description: alert.description,
                runbook_url: format!("{}#{}", options.runbook_url, alert.name.to_lowercase()),
            },
        })
        .collect();
    Groups {
        groups: vec![Group { name: NAME, rules }],
    }
}

pub fn rule_file(options: &AlertOptions) -> Result<String, ManifestsError> {
    Ok(format!(
        "# Alert rules for kube-object-lock (manifests alerts --job {} --timeout-seconds {}).\n{}",
        options.job,
        options.timeout_seconds,
        yaml(&groups(options))?
    ))
}

/// The same groups as a Prometheus Operator `PrometheusRule`.
pub fn prometheus_rule(options: &AlertOptions) -> Result<String, ManifestsError> {
    let rule = PrometheusRule {
        api_version: "monitoring.coreos.com/v1",
        kind: "PrometheusRule",
        metadata: json!({"name": NAME, "labels": {"app.kubernetes.io/name": NAME}}),
        spec: groups(options),
    };
    Ok(format!(
        "# Alert rules for kube-object-lock (manifests alerts --prometheus-operator --job {} --timeout-seconds {}).\n# Add the labels your Prometheus' ruleSelector selects.\n---\n{}",
        options.job,
        options.timeout_seconds,
        yaml(&rule)?
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn options() -> AlertOptions {
        AlertOptions::new(DEFAULT_JOB, 5, DEFAULT_RUNBOOK_URL).expect("valid")
    }

    /// Both forms hold the same groups, each alert with its runbook section.
    #[test]
    fn both_forms_hold_the_same_groups() {
        let file: Value =
            serde_saphyr::from_str(&rule_file(&options()).expect("renders")).expect("yaml");
        let operator: Value =
            serde_saphyr::from_str(&prometheus_rule(&options()).expect("renders")).expect("yaml");
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
            ("kube-object-lock.rules.yaml", rule_file(&options())),
            ("prometheus-rule.yaml", prometheus_rule(&options())),
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
            let options = AlertOptions::new("kol", timeout, "u").expect("valid");
            let alerts = alerts(&options);
            let slow = alerts
                .iter()
                .find(|a| a.name == "KubeObjectLockReviewsSlow");
            slow.expect("alert").expr.clone()
        };
        assert!(expr(5).ends_with("> 2.5"), "{}", expr(5));
        assert!(expr(30).ends_with("> 6.5"), "{}", expr(30));
        let err = AlertOptions::new("kol", 31, "u").expect_err("out of range");
        assert!(err.to_string().contains("--timeout-seconds"), "{err}");
    }
}
