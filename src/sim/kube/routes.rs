//! The Kubernetes API double's request side: what a path addresses, the handler that
//! dispatches reads, writes and discovery, the OpenAPI v3 documents and the wire formats of
//! request bodies.

use std::collections::BTreeMap;
use std::time::Instant;

use axum::body::Bytes;
use axum::extract::{Query, State};
use axum::http::{HeaderMap, Method, StatusCode, Uri};
use axum::response::{IntoResponse, Response};
use serde_json::{Value, json};

use super::cluster::{Cluster, Key, Res, Shared};
use super::writes::{apply, dry_run_apply, patch_kind, patch_update, write};
use super::{lock, not_found_resource, status};
use crate::sim::kube_ssa;

/// What a request path addresses.
enum Target {
    CoreVersions,
    GroupList,
    ResourceList {
        group: String,
        version: String,
    },
    Object {
        res: Res,
        ns: Option<String>,
        name: Option<String>,
    },
}

fn parse_path(c: &Cluster, path: &str, now: Instant) -> Option<Target> {
    let segs: Vec<&str> = path.trim_matches('/').split('/').collect();
    let (group, version, rest) = match segs.as_slice() {
        ["api"] => return Some(Target::CoreVersions),
        ["apis"] => return Some(Target::GroupList),
        ["api", v, rest @ ..] => ("", *v, rest),
        ["apis", g, v, rest @ ..] => (*g, *v, rest),
        _ => return None,
    };
    let served = c.served(now);
    if !served
        .iter()
        .any(|r| r.group == group && r.version == version)
    {
        return None;
    }
    let find = |plural: &str| {
        served
            .iter()
            .find(|r| r.group == group && r.version == version && r.plural == plural)
            .cloned()
    };
    match rest {
        [] => Some(Target::ResourceList {
            group: group.into(),
            version: version.into(),
        }),
        ["namespaces", ns, plural] => {
            let res = find(plural).filter(|r| r.namespaced)?;
            Some(Target::Object {
                res,
                ns: Some((*ns).into()),
                name: None,
            })
        }
        ["namespaces", ns, plural, name] => {
            let res = find(plural).filter(|r| r.namespaced)?;
            Some(Target::Object {
                res,
                ns: Some((*ns).into()),
                name: Some((*name).into()),
            })
        }
        [plural] => Some(Target::Object {
            res: find(plural)?,
            ns: None,
            name: None,
        }),
        [plural, name] => {
            let res = find(plural).filter(|r| !r.namespaced)?;
            Some(Target::Object {
                res,
                ns: None,
                name: Some((*name).into()),
            })
        }
        _ => None,
    }
}

pub(super) async fn handle(
    State(state): State<Shared>,
    method: Method,
    uri: Uri,
    Query(query): Query<BTreeMap<String, String>>,
    headers: HeaderMap,
    body: Bytes,
) -> Response {
    let now = Instant::now();
    let mut c = lock(&state);
    if method == Method::GET && uri.path() == "/version" {
        // What Helm reads for `.Capabilities.KubeVersion` (k8s.io/apimachinery pkg/version
        // Info); the version modelled here.
        return axum::Json(json!({"major": "1", "minor": "36", "gitVersion": "v1.36.2",
            "platform": "linux/amd64"}))
        .into_response();
    }
    if method == Method::GET
        && let Some(doc) = openapi_v3(&c, uri.path(), now)
    {
        return doc;
    }
    let Some(target) = parse_path(&c, uri.path(), now) else {
        return not_found_resource();
    };
    let Target::Object { res, ns, name } = target else {
        return discovery(&c, method, target, now);
    };
    // One arm per route; kept whole so the table reads in one place.
    match (method, name) {
        (Method::GET, Some(name)) => get_object(&c, &res, ns, name, now),
        (Method::GET, None) => list_objects(&c, &res, ns, query.get("labelSelector"), now),
        (Method::PATCH, Some(name)) if query.contains_key("dryRun") => {
            dry_run_apply(&mut c, res, ns, name, &query, &headers, &body, now)
        }
        (Method::PATCH, Some(name)) => match patch_kind(&headers) {
            Some(kind) => patch_update(&mut c, kind, res, ns, name, &query, &headers, &body, now),
            None => apply(&mut c, res, ns, name, &query, &headers, &body, now),
        },
        (Method::POST, None) => match wire_body(&res, &headers, &body) {
            Ok(body) => write(&mut c, res, ns, None, &query, &body, now),
            Err(refused) => *refused,
        },
        (Method::PUT, Some(name)) => match wire_body(&res, &headers, &body) {
            Ok(body) => write(&mut c, res, ns, Some(name), &query, &body, now),
            Err(refused) => *refused,
        },
        (Method::DELETE, Some(name)) => delete_object(&mut c, &res, ns, name, now),
        _ => method_not_allowed(),
    }
}

