//! The Kubernetes API double's writes: create, replace and delete, server-side apply with
//! field ownership and conflicts, the patch kinds, dry runs and admission warnings.

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use base64::Engine as _;
use base64::engine::general_purpose::STANDARD;
use serde_json::{Value, json};

use super::cluster::{Cluster, Key, Res, Stored, builtins};
use super::routes::{content, not_found, object_key, qualified};
use super::{ApplyRecord, status};
use crate::sim::kube_ssa;

/// Create (POST, `name` None) or replace (PUT) of a whole object, as client-go's `Create`
/// and `Update` send them (kubernetes/kubernetes staging/src/k8s.io/apiserver/pkg/endpoints/
/// handlers/create.go and update.go): an existing name is 409 AlreadyExists on create, a
/// missing one 404 NotFound on replace (ConfigMaps and the other built-ins do not allow
/// create on update), a stale `resourceVersion` 409 Conflict; the manager is the
/// `fieldManager` parameter (the real default derives one from the user agent).
pub(super) fn write(
    c: &mut Cluster,
    res: Res,
    ns: Option<String>,
    name: Option<String>,
    query: &BTreeMap<String, String>,
    body: &[u8],
    now: Instant,
) -> Response {
    let mut obj: Value = match serde_json::from_slice(body) {
        Ok(v @ Value::Object(_)) => v,
        Ok(_) => {
            return status(
                StatusCode::BAD_REQUEST,
                "BadRequest",
                "body is not an object".into(),
            );
        }
        Err(e) => return status(StatusCode::BAD_REQUEST, "BadRequest", e.to_string()),
    };
    fold_string_data(&res, &mut obj);
    let Some(body_name) = obj["metadata"]["name"].as_str().map(str::to_owned) else {
        return status(
            StatusCode::UNPROCESSABLE_ENTITY,
            "Invalid",
            format!(
                "{} \"\" is invalid: metadata.name: Required value: name or generateName is required",
                res.kind
            ),
        );
    };
    if name.as_ref().is_some_and(|n| *n != body_name) {
        return status(
            StatusCode::BAD_REQUEST,
            "BadRequest",
            format!(
                "the name of the object ({body_name}) does not match the name on the URL ({})",
                name.unwrap_or_default()
            ),
        );
    }
    let ns = ns.unwrap_or_default();
    if res.namespaced {
        if let Err(refused) = namespace_exists(c, &ns) {
            return *refused;
        }
        obj["metadata"]["namespace"] = Value::String(ns.clone());
    }
    let key = (res.group.clone(), res.plural.clone(), ns, body_name);
    let (uid, generation, created) = match write_identity(c, &res, &key, &obj, name.is_some(), now)
    {
        Ok(identity) => identity,
        Err(answer) => return *answer,
    };
    c.rv += 1;
    let mut stored = content(&obj);
    stamp_metadata(&mut stored, uid, c.rv, generation);
    let manager = query
        .get("fieldManager")
        .cloned()
        .unwrap_or_else(|| "kube-rs".into());
    take_written_fields(c, &res, &key, &mut stored, &manager);
    c.objects.insert(
        key.clone(),
        Stored {
            obj: stored,
            manager,
            operation: "Update",
            ready_at: now,
        },
    );
    let view = c.view(&key, &c.objects[&key], now);
    let code = if created {
        StatusCode::CREATED
    } else {
        StatusCode::OK
    };
    (code, axum::Json(view)).into_response()
}

/// The NamespaceLifecycle admission plugin's answer for a namespaced object in a namespace
/// that does not exist (kubernetes/kubernetes staging/src/k8s.io/apiserver/pkg/admission/
/// plugin/namespace/lifecycle/admission.go, Admit: "refuse to operate on non-existent
/// namespaces"): the Namespace lookup's NotFound.
fn namespace_exists(c: &Cluster, ns: &str) -> Result<(), Box<Response>> {
    let ns_key = (
        String::new(),
        "namespaces".to_owned(),
        String::new(),
        ns.to_owned(),
    );
    if c.objects.contains_key(&ns_key) {
        return Ok(());
    }
    Err(Box::new(status(
        StatusCode::NOT_FOUND,
        "NotFound",
        format!("namespaces \"{ns}\" not found"),
    )))
}

