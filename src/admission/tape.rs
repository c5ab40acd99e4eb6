//! The review's fields read straight from simd-json's tape.
//!
//! simd-json's serde reading still visits every skipped value (`managedFields`, `data`, the
//! request's `options`) node by node; its tape records how many nodes each value spans, so
//! walking it skips them at once. This reader mirrors what serde's derive makes of the types in
//! [`super::request`] and gives up (`None`) on anything it does not plainly accept: a duplicate
//! field, a value of an unexpected type, a struct written as an array, an unknown operation. The
//! caller then reads the body with serde_json, which answers exactly as before, errors included.

use std::collections::BTreeMap;

use simd_json::prelude::*;
use simd_json::tape::{Object as TapeObject, Value};

use super::request::{AdmissionRequest, Object, ObjectMeta, Operation, Resource, UserInfo};
use super::review::IncomingReview;

/// Reads a review from the tape of a whole body, or `None` to leave it to serde.
pub(super) fn review(root: Value<'_, '_>) -> Option<IncomingReview> {
    let mut api_version = None;
    let mut kind = None;
    let mut request = None;
    for (key, value) in root.as_object()?.iter() {
        match key {
            "apiVersion" => set(&mut api_version, string(value)?)?,
            "kind" => set(&mut kind, string(value)?)?,
            "request" => set(&mut request, optional(value, admission_request)?)?,
            _ => {}
        }
    }
    Some(IncomingReview {
        api_version: api_version.unwrap_or_default(),
        kind: kind.unwrap_or_default(),
        request: request.flatten(),
    })
}

fn admission_request(value: Value<'_, '_>) -> Option<AdmissionRequest> {
    let mut uid = None;
    let mut resource = None;
    let mut sub_resource = None;
    let mut name = None;
    let mut namespace = None;
    let mut operation = None;
    let mut user_info = None;
    let mut object = None;
    let mut old_object = None;
    let mut dry_run = None;
    for (key, value) in value.as_object()?.iter() {
        match key {
            "uid" => set(&mut uid, string(value)?)?,
            "resource" => set(&mut resource, group_version_resource(value)?)?,
            "subResource" => set(&mut sub_resource, optional(value, string)?)?,
            "name" => set(&mut name, optional(value, string)?)?,
            "namespace" => set(&mut namespace, optional(value, string)?)?,
            "operation" => set(&mut operation, self::operation(value)?)?,
            "userInfo" => set(&mut user_info, self::user_info(value)?)?,
            "object" => set(&mut object, optional(value, self::object)?)?,
            "oldObject" => set(&mut old_object, optional(value, self::object)?)?,
            "dryRun" => set(&mut dry_run, optional(value, |v| v.as_bool())?)?,
            _ => {}
        }
    }
    Some(AdmissionRequest {
        uid: uid?,
        resource: resource?,
        sub_resource: sub_resource.flatten(),
        name: name.flatten(),
        namespace: namespace.flatten(),
        operation: operation?,
        user_info: user_info?,
        object: object.flatten(),
        old_object: old_object.flatten(),
        dry_run: dry_run.flatten(),
    })
}

fn group_version_resource(value: Value<'_, '_>) -> Option<Resource> {
    let mut group = None;
    let mut version = None;
    let mut resource = None;
    for (key, value) in value.as_object()?.iter() {
        match key {
            "group" => set(&mut group, string(value)?)?,
            "version" => set(&mut version, string(value)?)?,
            "resource" => set(&mut resource, string(value)?)?,
            _ => {}
        }
    }
    Some(Resource {
        group: group.unwrap_or_default(),
        version: version.unwrap_or_default(),
        resource: resource?,
    })
}

fn operation(value: Value<'_, '_>) -> Option<Operation> {
    match value.as_str()? {
        "CREATE" => Some(Operation::Create),
        "UPDATE" => Some(Operation::Update),
        "DELETE" => Some(Operation::Delete),
        "CONNECT" => Some(Operation::Connect),
        _ => None,
    }
}

fn user_info(value: Value<'_, '_>) -> Option<UserInfo> {
    let mut username = None;
    let mut groups = None;
    for (key, value) in value.as_object()?.iter() {
        match key {
            "username" => set(&mut username, string(value)?)?,
            "groups" => {
                let list = value
                    .as_array()?
                    .iter()
                    .map(string)
                    .collect::<Option<Vec<_>>>()?;
                set(&mut groups, list)?;
            }
            _ => {}
        }
    }
    Some(UserInfo {
        username: username.unwrap_or_default(),
        groups: groups.unwrap_or_default(),
    })
}

fn object(value: Value<'_, '_>) -> Option<Object> {
    let mut metadata = None;
    for (key, value) in value.as_object()?.iter() {
        if key == "metadata" {
            set(&mut metadata, object_meta(value.as_object()?)?)?;
        }
    }
    Some(Object {
        metadata: metadata.unwrap_or_default(),
    })
}

fn object_meta(meta: TapeObject<'_, '_>) -> Option<ObjectMeta> {
    let mut name = None;
    let mut deletion_timestamp = None;
    let mut labels = None;
    for (key, value) in meta.iter() {
        match key {
            "name" => set(&mut name, optional(value, string)?)?,
            "deletionTimestamp" => set(&mut deletion_timestamp, optional(value, string)?)?,
            "labels" => set(&mut labels, optional(value, string_map)?)?,
            _ => {}
        }
    }
    Some(ObjectMeta {
        name: name.flatten(),
        deletion_timestamp: deletion_timestamp.flatten(),
        labels: labels.flatten(),
    })
}

/// A map of strings; a repeated key keeps its last value, as serde's map does.
fn string_map(value: Value<'_, '_>) -> Option<BTreeMap<String, String>> {
    value
        .as_object()?
        .iter()
        .map(|(key, value)| Some((key.to_owned(), string(value)?)))
        .collect()
}

fn string(value: Value<'_, '_>) -> Option<String> {
    value.as_str().map(str::to_owned)
}

/// `null` as `None`, anything else read by `read`.
fn optional<T>(
    value: Value<'_, '_>,
    read: impl FnOnce(Value<'_, '_>) -> Option<T>,
) -> Option<Option<T>> {
    if value.is_null() {
        Some(None)
    } else {
        read(value).map(Some)
    }
}

/// Sets a field once; a second time is serde's "duplicate field" error, so `None`.
fn set<T>(field: &mut Option<T>, value: T) -> Option<()> {
    match field {
        Some(_) => None,
        None => {
            *field = Some(value);
            Some(())
        }
    }
}