/// The API server's 405 for a method a path does not serve.
fn method_not_allowed() -> Response {
    status(
        StatusCode::METHOD_NOT_ALLOWED,
        "MethodNotAllowed",
        "the server does not allow this method on the requested resource".into(),
    )
}

/// The discovery documents client-go and Helm read before anything else: `/api`, `/apis`
/// and each group version's resource list, from what the double serves at `now`.
fn discovery(c: &Cluster, method: Method, target: Target, now: Instant) -> Response {
    match (method, target) {
        (Method::GET, Target::CoreVersions) => {
            axum::Json(json!({"kind": "APIVersions", "versions": ["v1"],
                "serverAddressByClientCIDRs": []}))
            .into_response()
        }
        (Method::GET, Target::GroupList) => group_list(c, now),
        (Method::GET, Target::ResourceList { group, version }) => {
            resource_list(c, &group, version, now)
        }
        _ => method_not_allowed(),
    }
}

/// `GET /apis`: every group served, its versions in the order first served.
fn group_list(c: &Cluster, now: Instant) -> Response {
    let mut groups: BTreeMap<String, Vec<String>> = BTreeMap::new();
    for r in c.served(now).into_iter().filter(|r| !r.group.is_empty()) {
        let vs = groups.entry(r.group.clone()).or_default();
        if !vs.contains(&r.version) {
            vs.push(r.version.clone());
        }
    }
    let groups: Vec<Value> = groups
        .into_iter()
        .map(|(g, vs)| {
            let versions: Vec<Value> = vs
                .iter()
                .map(|v| json!({"groupVersion": format!("{g}/{v}"), "version": v}))
                .collect();
            json!({"name": g, "versions": versions, "preferredVersion": versions[0]})
        })
        .collect();
    axum::Json(json!({"kind": "APIGroupList", "apiVersion": "v1", "groups": groups}))
        .into_response()
}

/// `GET /api/v1` or `/apis/<group>/<version>`: the resources of that group version.
fn resource_list(c: &Cluster, group: &str, version: String, now: Instant) -> Response {
    let resources: Vec<Value> = c
        .served(now)
        .into_iter()
        .filter(|r| r.group == group && r.version == version)
        .map(|r| {
            json!({"name": r.plural, "singularName": r.kind.to_lowercase(),
                "namespaced": r.namespaced, "kind": r.kind,
                "verbs": ["create", "delete", "get", "list", "patch", "update", "watch"]})
        })
        .collect();
    let gv = if group.is_empty() {
        version
    } else {
        format!("{group}/{version}")
    };
    axum::Json(json!({"kind": "APIResourceList", "apiVersion": "v1",
        "groupVersion": gv, "resources": resources}))
    .into_response()
}

/// `GET` of one object.
fn get_object(c: &Cluster, res: &Res, ns: Option<String>, name: String, now: Instant) -> Response {
    let key = object_key(res, ns.unwrap_or_default(), name);
    match c.objects.get(&key) {
        Some(s) => axum::Json(c.view(&key, s, now)).into_response(),
        None => not_found(res, &key.3),
    }
}