/// The uid, generation and create-or-replace of a create (`replace` false) or replace of
/// `obj` at `key`: create of an existing name is 409 AlreadyExists, replace of a missing
/// one 404, a stale `resourceVersion` 409 Conflict, and a replace that changes nothing
/// answers the stored object at once. `Err` is that answer.
fn write_identity(
    c: &mut Cluster,
    res: &Res,
    key: &Key,
    obj: &Value,
    replace: bool,
    now: Instant,
) -> Result<(Value, i64, bool), Box<Response>> {
    let body_name = &key.3;
    match (replace, c.objects.get(key)) {
        (false, Some(_)) => Err(Box::new(status(
            StatusCode::CONFLICT,
            "AlreadyExists",
            format!("{} \"{body_name}\" already exists", qualified(res)),
        ))),
        (true, None) => Err(Box::new(not_found(res, body_name))),
        (true, Some(s)) => {
            if let Some(rv) = obj["metadata"]["resourceVersion"].as_str()
                && rv != s.obj["metadata"]["resourceVersion"].as_str().unwrap_or("")
            {
                return Err(Box::new(status(
                    StatusCode::CONFLICT,
                    "Conflict",
                    format!(
                        "Operation cannot be fulfilled on {} \"{body_name}\": the object has been modified; please apply your changes to the latest version and try again",
                        qualified(res)
                    ),
                )));
            }
            if content(&s.obj) == content(obj) {
                let view = c.view(key, s, now);
                return Err(Box::new((StatusCode::OK, axum::Json(view)).into_response()));
            }
            let generation = s.obj["metadata"]["generation"].as_i64().unwrap_or(1);
            Ok((s.obj["metadata"]["uid"].clone(), generation, false))
        }
        (false, None) => {
            c.uid += 1;
            Ok((json!(format!("uid-{}", c.uid)), 1, true))
        }
    }
}

/// The metadata the server sets on every stored write: uid, the new resourceVersion,
/// generation and the double's creation time.
fn stamp_metadata(stored: &mut Value, uid: Value, rv: u64, generation: i64) {
    if let Some(meta) = stored["metadata"].as_object_mut() {
        meta.insert("uid".into(), uid);
        meta.insert("resourceVersion".into(), json!(rv.to_string()));
        meta.insert("generation".into(), json!(generation));
        meta.insert("creationTimestamp".into(), json!("2026-11-30T00:00:00Z"));
    }
}

/// A create or replace as an Update: the typed round trip, the Namespace strategy, and the
/// writer taking the fields it set or changed (never a conflict), written into `stored`'s
/// `metadata.managedFields`.
fn take_written_fields(c: &Cluster, res: &Res, key: &Key, stored: &mut Value, manager: &str) {
    let builtin = is_builtin(res);
    kube_ssa::normalize(stored, builtin);
    if res.group.is_empty() && res.kind == "Namespace" {
        kube_ssa::namespace_strategy(stored);
    }
    let old = c
        .objects
        .get(key)
        .map(|s| (content(&s.obj), kube_ssa::entries_of(&s.obj)));
    let entries = match old {
        Some((o, e)) => {
            kube_ssa::update(Some(&o), e, &content(stored), manager, &res.api_version())
        }
        None => kube_ssa::update(None, None, &content(stored), manager, &res.api_version()),
    };
    stored["metadata"]["managedFields"] = kube_ssa::encode(&entries);
}

