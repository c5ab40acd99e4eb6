//! The parts of an admission request the decision reads, borrowed from the body by serde; the
//! rest (whole objects) is skipped unparsed.

use std::borrow::Cow;
use std::collections::BTreeMap;

use serde::Deserialize;

use super::subresources;

pub const ADMISSION_V1: &str = "admission.k8s.io/v1";
pub const ADMISSION_V1BETA1: &str = "admission.k8s.io/v1beta1";

#[derive(Clone, Copy, Debug, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "SCREAMING_SNAKE_CASE")]
pub enum Operation {
    /// CREATE (and subresource creates such as `pods/eviction`).
    Create,
    /// UPDATE, PATCH and server-side apply.
    Update,
    /// DELETE, and each item of a DELETECOLLECTION.
    Delete,
    /// CONNECT (exec, attach, port-forward, proxy).
    Connect,
}

impl Operation {
    pub fn as_str(self) -> &'static str {
        match self {
            Operation::Create => "CREATE",
            Operation::Update => "UPDATE",
            Operation::Delete => "DELETE",
            Operation::Connect => "CONNECT",
        }
    }
}

#[derive(Clone, Debug, Default, PartialEq, Eq, Deserialize)]
pub struct Resource<'a> {
    #[serde(default, borrow)]
    pub group: Cow<'a, str>,
    #[serde(default, borrow)]
    pub version: Cow<'a, str>,
    #[serde(borrow)]
    pub resource: Cow<'a, str>,
}

impl Resource<'_> {
    /// `configmaps`, `deployments.apps`: the form kubectl and the API server use in messages.
    pub fn qualified(&self) -> String {
        if self.group.is_empty() {
            self.resource.to_string()
        } else {
            format!("{}.{}", self.resource, self.group)
        }
    }
}

#[derive(Clone, Debug, Default, PartialEq, Eq, Deserialize)]
pub struct UserInfo<'a> {
    #[serde(default, borrow)]
    pub username: Cow<'a, str>,
    #[serde(default, borrow)]
    pub groups: Vec<Cow<'a, str>>,
}

#[derive(Clone, Debug, Default, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ObjectMeta<'a> {
    /// The object's name (the only place a DELETECOLLECTION item carries it).
    #[serde(default, borrow)]
    pub name: Option<Cow<'a, str>>,
    #[serde(default, borrow)]
    pub deletion_timestamp: Option<Cow<'a, str>>,
    /// Absent means none (the API server leaves out an empty map).
    #[serde(default)]
    pub labels: Option<BTreeMap<String, String>>,
}

#[derive(Clone, Debug, Default, PartialEq, Eq, Deserialize)]
pub struct Object<'a> {
    #[serde(default, borrow)]
    pub metadata: ObjectMeta<'a>,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ParsedReview<'a> {
    pub api_version: &'static str,
    pub request: AdmissionRequest<'a>,
}

/// The top of an AdmissionReview, as it arrives. `apiVersion` and `kind` are only compared, so
/// they are borrowed from the body unless escaped.
#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
pub(super) struct IncomingReview<'a> {
    #[serde(default, borrow)]
    pub(super) api_version: Cow<'a, str>,
    #[serde(default, borrow)]
    pub(super) kind: Cow<'a, str>,
    #[serde(default)]
    pub(super) request: Option<AdmissionRequest<'a>>,
}

