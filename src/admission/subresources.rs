//! The subresources of the Kubernetes API server (1.33–1.36) whose writes change the object
//! they belong to, and what their admission reviews carry.
//!
//! The decision locks every subresource (of `status`, what is not status); the registration can only send what it
//! names, so it names these ([`rule_resources`], used by `cli::manifests`), and a test compares
//! the two over every subresource the API server serves. Selector locks need to know whether a review carries the
//! object itself (its labels) or an object of another kind: a `scale` review carries an
//! autoscaling/v1 `Scale`, which has no labels at all.

/// Where a subresource is served.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Scope {
    /// Namespaced resources only.
    Namespaced,
    /// Cluster-scoped resources only.
    Cluster,
    /// Both (`scale`: Deployments, and any custom resource with a scale subresource).
    Any,
}

/// A subresource whose UPDATE changes its object.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Subresource {
    /// The resource it belongs to; `*` for any.
    pub resource: &'static str,
    /// The subresource, e.g. `scale`.
    pub name: &'static str,
    /// Where it is served.
    pub scope: Scope,
    /// True when `object` and `oldObject` of its reviews are the object itself (so its labels
    /// are known); false when they are of another kind.
    pub carries_object: bool,
}

impl Subresource {
    /// `pods/resize`, `*/scale`: the form of a webhook rule's `resources`.
    pub fn path(&self) -> String {
        format!("{}/{}", self.resource, self.name)
    }

    /// True when this entry is about `resource`/`name`.
    fn matches(&self, resource: &str, name: &str) -> bool {
        self.name == name && (self.resource == "*" || self.resource == resource)
    }
}

/// Every subresource of the API server (1.33–1.36) whose UPDATE changes the object. Others are CREATEs of other objects
/// (`pods/eviction`, `pods/binding`, `serviceaccounts/token`), CONNECTs (`exec`, `attach`,
/// `portforward`, `proxy`) or reads (`log`).
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

/// The entry for `resource`/`name`, if the API server has such a changing subresource.
pub fn changing(resource: &str, name: &str) -> Option<&'static Subresource> {
    CHANGING.iter().find(|s| s.matches(resource, name))
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