#[allow(clippy::too_many_arguments)]
pub(super) fn apply(
    c: &mut Cluster,
    res: Res,
    ns: Option<String>,
    name: String,
    query: &BTreeMap<String, String>,
    headers: &HeaderMap,
    body: &[u8],
    now: Instant,
) -> Response {
    let (manager, force) = match apply_options(headers, query) {
        Ok(options) => options,
        Err(refused) => return *refused,
    };
    // JSON first; a YAML body's error is the one reported, as the API server's YAML decoder.
    let parsed = serde_json::from_slice::<Value>(body).or_else(|_| yaml_serde::from_slice(body));
    let mut obj = match parsed {
        Ok(v) if v.is_object() => v,
        Ok(_) => {
            return status(
                StatusCode::BAD_REQUEST,
                "BadRequest",
                "body is not an object".into(),
            );
        }
        Err(e) => return status(StatusCode::BAD_REQUEST, "BadRequest", e.to_string()),
    };
    let ns = ns.unwrap_or_default();
    if let Err(refused) = check_apply_target(c, &res, &mut obj, &ns, &name) {
        return *refused;
    }
    if let Err(refused) = check_secret_data(&res, &obj) {
        return *refused;
    }
    let key = (
        res.group.clone(),
        res.plural.clone(),
        ns.clone(),
        name.clone(),
    );
    let (new_content, created, changed) = match ssa_merge(c, &res, &key, &obj, &manager, force) {
        Ok(r) => r,
        Err(refused) => return *refused,
    };
    // A no-op apply writes nothing, so resourceVersion stays: the etcd3 store skips the write
    // when the encoded object is unchanged (kubernetes/kubernetes
    // staging/src/k8s.io/apiserver/pkg/storage/etcd3/store.go, GuaranteedUpdate).
    if changed {
        store_applied(c, &res, &key, new_content, &manager, now);
    }
    c.log.push(ApplyRecord {
        api_version: res.api_version(),
        kind: res.kind.clone(),
        namespace: ns,
        name,
        field_manager: manager,
        force,
        changed,
        at: now,
    });
    let Some(s) = c.objects.get(&key) else {
        return status(
            StatusCode::INTERNAL_SERVER_ERROR,
            "InternalError",
            "the applied object vanished".into(),
        );
    };
    let view = c.view(&key, s, now);
    // 201 when the apply created the object, else 200 (patch.go, PatchResource).
    let code = if created {
        StatusCode::CREATED
    } else {
        StatusCode::OK
    };
    let warnings = admission_warnings(c, &key.2, &view);
    with_warnings((code, axum::Json(view)).into_response(), &warnings)
}

/// The apply request's content type and PatchOptions: the field manager (required) and
/// `force`. `Err` is the refusal.
///
/// The real server checks the patch content type first (415 for one it does not
/// support), then PatchOptions (fieldManager required for apply: 422 Invalid), in
/// kubernetes/kubernetes staging/src/k8s.io/apiserver/pkg/endpoints/handlers/patch.go
/// (PatchResource) and staging/src/k8s.io/apimachinery/pkg/apis/meta/v1/validation/
/// validation.go (ValidatePatchOptions). Deliberately narrower: the real server also takes
/// JSON, merge and strategic-merge patches; talboot sends only server-side apply, so any
/// other patch here means a client regression and is refused the way an unsupported type is.
fn apply_options(
    headers: &HeaderMap,
    query: &BTreeMap<String, String>,
) -> Result<(String, bool), Box<Response>> {
    let ctype = headers
        .get("content-type")
        .and_then(|v| v.to_str().ok())
        .unwrap_or("");
    if ctype.split(';').next().unwrap_or("").trim() != "application/apply-patch+yaml" {
        return Err(Box::new(status(
            StatusCode::UNSUPPORTED_MEDIA_TYPE,
            "UnsupportedMediaType",
            format!(
                "the body of the request was in an unknown format ({ctype}); this double accepts only application/apply-patch+yaml"
            ),
        )));
    }
    let Some(manager) = query.get("fieldManager").filter(|m| !m.is_empty()).cloned() else {
        return Err(Box::new(status(
            StatusCode::UNPROCESSABLE_ENTITY,
            "Invalid",
            "PatchOptions.meta.k8s.io \"\" is invalid: fieldManager: Required value: is required for apply patch".into(),
        )));
    };
    let force = query.get("force").is_some_and(|f| f == "true");
    Ok((manager, force))
}

