//! Finding the resource a user names as kubectl does, through API discovery: by plural,
//! singular, short name or kind, optionally with group (`deployments.apps`) or version and group.

use std::collections::BTreeSet;

use futures::future::join_all;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::APIResourceList;
use kube::api::{ApiResource, GroupVersionKind};
use kube::core::Version;

use crate::api;

/// One resource type at `version` (`preferred`: the group's preferred one); core group `""`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ResourceType {
    pub group: String,
    pub version: String,
    pub preferred: bool,
    pub plural: String,
    pub singular: String,
    pub kind: String,
    pub short_names: Vec<String>,
    pub namespaced: bool,
}

impl ResourceType {
    pub fn api_resource(&self) -> ApiResource {
        let gvk = GroupVersionKind::gvk(&self.group, &self.version, &self.kind);
        ApiResource::from_gvk_with_plural(&gvk, &self.plural)
    }

    pub fn is_lock(&self) -> bool {
        self.group == api::GROUP && [api::LOCKS, api::CLUSTER_LOCKS].contains(&self.plural.as_str())
    }

    pub fn qualified(&self) -> String {
        qualified(&self.group, &self.plural)
    }

    /// Subresources left out.
    pub fn from_list(list: &APIResourceList, preferred: bool) -> Vec<ResourceType> {
        let (group, version) = match list.group_version.split_once('/') {
            Some(split) => split,
            None => ("", list.group_version.as_str()),
        };
        list.resources
            .iter()
            .filter(|r| !r.name.contains('/'))
            .map(|r| ResourceType {
                group: group.to_owned(),
                version: version.to_owned(),
                preferred,
                plural: r.name.clone(),
                singular: r.singular_name.clone(),
                kind: r.kind.clone(),
                short_names: r.short_names.clone().unwrap_or_default(),
                namespaced: r.namespaced,
            })
            .collect()
    }
}

/// `plural` in `group` as kubectl writes it: `configmaps`, `deployments.apps`.
pub fn qualified(group: &str, plural: &str) -> String {
    match group {
        "" => plural.to_owned(),
        group => format!("{plural}.{group}"),
    }
}

/// What a user wrote for a resource (`text`): the resource part lower-cased, and the groups (and
/// versions) it may be qualified with (none: any).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ResourceArg {
    pub text: String,
    name: String,
    groups: Vec<(String, Option<String>)>,
}

impl ResourceArg {
    /// `deployments.v1.apps` is version v1 of apps, or else the group `v1.apps`.
    pub fn parse(text: &str) -> ResourceArg {
        let lower = text.to_lowercase();
        let (name, groups) = match lower.split_once('.') {
            None => (lower.clone(), vec![]),
            Some((name, rest)) => {
                let mut groups = vec![];
                if let Some((version, group)) = rest.split_once('.')
                    && !matches!(Version::parse(version), Version::Nonconformant(_))
                {
                    groups.push((group.to_owned(), Some(version.to_owned())));
                }
                groups.push((rest.to_owned(), None));
                (name.to_owned(), groups)
            }
        };
        ResourceArg {
            text: text.to_owned(),
            name,
            groups,
        }
    }

    /// The groups discovery must read to resolve this; `None`: all of them.
    pub fn groups(&self) -> Option<BTreeSet<String>> {
        (!self.groups.is_empty()).then(|| self.groups.iter().map(|(g, _)| g.clone()).collect())
    }

    /// Whether it names a version: discovery must then read every version.
    pub fn has_version(&self) -> bool {
        self.groups.iter().any(|(_, version)| version.is_some())
    }

    fn allows(&self, resource: &ResourceType) -> bool {
        if self.groups.is_empty() {
            return resource.preferred;
        }
        self.groups.iter().any(|(group, version)| {
            *group == resource.group
                && version
                    .as_ref()
                    .map_or(resource.preferred, |v| *v == resource.version)
        })
    }
}

/// No match, or the qualified names of equal matches.
#[derive(Debug, PartialEq, Eq)]
pub enum ResolveError {
    Unknown,
    Ambiguous(Vec<String>),
}

