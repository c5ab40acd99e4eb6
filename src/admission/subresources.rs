//! The API server's (1.33–1.36) subresources whose writes change their object, what their
//! reviews carry (the object itself, or e.g. a `Scale` without labels), and the webhook rules
//! that send them ([`rule_resources`]).

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Scope {
    Namespaced,
    Cluster,
    /// Both (`scale`: Deployments, and any custom resource with a scale subresource).
    Any,
}

/// A subresource whose UPDATE changes its object.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Subresource {
    /// The resource it belongs to; `*` for any.
    pub resource: &'static str,
    pub name: &'static str,
    pub scope: Scope,
    /// True when its reviews' objects are the object itself (so its labels are known).
    pub carries_object: bool,
}

impl Subresource {
    /// `pods/resize`, `*/scale`: the form of a webhook rule's `resources`.
    pub fn path(&self) -> String {
        format!("{}/{}", self.resource, self.name)
    }

    fn matches(&self, resource: &str, name: &str) -> bool {
        self.name == name && (self.resource == "*" || self.resource == resource)
    }
}

/// Every subresource (API server 1.33–1.36) whose UPDATE changes the object; the others create
/// other objects (`pods/eviction`, `pods/binding`), CONNECT (`exec`, `proxy`) or read (`log`).
pub const CHANGING: &[Subresource] = &[
    // Status: it may change the status, but what else a status write carries (a pod's labels,
    // annotations and finalizers) counts like an UPDATE of the object.
    Subresource {
        resource: "*",
        name: "status",
        scope: Scope::Any,
        carries_object: true,
    },
    // autoscaling/v1 Scale: spec.replicas of Deployments, ReplicaSets, StatefulSets,
    // ReplicationControllers and custom resources (kubectl scale, HPA).
    Subresource {
        resource: "*",
        name: "scale",
        scope: Scope::Any,
        carries_object: false,
    },
    // kubectl debug: adds ephemeral containers to the pod spec.
    Subresource {
        resource: "pods",
        name: "ephemeralcontainers",
        scope: Scope::Namespaced,
        carries_object: true,
    },
    // In-place resize of a pod's container resources (beta in 1.33, GA in 1.35).
    Subresource {
        resource: "pods",
        name: "resize",
        scope: Scope::Namespaced,
        carries_object: true,
    },
    // spec.finalizers of a Namespace: the last step of its deletion, and the well-known way to
    // force a stuck namespace away.
    Subresource {
        resource: "namespaces",
        name: "finalize",
        scope: Scope::Cluster,
        carries_object: true,
    },
    // Approving or denying a CertificateSigningRequest.
    Subresource {
        resource: "certificatesigningrequests",
        name: "approval",
        scope: Scope::Cluster,
        carries_object: true,
    },
];

pub fn changing(resource: &str, name: &str) -> Option<&'static Subresource> {
    CHANGING.iter().find(|s| s.matches(resource, name))
}

/// `(group, resource)` never sent (`manifests cluster`'s exclusions) or never stored: a Lock naming
/// only these locks nothing, widens no registration and blocks no namespace deletion.
const NEVER_SENT: &[(&str, &str)] = &[
    // Unlocking is deleting a lock: the lock group is never sent, whatever its resources.
    (crate::api::GROUP, "*"),
    // High-churn traffic the registration leaves out.
    ("coordination.k8s.io", "leases"),
    ("*", "events"),
    // Reviews and bindings: created and answered, never stored.
    ("authentication.k8s.io", "tokenreviews"),
    ("authentication.k8s.io", "selfsubjectreviews"),
    ("authorization.k8s.io", "subjectaccessreviews"),
    ("authorization.k8s.io", "selfsubjectaccessreviews"),
    ("authorization.k8s.io", "localsubjectaccessreviews"),
    ("authorization.k8s.io", "selfsubjectrulesreviews"),
    ("", "bindings"),
    ("", "componentstatuses"),
];

/// Whether a lock rule's `group` and `resource` (`*`, or a subresource such as `pods/exec`) can
/// name what the webhook is sent: an object, a [`CHANGING`] subresource, an eviction or CONNECT.
pub fn may_be_sent(group: &str, resource: &str) -> bool {
    if let Some((resource, sub)) = resource.split_once('/') {
        let core = group == "*" || group.is_empty();
        let of_pods = core
            && (resource == "pods" || resource == "*")
            && matches!(
                sub,
                "*" | "eviction" | "exec" | "attach" | "portforward" | "proxy"
            );
        let changes = sub == "*"
            || changing(resource, sub).is_some()
            || (resource == "*" && CHANGING.iter().any(|s| s.name == sub));
        return of_pods || (changes && may_be_sent(group, resource));
    }
    !(NEVER_SENT.iter()).any(|(g, r)| (*g == "*" || *g == group) && (*r == "*" || *r == resource))
}