/// That the applied object is the one the URL addresses (kind, name, namespace), that a test
/// has not marked it refused, and that its namespace exists; sets `metadata.namespace` as
/// the URL gives it (and drops it from a cluster-scoped object). `Err` is the refusal.
fn check_apply_target(
    c: &Cluster,
    res: &Res,
    obj: &mut Value,
    ns: &str,
    name: &str,
) -> Result<(), Box<Response>> {
    if obj["apiVersion"] != res.api_version().as_str() || obj["kind"] != res.kind.as_str() {
        return Err(Box::new(status(
            StatusCode::BAD_REQUEST,
            "BadRequest",
            format!(
                "the body is {} {}, the URL addresses {} {}",
                obj["apiVersion"],
                obj["kind"],
                res.api_version(),
                res.kind
            ),
        )));
    }
    // Name and namespace checks and their wording: kubernetes/kubernetes
    // staging/src/k8s.io/apiserver/pkg/endpoints/handlers/rest.go, checkName (400 BadRequest).
    if obj["metadata"]["name"] != name {
        let body_name = obj["metadata"]["name"].as_str().unwrap_or("").to_owned();
        return Err(Box::new(status(
            StatusCode::BAD_REQUEST,
            "BadRequest",
            format!(
                "the name of the object ({body_name}) does not match the name on the URL ({name})"
            ),
        )));
    }
    if let Some(reason) = c
        .refused
        .get(&(res.kind.clone(), ns.to_owned(), name.to_owned()))
    {
        return Err(Box::new(status(
            StatusCode::UNPROCESSABLE_ENTITY,
            "Invalid",
            format!("{}.{} \"{name}\" is invalid: {reason}", res.kind, res.group),
        )));
    }
    if !res.namespaced {
        if let Some(meta) = obj["metadata"].as_object_mut() {
            meta.remove("namespace");
        }
        return Ok(());
    }
    if let Some(body_ns) = obj["metadata"]["namespace"].as_str()
        && body_ns != ns
    {
        return Err(Box::new(status(
            StatusCode::BAD_REQUEST,
            "BadRequest",
            format!(
                "the namespace of the object ({body_ns}) does not match the namespace on the request ({ns})"
            ),
        )));
    }
    namespace_exists(c, ns)?;
    obj["metadata"]["namespace"] = Value::String(ns.to_owned());
    Ok(())
}

/// A v1 Secret's `data` values must be base64. `data` is `map[string][]byte`; Go's JSON
/// decoder reads []byte as base64, so a bad value fails decoding the body, before
/// validation: 400 BadRequest "Secret in version \"v1\" cannot be handled as a Secret: ...
/// illegal base64 data at input byte N" (kubernetes/kubernetes
/// staging/src/k8s.io/apiserver/pkg/endpoints/handlers/rest.go, transformDecodeError;
/// encoding/base64 CorruptInputError for the wording).
fn check_secret_data(res: &Res, obj: &Value) -> Result<(), Box<Response>> {
    if res.kind != "Secret" || !res.group.is_empty() {
        return Ok(());
    }
    for (k, v) in obj["data"].as_object().into_iter().flatten() {
        let bad_at = match v.as_str().map(|s| STANDARD.decode(s)) {
            Some(Ok(_)) => continue,
            Some(Err(base64::DecodeError::InvalidByte(at, _)))
            | Some(Err(base64::DecodeError::InvalidLastSymbol(at, _))) => at,
            Some(Err(_)) => v.as_str().map_or(0, str::len),
            None => 0,
        };
        return Err(Box::new(status(
            StatusCode::BAD_REQUEST,
            "BadRequest",
            format!(
                "Secret in version \"v1\" cannot be handled as a Secret: v1.Secret.Data: \
                 decode base64: illegal base64 data at input byte {bad_at} (key {k})"
            ),
        )));
    }
    Ok(())
}

/// Stores an apply that changed something: a new resourceVersion, a new generation only
/// when `spec` moved (pkg/registry/apps/deployment/strategy.go, PrepareForUpdate, and the
/// same rule in the other workload strategies), and the simulated delay before a CRD is
/// established or a workload rolled out.
fn store_applied(
    c: &mut Cluster,
    res: &Res,
    key: &Key,
    new_content: Value,
    manager: &str,
    now: Instant,
) {
    c.rv += 1;
    let (uid, generation) = match c.objects.get(key) {
        Some(s) => {
            let old_gen = s.obj["metadata"]["generation"].as_i64().unwrap_or(1);
            let spec_changed = s.obj.get("spec") != new_content.get("spec");
            (
                s.obj["metadata"]["uid"].clone(),
                if spec_changed { old_gen + 1 } else { old_gen },
            )
        }
        None => {
            c.uid += 1;
            (json!(format!("uid-{}", c.uid)), 1)
        }
    };
    let mut stored = new_content;
    // The name check made `metadata` an object.
    stamp_metadata(&mut stored, uid, c.rv, generation);
    let delay = match res.kind.as_str() {
        "CustomResourceDefinition" => c.opts.crd_delay,
        "Deployment" | "DaemonSet" | "StatefulSet" => c.opts.rollout_delay,
        _ => Duration::ZERO,
    };
    c.objects.insert(
        key.clone(),
        Stored {
            obj: stored,
            manager: manager.to_owned(),
            operation: "Apply",
            ready_at: now + delay,
        },
    );
}