/// The resource `arg` names among `types`: plural, singular and kind match before short names;
/// of equal matches the core group's wins, as in kubectl (`pods` is not `pods.metrics.k8s.io`).
pub fn resolve<'a>(
    arg: &ResourceArg,
    types: &'a [ResourceType],
) -> Result<&'a ResourceType, ResolveError> {
    let candidates: Vec<&ResourceType> = types.iter().filter(|t| arg.allows(t)).collect();
    let full = |t: &&ResourceType| {
        t.plural == arg.name || t.singular == arg.name || t.kind.to_lowercase() == arg.name
    };
    let short = |t: &&ResourceType| t.short_names.contains(&arg.name);
    for tier in [
        candidates.iter().copied().filter(full).collect::<Vec<_>>(),
        candidates.iter().copied().filter(short).collect(),
    ] {
        match tier[..] {
            [] => continue,
            [only] => return Ok(only),
            _ => {}
        }
        let core: Vec<_> = tier.iter().filter(|t| t.group.is_empty()).collect();
        if let [only] = core[..] {
            return Ok(only);
        }
        let names = tier.iter().map(|t| t.qualified()).collect();
        return Err(ResolveError::Ambiguous(names));
    }
    Err(ResolveError::Unknown)
}

/// The resource types found (core group first), and each document that could not be read as
/// `(group, "group/version: error")`: the rest is still usable, as in kubectl.
#[derive(Debug, Default)]
pub struct Discovered {
    pub types: Vec<ResourceType>,
    pub failures: Vec<(String, String)>,
}

impl Discovered {
    pub fn find(&self, group: &str, plural: &str) -> Option<&ResourceType> {
        self.types
            .iter()
            .find(|t| t.preferred && t.group == group && t.plural == plural)
    }
}

