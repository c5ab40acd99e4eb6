//! `admissionregistration.k8s.io/v1` ValidatingWebhookConfigurations, as the registration writer
//! uses them: LIST and WATCH (with the `metadata.name` field selector), GET, DELETE, and PATCH as
//! server-side apply ([`ssa::WEBHOOK_CONFIGURATION`]: per-manager field ownership, `webhooks`
//! merged by `name` and their `matchConditions` by `name`, every other list atomic, conflicts
//! and `force`), which creates the object when it is missing.
//!
//! Validated as kube-apiserver does, in part: every entry needs a `name` of at least three
//! dot-separated segments, a `clientConfig` with a `url` or a `service`, `sideEffects` and
//! `admissionReviewVersions` (so an entry half removed by an apply is refused, not stored). Not
//! faked: other PATCH types, POST, PUT, defaulting (`matchPolicy`, `timeoutSeconds`,
//! `objectSelector`, a rule's `scope`: the real server fills them in), and the webhooks being
//! called (the fake's own dry-run webhook is set up apart, module `admission`).

use http::Request;
use http_body_util::BodyExt;
use hyper::body::Incoming;
use serde_json::{Value, json};

use super::{
    Body, FakeApiServer, Query, Res, Route, bad_request, reply, reply_status, ssa, status,
};

pub const GROUP: &str = "admissionregistration.k8s.io";
pub const API_VERSION: &str = "admissionregistration.k8s.io/v1";
const PREFIX: &str = "/apis/admissionregistration.k8s.io/v1/validatingwebhookconfigurations";
const APPLY: &str = "application/apply-patch+yaml";

/// The collection or one object, if `path` names them.
pub fn route(path: &str) -> Option<Route> {
    let rest = path.strip_prefix(PREFIX)?;
    let name = match rest.strip_prefix('/') {
        None if rest.is_empty() => None,
        Some(name) if !name.is_empty() && !name.contains('/') => Some(super::decode(name)),
        _ => return None,
    };
    Some(Route {
        res: Res::WebhookConfiguration,
        ns: None,
        name,
    })
}

/// What kube-apiserver refuses of an entry, in part (see the module docs).
fn invalid(config: &Value) -> Option<String> {
    for (i, entry) in config["webhooks"]
        .as_array()
        .into_iter()
        .flatten()
        .enumerate()
    {
        let name = entry["name"].as_str().unwrap_or_default();
        if name.split('.').filter(|s| !s.is_empty()).count() < 3 {
            return Some(format!(
                "webhooks[{i}].name: Invalid value: {name:?}: should be a domain with at least three segments separated by dots"
            ));
        }
        let client = &entry["clientConfig"];
        if client["url"].is_null() && client["service"].is_null() {
            return Some(format!(
                "webhooks[{i}].clientConfig: Required value: exactly one of url or service is required"
            ));
        }
        if entry["sideEffects"].is_null() {
            return Some(format!(
                "webhooks[{i}].sideEffects: Required value: must specify one of None, NoneOnDryRun"
            ));
        }
        if entry["admissionReviewVersions"]
            .as_array()
            .is_none_or(Vec::is_empty)
        {
            return Some(format!(
                "webhooks[{i}].admissionReviewVersions: Required value: must specify one of v1, v1beta1"
            ));
        }
    }
    None
}

impl FakeApiServer {
    /// Applies `config` (a ValidatingWebhookConfiguration) as `manager`, with `force`, as
    /// `kubectl apply --server-side` does: how a test installs the registration.
    pub fn apply_webhook_configuration(
        &self,
        manager: &str,
        config: &Value,
        force: bool,
    ) -> Result<Value, Value> {
        let name = config["metadata"]["name"].as_str().unwrap_or_default();
        self.apply_configuration(name, config, manager, force)
    }

    /// Answers the next `count` applies of a webhook configuration with HTTP `code`.
    pub fn fail_webhook_applies(&self, count: usize, code: u16) {
        (self.state().ext.webhook_faults).extend(std::iter::repeat_n(code, count));
    }

    /// Makes `config`, applied as `manager` (forced), land just before the next PATCH of a
    /// configuration is carried out: an edit made after the patch's writer last read it.
    pub fn edit_before_next_patch(&self, manager: &str, config: Value) {
        self.state().ext.webhooks_edit = Some((manager.to_owned(), config));
    }

    /// The configuration `name` as stored.
    pub fn webhook_configuration(&self, name: &str) -> Option<Value> {
        let key = (Res::WebhookConfiguration, String::new(), name.to_owned());
        self.state().objects.get(&key).cloned()
    }