/// `GET` of a collection, in one namespace or all, filtered by `labelSelector`.
fn list_objects(
    c: &Cluster,
    res: &Res,
    ns: Option<String>,
    selector: Option<&String>,
    now: Instant,
) -> Response {
    let items: Vec<Value> = c
        .objects
        .iter()
        .filter(|(k, s)| {
            k.0 == res.group
                && k.1 == res.plural
                && ns.as_ref().is_none_or(|n| &k.2 == n)
                && labels_match(&s.obj, selector)
        })
        .map(|(k, s)| c.view(k, s, now))
        .collect();
    axum::Json(json!({"kind": format!("{}List", res.kind),
        "apiVersion": res.api_version(),
        "metadata": {"resourceVersion": c.rv.to_string()}, "items": items}))
    .into_response()
}

/// `DELETE` of one object: deleted at once (background propagation: the dependents go
/// later; the double models no finalizers), the object as it was in the reply
/// (kubernetes/kubernetes staging/src/k8s.io/apiserver/pkg/endpoints/handlers/delete.go at
/// 02e16cb253f0, DeleteResource: 200 with the deleted object when there is nothing left to
/// wait for).
fn delete_object(
    c: &mut Cluster,
    res: &Res,
    ns: Option<String>,
    name: String,
    now: Instant,
) -> Response {
    let key = object_key(res, ns.unwrap_or_default(), name);
    match c.objects.remove(&key) {
        Some(s) => {
            c.rv += 1;
            axum::Json(c.view(&key, &s, now)).into_response()
        }
        None => not_found(res, &key.3),
    }
}

/// Where an object of `res` named `name` in `ns` ("" for cluster-scoped) is stored.
pub(super) fn object_key(res: &Res, ns: String, name: String) -> Key {
    (res.group.clone(), res.plural.clone(), ns, name)
}

/// The API server's 404 for a missing object (`NotFound`, "<resource> \"<name>\" not found").
pub(super) fn not_found(res: &Res, name: &str) -> Response {
    status(
        StatusCode::NOT_FOUND,
        "NotFound",
        format!("{} \"{name}\" not found", qualified(res)),
    )
}

pub(super) fn qualified(res: &Res) -> String {
    if res.group.is_empty() {
        res.plural.clone()
    } else {
        format!("{}.{}", res.plural, res.group)
    }
}

/// Metadata fields the server owns; they never count as content.
const SERVER_META: &[&str] = &[
    "uid",
    "resourceVersion",
    "generation",
    "creationTimestamp",
    "managedFields",
];

pub(super) fn content(obj: &Value) -> Value {
    let mut v = obj.clone();
    if let Some(m) = v["metadata"].as_object_mut() {
        for k in SERVER_META {
            m.remove(*k);
        }
    }
    if let Some(o) = v.as_object_mut() {
        o.remove("status");
    }
    v
}