/// Reads discovery of every group, or only `groups`: the preferred versions, or all of them.
pub async fn discover(
    client: &kube::Client,
    groups: Option<&BTreeSet<String>>,
    all_versions: bool,
) -> Result<Discovered, kube::Error> {
    let wanted = |group: &str| groups.is_none_or(|g| g.contains(group));
    let mut documents: Vec<(String, bool)> = vec![];
    if wanted("") {
        let versions = client.list_core_api_versions().await?.versions;
        documents.extend(versions.into_iter().enumerate().map(|(i, v)| (v, i == 0)));
    }
    if groups.is_none_or(|g| g.iter().any(|g| !g.is_empty())) {
        for group in client.list_api_groups().await?.groups {
            let preferred = group.preferred_version.as_ref().or(group.versions.first());
            for version in group.versions.iter().filter(|_| wanted(&group.name)) {
                let is_preferred = preferred == Some(version);
                if all_versions || is_preferred {
                    documents.push((version.group_version.clone(), is_preferred));
                }
            }
        }
    }
    let lists = join_all(documents.iter().map(|(gv, _)| async move {
        if gv.contains('/') {
            client.list_api_group_resources(gv).await
        } else {
            client.list_core_api_resources(gv).await
        }
    }))
    .await;
    let mut discovered = Discovered::default();
    for ((gv, preferred), list) in documents.iter().zip(lists) {
        match list {
            Ok(list) => discovered
                .types
                .extend(ResourceType::from_list(&list, *preferred)),
            Err(e) => discovered.failures.push((
                gv.split_once('/').map_or("", |(group, _)| group).to_owned(),
                format!("{gv}: {}", super::error::detail(&e)),
            )),
        }
    }
    Ok(discovered)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn resource(group: &str, plural: &str, kind: &str, short: &[&str]) -> ResourceType {
        ResourceType {
            group: group.into(),
            version: "v1".into(),
            preferred: true,
            plural: plural.into(),
            singular: kind.to_lowercase(),
            kind: kind.into(),
            short_names: short.iter().map(|s| s.to_string()).collect(),
            namespaced: true,
        }
    }

    fn types() -> Vec<ResourceType> {
        let mut deployments_v1beta1 = resource("apps", "deployments", "Deployment", &["deploy"]);
        (deployments_v1beta1.version, deployments_v1beta1.preferred) = ("v1beta1".into(), false);
        vec![
            resource("", "configmaps", "ConfigMap", &["cm"]),
            resource("", "pods", "Pod", &["po"]),
            resource("", "events", "Event", &["ev"]),
            resource("apps", "deployments", "Deployment", &["deploy"]),
            deployments_v1beta1,
            resource("events.k8s.io", "events", "Event", &["ev"]),
            resource("metrics.k8s.io", "pods", "PodMetrics", &[]),
            resource("networking.istio.io", "gateways", "Gateway", &["gw"]),
            resource("gateway.networking.k8s.io", "gateways", "Gateway", &[]),
            resource("example.com", "widgets", "Widget", &["cm"]),
        ]
    }

    #[test]
    fn names_resolve_as_in_kubectl() {
        let types = types();
        let ok = |want: &str| Ok(want.to_owned());
        for (text, want) in [
            ("configmaps", ok("configmaps/v1")),
            ("configmap", ok("configmaps/v1")),
            ("cm", ok("configmaps/v1")),
            ("ConfigMap", ok("configmaps/v1")),
            ("deployments", ok("deployments.apps/v1")),
            ("deploy", ok("deployments.apps/v1")),
            ("deployment.apps", ok("deployments.apps/v1")),
            ("Deployment.apps", ok("deployments.apps/v1")),
            ("deploy.apps", ok("deployments.apps/v1")),
            ("deployments.v1beta1.apps", ok("deployments.apps/v1beta1")),
            ("deployments.v1.apps", ok("deployments.apps/v1")),
            // Built-in resources win over the same name in other groups.
            ("pods", ok("pods/v1")),
            ("events", ok("events/v1")),
            ("events.events.k8s.io", ok("events.events.k8s.io/v1")),
            (
                "gateways.networking.istio.io",
                ok("gateways.networking.istio.io/v1"),
            ),
            ("gw", ok("gateways.networking.istio.io/v1")),
            ("widgetz", Err(ResolveError::Unknown)),
            ("deployments.extensions", Err(ResolveError::Unknown)),
            ("deployments.v2.apps", Err(ResolveError::Unknown)),
            (
                "gateways",
                Err(ResolveError::Ambiguous(vec![
                    "gateways.networking.istio.io".into(),
                    "gateways.gateway.networking.k8s.io".into(),
                ])),
            ),
        ] {
            let resolved = resolve(&ResourceArg::parse(text), &types)
                .map(|t| format!("{}/{}", t.qualified(), t.version));
            assert_eq!(resolved, want, "{text}");
        }
    }

    #[test]
    fn parsing_qualified_names() {
        let arg = ResourceArg::parse("Deployments.V1.Apps");
        assert_eq!(arg.name, "deployments");
        assert_eq!(
            arg.groups,
            [("apps".into(), Some("v1".into())), ("v1.apps".into(), None)]
        );
        assert_eq!(arg.groups(), Some(["apps".into(), "v1.apps".into()].into()));
        assert_eq!(ResourceArg::parse("cm").groups(), None);
        let arg = ResourceArg::parse("locks.objectlock.dev");
        assert_eq!(arg.groups, [("objectlock.dev".into(), None)]);
    }

    #[test]
    fn subresources_are_not_resource_types() {
        let list: APIResourceList = serde_json::from_value(serde_json::json!({
            "kind": "APIResourceList", "apiVersion": "v1", "groupVersion": "apps/v1",
            "resources": [
                { "name": "deployments", "singularName": "deployment", "namespaced": true,
                  "kind": "Deployment", "verbs": ["get"], "shortNames": ["deploy"] },
                { "name": "deployments/scale", "singularName": "", "namespaced": true,
                  "group": "autoscaling", "version": "v1", "kind": "Scale", "verbs": ["get"] }
            ]
        }))
        .expect("an APIResourceList");
        let types = ResourceType::from_list(&list, true);
        assert_eq!(types.len(), 1);
        let t = &types[0];
        assert_eq!((t.group.as_str(), t.version.as_str()), ("apps", "v1"));
        assert_eq!(t.api_resource().api_version, "apps/v1");
        assert_eq!(t.short_names, ["deploy"]);
    }
}