    /// PATCH of one configuration: server-side apply only.
    pub(super) async fn apply_webhooks(
        &self,
        req: Request<Incoming>,
        name: &str,
        query: &Query,
    ) -> http::Response<Body> {
        let content_type = (req.headers().get(http::header::CONTENT_TYPE))
            .and_then(|v| v.to_str().ok())
            .unwrap_or_default()
            .to_owned();
        let body = req.into_body().collect().await.map(|b| b.to_bytes());
        let edit = self.state().ext.webhooks_edit.take();
        if let Some((manager, config)) = edit {
            let name = config["metadata"]["name"].as_str().unwrap_or_default();
            (self.apply_configuration(name, &config, &manager, true)).expect("the racing edit");
        }
        // Created by an apply: 201, as kube-apiserver answers.
        let created = self.webhook_configuration(name).is_none();
        let fault = self.state().ext.webhook_faults.pop_front();
        let answer = if let Some(code) = fault {
            Err(status(
                code,
                "injected webhook configuration write failure",
                Value::Null,
            ))
        } else if !content_type.starts_with(APPLY) {
            let msg = format!("this fake accepts only {APPLY} on {PREFIX}, got {content_type:?}");
            Err(status(415, &msg, Value::Null))
        } else if query.contains_key("dryRun") {
            Err(bad_request("dryRun is not faked"))
        } else {
            let manager = query.get("fieldManager").cloned().unwrap_or_default();
            let force = query.get("force").is_some_and(|f| f == "true");
            serde_json::from_slice::<Value>(&body.unwrap_or_default())
                .map_err(|e| bad_request(&format!("error decoding YAML: {e}")))
                .and_then(|config| self.apply_configuration(name, &config, &manager, force))
        };
        answer.map_or_else(reply_status, |object| {
            reply(if created { 201 } else { 200 }, object)
        })
    }

    fn apply_configuration(
        &self,
        name: &str,
        config: &Value,
        manager: &str,
        force: bool,
    ) -> Result<Value, Value> {
        if manager.is_empty() {
            let msg = "PatchOptions.meta.k8s.io \"\" is invalid: fieldManager: Required value: is required for apply patch";
            return Err(status(422, msg, Value::Null));
        }
        let key = (Res::WebhookConfiguration, String::new(), name.to_owned());
        let mut st = self.state();
        let old = st.objects.get(&key).cloned();
        let mut object = old.clone().unwrap_or_else(|| {
            json!({ "apiVersion": API_VERSION, "kind": Res::WebhookConfiguration.kind(),
                "metadata": { "name": name } })
        });
        let mut managed = st.ext.managed.get(&key).cloned().unwrap_or_default();
        let changed = ssa::apply(
            &ssa::WEBHOOK_CONFIGURATION,
            &mut object,
            &mut managed,
            config,
            manager,
            force,
            API_VERSION,
        )
        .map_err(|refused| {
            let mut s = status(refused.code, &refused.message, Value::Null);
            if refused.code == 409 {
                s["reason"] = json!("Conflict");
                s["details"] = super::details(Res::WebhookConfiguration, name);
            }
            if !refused.causes.is_empty() {
                s["details"]["causes"] = json!(refused.causes);
            }
            s
        })?;
        if let Some(message) = invalid(&object) {
            let message = format!(
                "ValidatingWebhookConfiguration.admissionregistration.k8s.io \"{name}\" is invalid: {message}"
            );
            return Err(status(422, &message, Value::Null));
        }
        if !changed && let Some(old) = old {
            return Ok(old);
        }
        let now = k8s_openapi::jiff::Timestamp::now();
        let meta = &mut object["metadata"];
        meta["managedFields"] = ssa::managed_fields(
            &ssa::WEBHOOK_CONFIGURATION,
            &managed,
            API_VERSION,
            &now.to_string(),
        );
        let kind = match &old {
            Some(old) => {
                let generation = old["metadata"]["generation"].as_u64().unwrap_or(1);
                let entries_changed = old["webhooks"] != object["webhooks"];
                object["metadata"]["generation"] = json!(generation + u64::from(entries_changed));
                "MODIFIED"
            }
            None => {
                meta["uid"] = json!(format!("00000000-0000-4000-9000-{:012x}", st.rv + 1));
                meta["creationTimestamp"] =
                    json!(k8s_openapi::apimachinery::pkg::apis::meta::v1::Time(now));
                meta["generation"] = json!(1);
                "ADDED"
            }
        };
        st.ext.managed.insert(key.clone(), managed);
        let written = st.emit(kind, key, object);
        drop(st);
        self.notify();
        Ok(written)
    }
}