/// Whether `res` is a built-in kind (typed on the real server), not a custom resource.
fn is_builtin(res: &Res) -> bool {
    builtins()
        .iter()
        .any(|b| b.group == res.group && b.kind == res.kind)
}

/// `<group>/<version>, Kind=<kind>` as Go prints a GroupVersionKind (core: `/v1`).
fn gvk_string(res: &Res) -> String {
    format!("{}/{}, Kind={}", res.group, res.version, res.kind)
}

/// A Status with `details.causes`, as the apiserver sends for apply conflicts
/// (k8s.io/apimachinery pkg/api/errors/errors.go, NewApplyConflict: 409 Conflict, one
/// `FieldManagerConflict` cause per field).
fn conflict_status(res: &Res, name: &str, conflicts: &[kube_ssa::Conflict]) -> Response {
    let causes: Vec<Value> = conflicts
        .iter()
        .map(|c| {
            json!({"reason": "FieldManagerConflict",
                   "message": format!("conflict with {}", c.manager), "field": c.path})
        })
        .collect();
    let body = json!({
        "kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure",
        "message": kube_ssa::conflict_message(conflicts), "reason": "Conflict",
        "details": {"name": name, "group": res.group, "kind": res.plural, "causes": causes},
        "code": 409,
    });
    (StatusCode::CONFLICT, axum::Json(body)).into_response()
}

/// Server-side apply of `obj` by `manager` over the stored object at `key`, as
/// structured-merge-diff does it (`kube_ssa::apply`): the typed conversion of the patch
/// first (a string where the schema has a number is refused as the real server refuses it:
/// status 500 with no reason, kubernetes/kubernetes v1.36.2 staging/src/k8s.io/apimachinery/
/// pkg/util/managedfields/internal/structuredmerge.go, Apply, "failed to create typed patch
/// object (%v): %v", which ErrorToAPIStatus turns into a 500), then conflicts (409), the
/// merge, the typed round trip, and the new managedFields. Returns the new content (with
/// `metadata.managedFields`), whether it is a create, and whether anything changed —
/// content or managedFields, both of which a real write would bump resourceVersion for.
fn ssa_merge(
    c: &Cluster,
    res: &Res,
    key: &Key,
    obj: &Value,
    manager: &str,
    force: bool,
) -> Result<(Value, bool, bool), Box<Response>> {
    let builtin = is_builtin(res);
    if builtin && let Some(e) = kube_ssa::numeric_type_error(obj) {
        let message = format!(
            "failed to create typed patch object ({}/{}; {}): {e}",
            key.2,
            key.3,
            gvk_string(res)
        );
        return Err(Box::new(status(
            StatusCode::INTERNAL_SERVER_ERROR,
            "",
            message,
        )));
    }
    let existing = c.objects.get(key);
    let live = existing.map(|s| content(&s.obj));
    let entries = existing.and_then(|s| kube_ssa::entries_of(&s.obj));
    let merged = kube_ssa::apply(
        live.as_ref(),
        entries,
        &content(obj),
        manager,
        &res.api_version(),
        force,
    )
    .map_err(|conflicts| Box::new(conflict_status(res, &key.3, &conflicts)))?;
    let mut new = merged.object;
    typed_round_trip(res, &mut new, builtin);
    let managed = kube_ssa::encode(&merged.entries);
    let changed = match existing {
        None => true,
        Some(s) => live.as_ref() != Some(&new) || s.obj["metadata"]["managedFields"] != managed,
    };
    new["metadata"]["managedFields"] = managed;
    Ok((new, existing.is_none(), changed))
}

/// What the server stores of a merged or patched object: the typed round trip
/// ([`kube_ssa::normalize`]), `stringData` folded into `data`, and a Namespace's defaults.
fn typed_round_trip(res: &Res, new: &mut Value, builtin: bool) {
    kube_ssa::normalize(new, builtin);
    // The merge runs on the versioned object, so the writer owns `f:stringData`; the
    // conversion to the internal type then folds it into `data`, which is what is stored and
    // compared (see [`fold_string_data`]).
    fold_string_data(res, new);
    if res.group.is_empty() && res.kind == "Namespace" {
        kube_ssa::namespace_strategy(new);
    }
}