/// The OpenAPI v3 discovery kubectl's and Helm's field validation read
/// (kubernetes/kubernetes v1.36.2 staging/src/k8s.io/kube-openapi handler3; read by
/// kubernetes/cli-runtime v0.35.6 pkg/resource/query_param_verifier_v3.go, HasSupport):
/// `/openapi/v3` lists one document per served group/version, and each document's PATCH
/// operations carry `x-kubernetes-group-version-kind` and the `fieldValidation` query
/// parameter, so clients leave field validation to the server instead of downloading the
/// OpenAPI v2 schema. Only that much of the documents is modelled (no schemas), and the
/// double does not itself refuse unknown fields.
fn openapi_v3(c: &Cluster, path: &str, now: Instant) -> Option<Response> {
    let served = c.served(now);
    let gv_path = |r: &Res| {
        if r.group.is_empty() {
            format!("api/{}", r.version)
        } else {
            format!("apis/{}/{}", r.group, r.version)
        }
    };
    if path == "/openapi/v3" {
        let mut paths = serde_json::Map::new();
        for r in &served {
            let p = gv_path(r);
            paths.insert(
                p.clone(),
                json!({"serverRelativeURL": format!("/openapi/v3/{p}?hash=0")}),
            );
        }
        return Some(axum::Json(json!({"paths": paths})).into_response());
    }
    let wanted = path.strip_prefix("/openapi/v3/")?;
    let mut paths = serde_json::Map::new();
    for r in served.iter().filter(|r| gv_path(r) == wanted) {
        let scope = if r.namespaced {
            "namespaces/{namespace}/"
        } else {
            ""
        };
        paths.insert(
            format!("/{wanted}/{scope}{}/{{name}}", r.plural),
            json!({"patch": {
                "x-kubernetes-group-version-kind":
                    {"group": r.group, "version": r.version, "kind": r.kind},
                "parameters": [
                    {"name": "fieldManager", "in": "query", "schema": {"type": "string"}},
                    {"name": "fieldValidation", "in": "query", "schema": {"type": "string"}},
                    {"name": "force", "in": "query", "schema": {"type": "boolean"}},
                ],
                "responses": {}}}),
        );
    }
    if paths.is_empty() {
        return Some(not_found_resource());
    }
    Some(
        axum::Json(
            json!({"openapi": "3.0.0", "info": {"title": "Kubernetes", "version": "v1.36.2"},
            "paths": paths}),
        )
        .into_response(),
    )
}

/// A create or replace body as JSON. client-go's typed clients (Helm's release storage among
/// them) send built-in kinds as Kubernetes protobuf (`application/vnd.kubernetes.protobuf`:
/// the `k8s\0` magic, then a runtime.Unknown wrapping the object; k8s.io/apimachinery
/// v0.36.2 pkg/runtime/serializer/protobuf/protobuf.go). The double reads that for Secrets,
/// the one kind such clients write here (k8s.io/api v0.36 core/v1/generated.proto: Secret,
/// ObjectMeta); any other protobuf body is 415.
fn wire_body(res: &Res, headers: &HeaderMap, body: &[u8]) -> Result<Vec<u8>, Box<Response>> {
    let ctype = headers
        .get("content-type")
        .and_then(|v| v.to_str().ok())
        .unwrap_or("");
    if !ctype.starts_with("application/vnd.kubernetes.protobuf") {
        return Ok(body.to_vec());
    }
    let refuse = |why: String| {
        status(
            StatusCode::UNSUPPORTED_MEDIA_TYPE,
            "UnsupportedMediaType",
            format!("the double reads protobuf only for v1 Secrets: {why}"),
        )
    };
    if !(res.group.is_empty() && res.kind == "Secret") {
        return Err(Box::new(refuse(format!("not {}", res.kind))));
    }
    let secret = kube_ssa::protobuf_secret(body).map_err(|e| {
        Box::new(status(
            StatusCode::BAD_REQUEST,
            "BadRequest",
            format!("cannot decode the protobuf body: {e}"),
        ))
    })?;
    Ok(serde_json::to_vec(&secret).expect("JSON values serialise"))
}

/// Whether an object's labels match a `labelSelector` of equality terms (`a=b`, `a==b`,
/// `a!=b`, `a`, `!a`), as client-go's label selectors that Helm's release storage sends
/// (`owner=helm,name=<release>`) are read (k8s.io/apimachinery pkg/labels/selector.go).
fn labels_match(obj: &Value, selector: Option<&String>) -> bool {
    let Some(sel) = selector.filter(|s| !s.is_empty()) else {
        return true;
    };
    let labels = &obj["metadata"]["labels"];
    sel.split(',').all(|term| {
        let term = term.trim();
        if let Some((k, v)) = term.split_once("!=") {
            labels[k.trim()].as_str() != Some(v.trim())
        } else if let Some((k, v)) = term.split_once("==").or_else(|| term.split_once('=')) {
            labels[k.trim()].as_str() == Some(v.trim())
        } else if let Some(k) = term.strip_prefix('!') {
            labels[k.trim()].is_null()
        } else {
            !labels[term].is_null()
        }
    })
}
