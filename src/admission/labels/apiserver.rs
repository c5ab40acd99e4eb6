//! Labels from the API server: a metadata-only GET of the one object (rare requests, so no
//! watch-fed cache; see docs/design/admission.md).

use std::collections::BTreeMap;

use futures::future::BoxFuture;
use kube::Client;
use kube::api::{Api, ApiResource, DynamicObject};

use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;

use super::{LabelError, LabelReader, Resource, Target};

#[derive(Clone)]
pub struct KubeLabels {
    client: Client,
}

impl KubeLabels {
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

    fn scaled_field(
        &self,
        resource: &Resource<'_>,
    ) -> BoxFuture<'static, Result<Option<String>, LabelError>> {
        let api: Api<CustomResourceDefinition> = Api::all(self.client.clone());
        let (name, version) = (resource.qualified(), resource.version.to_string());
        Box::pin(async move {
            match api.get_opt(&name).await {
                Ok(crd) => Ok(crd.and_then(|crd| {
                    let version = crd.spec.versions.into_iter().find(|v| v.name == version)?;
                    Some(version.subresources?.scale?.spec_replicas_path)
                })),
                Err(kube::Error::Api(status)) => Err(match status.code {
                    403 => LabelError::Forbidden {
                        resource: "customresourcedefinitions.apiextensions.k8s.io".to_owned(),
                        message: status.message,
                    },
                    code => LabelError::Api {
                        code,
                        message: format!("{} ({})", status.message, status.reason),
                    },
                }),
                Err(e) => Err(LabelError::Connection(e.to_string())),
            }
        })
    }
}