#[derive(Clone, Debug, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct AdmissionRequest<'a> {
    /// Echoed in the response; the API server matches answers by it.
    #[serde(borrow)]
    pub uid: Cow<'a, str>,
    /// The resource the request was converted to (see `requestResource` for what was called).
    #[serde(borrow)]
    pub resource: Resource<'a>,
    /// `status`, `scale`, `eviction`, ...; absent for the object itself.
    #[serde(default, borrow)]
    pub sub_resource: Option<Cow<'a, str>>,
    /// The object's name; absent on DELETECOLLECTION items.
    #[serde(default, borrow)]
    pub name: Option<Cow<'a, str>>,
    /// Absent for cluster-scoped objects; a Namespace's own name for a Namespace.
    #[serde(default, borrow)]
    pub namespace: Option<Cow<'a, str>>,
    pub operation: Operation,
    #[serde(borrow)]
    pub user_info: UserInfo<'a>,
    #[serde(default, borrow)]
    pub object: Option<Object<'a>>,
    #[serde(default, borrow)]
    pub old_object: Option<Object<'a>>,
    #[serde(default)]
    pub dry_run: Option<bool>,
}

impl AdmissionRequest<'_> {
    /// A request from JSON, for tests: the text it borrows from is kept for the test's run.
    #[cfg(test)]
    pub(crate) fn from_json(
        value: serde_json::Value,
    ) -> serde_json::Result<AdmissionRequest<'static>> {
        serde_json::from_str(Box::leak(value.to_string().into_boxed_str()))
    }

    /// `request.name`, else `oldObject.metadata.name` (DELETECOLLECTION items); a proxy name as
    /// the API server reads it (`http:db-0:8080` is `db-0`), else as written.
    pub fn object_name(&self) -> Option<&str> {
        let proxied = self.resource.group.is_empty()
            && self.subresource() == Some("proxy")
            && subresources::PROXIED.contains(&&*self.resource.resource);
        self.name
            .as_deref()
            .filter(|n| !n.is_empty())
            .map(|n| match proxied {
                true => subresources::proxied_name(n).unwrap_or(n),
                false => n,
            })
            .or_else(|| {
                self.old_object
                    .as_ref()
                    .and_then(|o| o.metadata.name.as_deref())
            })
            .or_else(|| {
                self.object
                    .as_ref()
                    .and_then(|o| o.metadata.name.as_deref())
            })
            .filter(|n| !n.is_empty())
    }

    /// The namespace of a namespaced object; `None` for a cluster-scoped one.
    /// A Namespace arrives with `request.namespace` set to its own name, yet it is cluster-scoped.
    pub fn object_namespace(&self) -> Option<&str> {
        if self.is_namespace() {
            return None;
        }
        self.namespace.as_deref().filter(|ns| !ns.is_empty())
    }

    pub fn is_namespace(&self) -> bool {
        self.resource.group.is_empty() && self.resource.resource == "namespaces"
    }

    pub fn is_terminating(&self) -> bool {
        [&self.old_object, &self.object].into_iter().any(|o| {
            o.as_ref()
                .is_some_and(|o| o.metadata.deletion_timestamp.is_some())
        })
    }

    /// The labels of the object before the change (as created, for a CREATE); `None` when the
    /// request does not carry them (eviction, CONNECT, scale), `Some` of an empty map when it
    /// has none: `tier NotIn (db)` selects the latter, never a Scale of a `tier=db` Deployment.
    pub fn labels(&self) -> Option<&BTreeMap<String, String>> {
        static NONE: BTreeMap<String, String> = BTreeMap::new();
        let old = match (self.operation, self.subresource()) {
            (Operation::Create, None) => self.object.as_ref()?,
            _ => self.old_object.as_ref()?,
        };
        if let Some(sub) = self.subresource() {
            subresources::changing(&self.resource.resource, sub).filter(|s| s.carries_object)?;
        }
        Some(old.metadata.labels.as_ref().unwrap_or(&NONE))
    }

    /// The subresource, with `""` read as none.
    pub fn subresource(&self) -> Option<&str> {
        self.sub_resource.as_deref().filter(|s| !s.is_empty())
    }

    /// `resource.group` plus `/subresource` when there is one, e.g. `deployments.apps/scale`.
    pub fn resource_path(&self) -> String {
        match self.subresource() {
            Some(sub) => format!("{}/{sub}", self.resource.qualified()),
            None => self.resource.qualified(),
        }
    }
}