/// The `Warning` headers admission adds to a write: PodSecurity's `restricted` findings for
/// a workload in a Namespace labelled to warn (or enforce) at that level
/// (`kube_ssa::pod_security_warning`), plus any a test set with
/// [`KubeDouble::warn_on`].
fn admission_warnings(c: &Cluster, ns: &str, obj: &Value) -> Vec<String> {
    let mut out = Vec::new();
    if !ns.is_empty() {
        let ns_key = (
            String::new(),
            "namespaces".to_owned(),
            String::new(),
            ns.to_owned(),
        );
        if let Some(n) = c.objects.get(&ns_key)
            && let Some(w) = kube_ssa::pod_security_warning(&n.obj, obj)
        {
            out.push(w);
        }
    }
    let kind = obj["kind"].as_str().unwrap_or_default();
    let name = obj["metadata"]["name"].as_str().unwrap_or_default();
    if let Some(w) = c
        .warnings
        .get(&(kind.to_owned(), ns.to_owned(), name.to_owned()))
    {
        out.push(w.clone());
    }
    out
}

/// Adds each warning as a `Warning: 299 - "<text>"` header, the text a quoted-string with
/// `"` and `\` escaped (k8s.io/apimachinery v0.36 pkg/util/net/http.go, NewWarningHeader;
/// the apiserver's warning recorder sends code 299 and agent `-`).
fn with_warnings(mut resp: Response, warnings: &[String]) -> Response {
    for w in warnings {
        let quoted = w.replace('\\', "\\\\").replace('"', "\\\"");
        if let Ok(v) = axum::http::HeaderValue::from_str(&format!("299 - \"{quoted}\"")) {
            resp.headers_mut().append("warning", v);
        }
    }
    resp
}

/// The patch types other than apply, by content type.
#[derive(Clone, Copy, PartialEq, Eq)]
pub(super) enum PatchKind {
    Strategic,
    Merge,
    Json,
}

pub(super) fn patch_kind(headers: &HeaderMap) -> Option<PatchKind> {
    let ctype = headers
        .get("content-type")
        .and_then(|v| v.to_str().ok())
        .unwrap_or("");
    match ctype.split(';').next().unwrap_or("").trim() {
        "application/strategic-merge-patch+json" => Some(PatchKind::Strategic),
        "application/merge-patch+json" => Some(PatchKind::Merge),
        "application/json-patch+json" => Some(PatchKind::Json),
        _ => None,
    }
}

