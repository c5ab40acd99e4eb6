//! Labels from the API server: a metadata-only GET of the one object (`PartialObjectMetadata`),
//! through the webhook's one client.
//!
//! A GET per eviction or scale that a selector Lock could cover, rather than a cache fed by a
//! watch: those requests are rare (a drain, a scale), a GET reads the labels as they are now,
//! and it needs `get` alone, where a watch would need `list` and `watch` on every pod of those
//! namespaces and memory for them (BENCHMARKS.md, *Labels for selector locks*).

use std::collections::BTreeMap;

use futures::future::BoxFuture;
use kube::Client;
use kube::api::{Api, ApiResource, DynamicObject};

use super::{LabelError, LabelReader, Target};

/// Reads labels with a metadata-only GET.
#[derive(Clone)]
pub struct KubeLabels {
    client: Client,
}

impl KubeLabels {
    /// A reader through `client`.
    pub fn new(client: Client) -> Self {
        KubeLabels { client }
    }
}

impl LabelReader for KubeLabels {
    fn labels(
        &self,
        target: &Target<'_>,
    ) -> BoxFuture<'static, Result<Option<BTreeMap<String, String>>, LabelError>> {
        let (group, version) = (&target.resource.group, &target.resource.version);
        let resource = ApiResource {
            group: group.to_string(),
            version: version.to_string(),
            api_version: if group.is_empty() {
                version.to_string()
            } else {
                format!("{group}/{version}")
            },
            kind: String::new(),
            plural: target.resource.resource.to_string(),
        };
        let api: Api<DynamicObject> = match target.namespace {
            Some(ns) => Api::namespaced_with(self.client.clone(), ns, &resource),
            None => Api::all_with(self.client.clone(), &resource),
        };
        let name = target.name.to_owned();
        let qualified = target.resource.qualified();
        Box::pin(async move {
            match api.get_metadata(&name).await {
                Ok(object) => Ok(Some(object.metadata.labels.unwrap_or_default())),
                Err(kube::Error::Api(status)) => match status.code {
                    404 => Ok(None),
                    403 => Err(LabelError::Forbidden {
                        resource: qualified,
                        message: status.message,
                    }),
                    code => Err(LabelError::Api {
                        code,
                        message: format!("{} ({})", status.message, status.reason),
                    }),
                },
                Err(e) => Err(LabelError::Connection(e.to_string())),
            }
        })
    }
}