/// Whether a lock's `resources` can name anything the webhook is sent ([`may_be_sent`]): none
/// names everything; an empty list, or only what is never sent, locks nothing.
pub fn locks_anything(spec: &crate::api::LockSpec) -> bool {
    let Some(rules) = &spec.resources else {
        return true;
    };
    rules.iter().any(|rule| {
        (rule.api_groups.iter())
            .any(|group| (rule.resources.iter()).any(|resource| may_be_sent(group, resource)))
    })
}

/// The resources whose `proxy` subresource takes `[scheme:]NAME[:port]` in the name segment.
pub const PROXIED: [&str; 3] = ["pods", "services", "nodes"];

/// The object name of a proxy name segment (`NAME`, `NAME:PORT`, `SCHEME:NAME:PORT`) as
/// apimachinery's `SplitSchemeNamePort` splits it; `None` where the API server answers 400.
pub fn proxied_name(segment: &str) -> Option<&str> {
    let mut parts = segment.split(':');
    let (first, second, third) = (parts.next(), parts.next(), parts.next());
    if parts.next().is_some() {
        return None;
    }
    let (scheme, name) = match (first, second, third) {
        (Some(scheme), Some(name), Some(_)) => (scheme, name),
        (Some(name), _, None) => ("", name),
        _ => return None,
    };
    (!name.is_empty() && matches!(scheme, "" | "http" | "https")).then_some(name)
}

/// The `resources` of the webhook rules for one scope: every object (`*`) and every changing
/// subresource served there.
pub fn rule_resources(namespaced: bool) -> Vec<String> {
    let scope = if namespaced {
        Scope::Namespaced
    } else {
        Scope::Cluster
    };
    std::iter::once("*".to_owned())
        .chain(
            CHANGING
                .iter()
                .filter(|s| s.scope == scope || s.scope == Scope::Any)
                .map(Subresource::path),
        )
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn proxy_names_split_as_the_api_server_splits_them() {
        for (segment, name) in [
            ("db-0", Some("db-0")),
            ("db-0:8080", Some("db-0")),
            ("db-0:", Some("db-0")),
            ("db-0:metrics", Some("db-0")),
            ("http:db-0:8080", Some("db-0")),
            ("https:db-0:8443", Some("db-0")),
            ("https:db-0:", Some("db-0")),
            (":db-0:80", Some("db-0")),
            ("ftp:db-0:21", None),
            ("HTTP:db-0:80", None),
            ("http:db-0:80:1", None),
            ("", None),
            (":8080", None),
            ("http::8080", None),
            ("a:b:c:d", None),
        ] {
            assert_eq!(proxied_name(segment), name, "{segment:?}");
        }
    }

    #[test]
    fn what_the_registration_never_sends() {
        for (group, resource, sent) in [
            ("", "configmaps", true),
            ("apps", "deployments", true),
            ("*", "*", true),
            ("objectlock.dev", "*", false),
            ("objectlock.dev", "locks", false),
            ("objectlock.dev", "clusterlocks", false),
            ("objectlock.dev", "anything", false),
            ("*", "locks", true),
            ("coordination.k8s.io", "leases", false),
            ("coordination.k8s.io", "*", true),
            ("*", "leases", true),
            ("", "events", false),
            ("events.k8s.io", "events", false),
            ("*", "events", false),
            ("authentication.k8s.io", "tokenreviews", false),
            ("authorization.k8s.io", "subjectaccessreviews", false),
            ("", "pods/status", true),
            ("*", "*/status", true),
            ("", "pods/binding", false),
            ("", "pods/exec", true),
            ("", "pods/eviction", true),
            ("", "pods/log", false),
            ("apps", "deployments/scale", true),
            ("apps", "*/scale", true),
            ("", "pods/*", true),
            ("objectlock.dev", "locks/*", false),
            ("", "services/proxy", false),
        ] {
            assert_eq!(may_be_sent(group, resource), sent, "{group}/{resource}");
        }
    }

    #[test]
    fn lookups_by_resource_and_name() {
        assert!(changing("deployments", "scale").is_some_and(|s| !s.carries_object));
        assert!(changing("widgets", "scale").is_some());
        assert!(changing("pods", "resize").is_some_and(|s| s.carries_object));
        assert!(changing("services", "resize").is_none());
        assert!(changing("pods", "status").is_some_and(|s| s.carries_object));
        assert!(changing("pods", "log").is_none());
        assert_eq!(
            rule_resources(true),
            [
                "*",
                "*/status",
                "*/scale",
                "pods/ephemeralcontainers",
                "pods/resize"
            ]
        );
        assert_eq!(
            rule_resources(false),
            [
                "*",
                "*/status",
                "*/scale",
                "namespaces/finalize",
                "certificatesigningrequests/approval"
            ]
        );
    }
}