/// A strategic-merge, JSON-merge or JSON patch of one object, as client-side `kubectl
/// apply` and Helm's three-way merge (and client-go's csaupgrade) send them
/// (kubernetes/kubernetes v1.36.2 staging/src/k8s.io/apiserver/pkg/endpoints/handlers/
/// patch.go): the patch is applied to the stored object; a strategic merge patch of a custom
/// resource is 415; a `resourceVersion` in the result other than the stored one is 409; the
/// result goes through the typed round trip; the manager (`fieldManager`, else the
/// client's user agent's program name, as the apiserver defaults it) takes the fields it
/// changed, an Update that never conflicts; a patch that rewrites `metadata.managedFields`
/// itself sets them as given (managedfields/internal/fieldmanager.go: a request that
/// changes managedFields resets them).
#[allow(clippy::too_many_arguments)]
pub(super) fn patch_update(
    c: &mut Cluster,
    kind: PatchKind,
    res: Res,
    ns: Option<String>,
    name: String,
    query: &BTreeMap<String, String>,
    headers: &HeaderMap,
    body: &[u8],
    now: Instant,
) -> Response {
    let builtin = is_builtin(&res);
    if kind == PatchKind::Strategic && !builtin {
        return status(
            StatusCode::UNSUPPORTED_MEDIA_TYPE,
            "UnsupportedMediaType",
            "the body of the request was in an unknown format - accepted media types include: \
             application/json-patch+json, application/merge-patch+json, application/apply-patch+yaml"
                .into(),
        );
    }
    let patch: Value = match serde_json::from_slice(body) {
        Ok(v) => v,
        Err(e) => return status(StatusCode::BAD_REQUEST, "BadRequest", e.to_string()),
    };
    let key = object_key(&res, ns.clone().unwrap_or_default(), name.clone());
    let Some(existing) = c.objects.get(&key) else {
        return not_found(&res, &name);
    };
    let mut current = existing.obj.clone();
    if let Some(Value::Array(a)) = current["metadata"].get("managedFields")
        && a.is_empty()
    {
        current["metadata"]
            .as_object_mut()
            .map(|m| m.remove("managedFields"));
    }
    let patched = match patched(kind, &current, &patch) {
        Ok(v) => v,
        Err(refused) => return *refused,
    };
    if let Err(refused) = check_patched_version(&res, &name, existing, &patched) {
        return *refused;
    }
    if builtin && let Some(e) = kube_ssa::numeric_type_error(&patched) {
        return status(StatusCode::UNPROCESSABLE_ENTITY, "Invalid", e);
    }
    let manager = patch_manager(query, headers);
    let old = content(&existing.obj);
    let mut new = content(&patched);
    typed_round_trip(&res, &mut new, builtin);
    let given = patched["metadata"]["managedFields"].clone();
    let entries = if !given.is_null() && given != current["metadata"]["managedFields"] {
        kube_ssa::entries_of(&patched).unwrap_or_default()
    } else {
        kube_ssa::update(
            Some(&old),
            kube_ssa::entries_of(&existing.obj),
            &new,
            &manager,
            &res.api_version(),
        )
    };
    let managed = kube_ssa::encode(&entries);
    let changed = old != new || existing.obj["metadata"]["managedFields"] != managed;
    if changed {
        store_patched(c, &res, &key, new, managed, manager, now);
    }
    let s = &c.objects[&key];
    let view = c.view(&key, s, now);
    let warnings = admission_warnings(c, &key.2, &view);
    with_warnings(
        (StatusCode::OK, axum::Json(view)).into_response(),
        &warnings,
    )
}

/// `current` with the patch applied; `Err` is the 422 for a JSON patch that does not apply.
fn patched(kind: PatchKind, current: &Value, patch: &Value) -> Result<Value, Box<Response>> {
    Ok(match kind {
        PatchKind::Strategic => kube_ssa::strategic_merge(current, patch, ""),
        PatchKind::Merge => kube_ssa::json_merge(current, patch),
        PatchKind::Json => kube_ssa::json_patch(current, patch).map_err(|e| {
            Box::new(status(
                StatusCode::UNPROCESSABLE_ENTITY,
                "Invalid",
                format!("the server rejected our request due to an error in our request: {e}"),
            ))
        })?,
    })
}

/// A `resourceVersion` the patch leaves in the object must be the stored one (an optimistic
/// lock); `Err` is the 409 Conflict.
fn check_patched_version(
    res: &Res,
    name: &str,
    existing: &Stored,
    patched: &Value,
) -> Result<(), Box<Response>> {
    let stored_rv = &existing.obj["metadata"]["resourceVersion"];
    if patched["metadata"]["resourceVersion"].is_null()
        || patched["metadata"]["resourceVersion"] == *stored_rv
    {
        return Ok(());
    }
    Err(Box::new(status(
        StatusCode::CONFLICT,
        "Conflict",
        format!(
            "Operation cannot be fulfilled on {} \"{name}\": the object has been modified; please apply your changes to the latest version and try again",
            qualified(res)
        ),
    )))
}

/// The manager of a non-apply patch: `fieldManager`, else the program name of the client's
/// user agent, as the apiserver defaults it.
fn patch_manager(query: &BTreeMap<String, String>, headers: &HeaderMap) -> String {
    query
        .get("fieldManager")
        .cloned()
        .or_else(|| {
            headers
                .get("user-agent")
                .and_then(|v| v.to_str().ok())
                .and_then(|ua| ua.split('/').next())
                .map(str::to_owned)
        })
        .unwrap_or_else(|| "unknown".into())
}

/// Stores a patch that changed something over the object at `key` (which exists): a new
/// resourceVersion, generation moved only with `spec`, a workload whose spec moved rolling
/// out again, and the managedFields computed for it.
fn store_patched(
    c: &mut Cluster,
    res: &Res,
    key: &Key,
    mut new: Value,
    managed: Value,
    manager: String,
    now: Instant,
) {
    let existing = &c.objects[key];
    let old = content(&existing.obj);
    let spec_changed = old.get("spec") != new.get("spec");
    let generation = existing.obj["metadata"]["generation"].as_i64().unwrap_or(1);
    let uid = existing.obj["metadata"]["uid"].clone();
    let ready_at = if spec_changed {
        match res.kind.as_str() {
            "Deployment" | "DaemonSet" | "StatefulSet" => now + c.opts.rollout_delay,
            _ => existing.ready_at,
        }
    } else {
        existing.ready_at
    };
    c.rv += 1;
    let generation = if spec_changed {
        generation + 1
    } else {
        generation
    };
    stamp_metadata(&mut new, uid, c.rv, generation);
    if let Some(meta) = new["metadata"].as_object_mut() {
        meta.insert("managedFields".into(), managed);
    }
    c.objects.insert(
        key.clone(),
        Stored {
            obj: new,
            manager,
            operation: "Update",
            ready_at,
        },
    );
}

/// A Secret's `stringData` folded into `data`, as the API server converts every v1 Secret it
/// decodes (kubernetes/kubernetes pkg/apis/core/v1/conversion.go at 0158de93ea1c,
/// `Convert_v1_Secret_To_core_Secret`: "StringData overwrites Data", each value's bytes
/// base64-encoded on the wire). The internal type has no `stringData`, so the server stores
/// and returns only `data`.
fn fold_string_data(res: &Res, obj: &mut Value) {
    if res.kind != "Secret" || !res.group.is_empty() {
        return;
    }
    let Some(string_data) = obj.as_object_mut().and_then(|o| o.remove("stringData")) else {
        return;
    };
    let Value::Object(string_data) = string_data else {
        return;
    };
    if string_data.is_empty() {
        return;
    }
    if !obj["data"].is_object() {
        obj["data"] = json!({});
    }
    for (k, v) in string_data {
        let text = v.as_str().unwrap_or_default();
        obj["data"][k] = Value::String(STANDARD.encode(text.as_bytes()));
    }
}

/// A server-side apply with `dryRun=All`: everything [`apply`] checks and answers, nothing
/// stored (kubernetes/kubernetes staging/src/k8s.io/apiserver/pkg/registry/generic/registry/
/// dryrun.go at 04791b490660, `DryRunnableStorage`: a dry-run update returns the updated object
/// with the stored `resourceVersion`, a dry-run create one without any). The only value
/// PatchOptions accepts is `All` (kubernetes/apimachinery v0.36.3 pkg/apis/meta/v1/validation/
/// validation.go, `ValidatePatchOptions` -> `ValidateDryRun`).
#[allow(clippy::too_many_arguments)]
pub(super) fn dry_run_apply(
    c: &mut Cluster,
    res: Res,
    ns: Option<String>,
    name: String,
    query: &BTreeMap<String, String>,
    headers: &HeaderMap,
    body: &[u8],
    now: Instant,
) -> Response {
    let dry_run = query.get("dryRun").map(String::as_str).unwrap_or("");
    if dry_run != "All" {
        return status(
            StatusCode::UNPROCESSABLE_ENTITY,
            "Invalid",
            format!(
                "PatchOptions.meta.k8s.io \"\" is invalid: dryRun: Unsupported value: []string{{\"{dry_run}\"}}: supported values: \"All\""
            ),
        );
    }
    let key = object_key(&res, ns.clone().unwrap_or_default(), name.clone());
    let saved = c.objects.get(&key).cloned();
    let (rv, uid, logged) = (c.rv, c.uid, c.log.len());
    let reply = apply(c, res, ns, name, query, headers, body, now);
    let result = c.objects.get(&key).map(|s| c.view(&key, s, now));
    match &saved {
        Some(s) => {
            c.objects.insert(key.clone(), s.clone());
        }
        None => {
            c.objects.remove(&key);
        }
    }
    (c.rv, c.uid) = (rv, uid);
    c.log.truncate(logged);
    if !reply.status().is_success() {
        return reply;
    }
    let Some(mut obj) = result else {
        return reply;
    };
    if let Some(meta) = obj["metadata"].as_object_mut() {
        match &saved {
            Some(s) => {
                meta.insert(
                    "resourceVersion".into(),
                    s.obj["metadata"]["resourceVersion"].clone(),
                );
            }
            None => {
                meta.remove("resourceVersion");
            }
        }
    }
    (reply.status(), axum::Json(obj)).into_response()
}
