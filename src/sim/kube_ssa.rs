//! Field ownership for the Kubernetes API double, the way the real API server keeps it with
//! structured-merge-diff: per manager and operation, the set of fields it owns
//! (`metadata.managedFields[].fieldsV1`), conflicts when one applier changes a field another
//! manager owns, a manager that owns nothing dropped, and the typed round trip that drops
//! zero values the Go types omit. Also the patch kinds other clients send, the typed refusal
//! of a string where a number belongs, the PodSecurity warnings the server returns as
//! `Warning` headers, and the protobuf Secrets Helm sends.
//!
//! * [`fieldpath`]: field paths, the fields an object sets, the fieldsV1 encoding.
//! * this file: managedFields entries, Apply and Update, the 409 conflict message.
//! * [`typed`]: the typed round trip and the server's defaulting.
//! * [`patch`]: strategic merge, JSON merge and JSON patch.
//! * [`pod_security`]: the PodSecurity `restricted` warnings.
//! * [`protobuf`]: a Secret sent as Kubernetes protobuf.
//!
//! Modelled on kubernetes-sigs/structured-merge-diff v6.3.2 (`merge/update.go`: Apply,
//! Update, prune, and the removal of empty managers) and kubernetes/kubernetes v1.36.2
//! (`staging/src/k8s.io/apimachinery/pkg/util/managedfields/internal/`: `conflict.go` for the
//! 409 message, `skipnonapplied.go` for `before-first-apply`, `structuredmerge.go` for the
//! typed-patch error).

use std::collections::BTreeMap;

use serde_json::{Value, json};

mod fieldpath;
mod patch;
mod pod_security;
mod protobuf;
mod typed;

use fieldpath::{
    FieldSet, Path, Pe, field_set, from_fields_v1, get, item_key, list_keys, print_path, remove,
    to_fields_v1,
};
pub(crate) use patch::{json_merge, json_patch, strategic_merge};
pub(crate) use pod_security::pod_security_warning;
pub(crate) use protobuf::protobuf_secret;
pub(crate) use typed::{namespace_strategy, normalize, numeric_type_error};

/// The time stamped on managedFields entries (the double's clock for stored metadata).
pub(crate) const ENTRY_TIME: &str = "2026-11-30T00:00:00Z";

/// The manager the server invents for fields set before the first apply
/// (`skipnonapplied.go`, `beforeFirstApplyManager`).
pub(crate) const BEFORE_FIRST_APPLY: &str = "before-first-apply";

/// One managedFields entry.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct Entry {
    /// `manager`.
    pub manager: String,
    /// `Apply` or `Update`.
    pub operation: String,
    /// `apiVersion` the fields are recorded in.
    pub api_version: String,
    /// The fields.
    pub fields: FieldSet,
}

/// A field another manager owns that an apply would change.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct Conflict {
    /// The printed manager (`"x"`, or `"x" using v1 at <time>` for an Update entry).
    pub manager: String,
    /// The path as structured-merge-diff prints it.
    pub path: String,
}

/// The entries stored in an object's `metadata.managedFields`; `None` when it has none at
/// all (an object written before any field tracking, which `before-first-apply` covers).
pub(crate) fn entries_of(obj: &Value) -> Option<Vec<Entry>> {
    // An empty list counts as none: skipnonapplied.go checks `len(managed.Fields()) == 0`.
    let list = obj["metadata"]["managedFields"]
        .as_array()
        .filter(|l| !l.is_empty())?;
    Some(
        list.iter()
            .map(|e| Entry {
                manager: e["manager"].as_str().unwrap_or_default().to_owned(),
                operation: e["operation"].as_str().unwrap_or("Update").to_owned(),
                api_version: e["apiVersion"].as_str().unwrap_or_default().to_owned(),
                fields: from_fields_v1(&e["fieldsV1"]),
            })
            .collect(),
    )
}

/// Encodes entries as `metadata.managedFields`, Apply entries first then by manager, as
/// the server sorts them (`managedfields.go`, `sortEncodedManagedFields`, by operation then
/// time then manager).
pub(crate) fn encode(entries: &[Entry]) -> Value {
    let mut sorted: Vec<&Entry> = entries.iter().filter(|e| !e.fields.is_empty()).collect();
    sorted.sort_by(|a, b| (&a.operation, &a.manager).cmp(&(&b.operation, &b.manager)));
    Value::Array(
        sorted
            .into_iter()
            .map(|e| {
                json!({"manager": e.manager, "operation": e.operation,
                       "apiVersion": e.api_version, "time": ENTRY_TIME,
                       "fieldsType": "FieldsV1", "fieldsV1": to_fields_v1(&e.fields)})
            })
            .collect(),
    )
}

fn printed_manager(e: &Entry) -> String {
    if e.operation == "Update" {
        format!("{:?} using {} at {ENTRY_TIME}", e.manager, e.api_version)
    } else {
        format!("{:?}", e.manager)
    }
}

/// The 409 message for `conflicts` (`conflict.go`, `ConflictsToString`-style wording the
/// API server builds in `NewConflictError`).
pub(crate) fn conflict_message(conflicts: &[Conflict]) -> String {
    if let [c] = conflicts {
        return format!(
            "Apply failed with 1 conflict: conflict with {}: {}",
            c.manager, c.path
        );
    }
    let mut by: BTreeMap<&str, Vec<&str>> = BTreeMap::new();
    for c in conflicts {
        by.entry(c.manager.as_str())
            .or_default()
            .push(c.path.as_str());
    }
    let mut lines = Vec::new();
    for (m, paths) in by {
        lines.push(format!("conflicts with {m}:"));
        lines.extend(paths.into_iter().map(|p| format!("- {p}")));
    }
    format!(
        "Apply failed with {} conflicts: {}",
        conflicts.len(),
        lines.join("\n")
    )
}

/// Deep merge of an applied configuration into the live object: maps field by field, keyed
/// lists element by element, everything else replaced (`merge/update.go` merges the typed
/// values this way).
fn merge(live: &Value, applied: &Value, field: &str) -> Value {
    match (live, applied) {
        (Value::Object(l), Value::Object(a)) => {
            let mut out = l.clone();
            for (k, av) in a {
                let merged = match l.get(k) {
                    Some(lv) => merge(lv, av, k),
                    None => av.clone(),
                };
                out.insert(k.clone(), merged);
            }
            Value::Object(out)
        }
        (Value::Array(l), Value::Array(a)) => match list_keys(field, a).or(list_keys(field, l)) {
            Some(keys) => {
                let mut out: Vec<Value> = Vec::new();
                for ai in a {
                    let k = item_key(keys, ai);
                    out.push(match l.iter().find(|li| item_key(keys, li) == k) {
                        Some(li) => merge(li, ai, field),
                        None => ai.clone(),
                    });
                }
                for li in l {
                    let k = item_key(keys, li);
                    if !a.iter().any(|ai| item_key(keys, ai) == k) {
                        out.push(li.clone());
                    }
                }
                Value::Array(out)
            }
            None => applied.clone(),
        },
        _ => applied.clone(),
    }
}

/// What one server-side apply does to an object and its managers.
pub(crate) struct Applied {
    /// The new object (not yet normalised by the typed round trip).
    pub object: Value,
    /// The new managedFields entries.
    pub entries: Vec<Entry>,
}

/// Server-side apply of `config` by `manager` over `live` (None: a create) with its
/// `entries` (None: an object without managedFields, whose fields then belong to
/// `before-first-apply`). Without `force`, a field another manager owns whose value the
/// apply would change is a conflict; with it, that field moves to `manager`. Fields the
/// manager applied before and no longer does are removed unless another manager owns them.
pub(crate) fn apply(
    live: Option<&Value>,
    entries: Option<Vec<Entry>>,
    config: &Value,
    manager: &str,
    api_version: &str,
    force: bool,
) -> Result<Applied, Vec<Conflict>> {
    let empty = json!({});
    let live_obj = live.unwrap_or(&empty);
    let mut entries = match (live, entries) {
        (Some(l), None) => vec![Entry {
            manager: BEFORE_FIRST_APPLY.into(),
            operation: "Update".into(),
            api_version: api_version.into(),
            fields: field_set(l),
        }],
        (_, e) => e.unwrap_or_default(),
    };
    let applied = field_set(config);
    let mut conflicts = Vec::new();
    let mut taken: Vec<Path> = Vec::new();
    for p in &applied {
        if matches!(p.last(), Some(Pe::Key(_))) {
            continue;
        }
        let (new, old) = (get(config, p), get(live_obj, p));
        if new == old {
            continue;
        }
        for e in &entries {
            let mine = e.manager == manager && e.operation == "Apply";
            if !mine && e.fields.contains(p) {
                conflicts.push(Conflict {
                    manager: printed_manager(e),
                    path: print_path(p),
                });
                taken.push(p.clone());
            }
        }
    }
    if !conflicts.is_empty() && !force {
        return Err(conflicts);
    }
    let mut object = merge(live_obj, config, "");
    let previous = entries
        .iter()
        .find(|e| e.manager == manager && e.operation == "Apply")
        .map(|e| e.fields.clone())
        .unwrap_or_default();
    for e in &mut entries {
        for p in &taken {
            e.fields.remove(p);
        }
    }
    entries.retain(|e| !(e.manager == manager && e.operation == "Apply"));
    // Prune: what this manager stopped applying goes unless someone else still owns it.
    for p in previous.difference(&applied) {
        if !entries.iter().any(|e| e.fields.contains(p)) {
            remove(&mut object, p);
        }
    }
    entries.push(Entry {
        manager: manager.into(),
        operation: "Apply".into(),
        api_version: api_version.into(),
        fields: applied,
    });
    // update.go, Apply: managers left owning nothing are removed.
    entries.retain(|e| !e.fields.is_empty());
    Ok(Applied { object, entries })
}

/// An Update (create, replace, or a non-apply patch) by `manager` from `old` to `new`: the
/// fields it set or changed become its own and leave every other manager; fields that
/// disappeared leave everyone (`merge/update.go`, Update). Never a conflict.
pub(crate) fn update(
    old: Option<&Value>,
    entries: Option<Vec<Entry>>,
    new: &Value,
    manager: &str,
    api_version: &str,
) -> Vec<Entry> {
    let mut entries = entries.unwrap_or_default();
    let empty = json!({});
    let old = old.unwrap_or(&empty);
    let now = field_set(new);
    let changed: FieldSet = now
        .iter()
        .filter(|p| match p.last() {
            // A keyed element counts as added only when it is new; changes inside it are
            // reported at its leaves (SMD typed/compare.go).
            Some(Pe::Key(_)) => get(old, p).is_none(),
            _ => get(old, p) != get(new, p),
        })
        .cloned()
        .collect();
    for e in &mut entries {
        e.fields.retain(|p| now.contains(p) && !changed.contains(p));
    }
    match entries
        .iter_mut()
        .find(|e| e.manager == manager && e.operation == "Update")
    {
        Some(e) => e.fields.extend(changed),
        None => entries.push(Entry {
            manager: manager.into(),
            operation: "Update".into(),
            api_version: api_version.into(),
            fields: changed,
        }),
    }
    entries.retain(|e| !e.fields.is_empty());
    entries
}

#[cfg(test)]
mod tests {
    use super::*;

    fn deploy(read_only: Value, delay: Value) -> Value {
        json!({"apiVersion": "apps/v1", "kind": "Deployment",
            "metadata": {"name": "d", "namespace": "n", "annotations": {}},
            "spec": {"template": {"spec": {"containers": [{"name": "c", "image": "i",
                "readinessProbe": {"initialDelaySeconds": delay},
                "volumeMounts": [{"name": "v", "mountPath": "/v", "readOnly": read_only}]}]}}}})
    }

    #[test]
    fn fields_v1_round_trips_and_prints_like_smd() {
        let set = field_set(&deploy(json!(false), json!(0)));
        let tree = to_fields_v1(&set);
        assert_eq!(from_fields_v1(&tree), set);
        let c = &tree["f:spec"]["f:template"]["f:spec"]["f:containers"]["k:{\"name\":\"c\"}"];
        assert_eq!(c["."], json!({}));
        assert_eq!(
            c["f:volumeMounts"]["k:{\"mountPath\":\"/v\"}"]["f:readOnly"],
            json!({})
        );
        let p = set
            .iter()
            .find(|p| p.last() == Some(&Pe::Field("readOnly".into())))
            .unwrap();
        assert_eq!(
            print_path(p),
            ".spec.template.spec.containers[name=\"c\"].volumeMounts[mountPath=\"/v\"].readOnly"
        );
        assert!(
            !set.iter()
                .any(|p| p.get(1) == Some(&Pe::Field("name".into())))
        );
    }

    /// The Helm take-over failure: a second applier of the same manifest conflicts
    /// on every zero value the typed round trip dropped.
    #[test]
    fn a_second_applier_of_the_same_manifest_conflicts_on_dropped_zero_values() {
        let cfg = deploy(json!(false), json!(0));
        let created = apply(None, None, &cfg, "talboot", "apps/v1", true).unwrap();
        let mut stored = created.object;
        normalize(&mut stored, true);
        assert!(
            get(
                &stored,
                &[
                    Pe::Field("metadata".into()),
                    Pe::Field("annotations".into())
                ]
            )
            .is_none()
        );
        // The same manager again: no conflict, nothing changes.
        let again = apply(
            Some(&stored),
            Some(created.entries.clone()),
            &cfg,
            "talboot",
            "apps/v1",
            false,
        )
        .unwrap();
        let mut again_obj = again.object;
        normalize(&mut again_obj, true);
        assert_eq!(again_obj, stored);
        assert_eq!(again.entries, created.entries);
        // Another manager: three conflicts, named as the server names them.
        let err = apply(
            Some(&stored),
            Some(created.entries.clone()),
            &cfg,
            "helm",
            "apps/v1",
            false,
        )
        .err()
        .expect("conflicts");
        let msg = conflict_message(&err);
        assert!(
            msg.starts_with("Apply failed with 3 conflicts: conflicts with \"talboot\":\n- "),
            "{msg}"
        );
        assert!(msg.contains("- .metadata.annotations"), "{msg}");
        assert!(
            msg.contains("].readinessProbe.initialDelaySeconds"),
            "{msg}"
        );
        // Forced, the fields move; shared ones stay shared.
        let forced = apply(
            Some(&stored),
            Some(created.entries),
            &cfg,
            "helm",
            "apps/v1",
            true,
        )
        .unwrap();
        let talboot = forced
            .entries
            .iter()
            .find(|e| e.manager == "talboot")
            .unwrap();
        assert!(
            !talboot
                .fields
                .iter()
                .any(|p| print_path(p) == ".metadata.annotations")
        );
        assert!(
            talboot
                .fields
                .iter()
                .any(|p| print_path(p).ends_with(".image"))
        );
    }

    #[test]
    fn a_manager_owning_nothing_is_dropped_and_before_first_apply_covers_old_fields() {
        let ns = json!({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": "a"}});
        let created = apply(None, None, &ns, "talboot", "v1", true).unwrap();
        assert!(created.entries.is_empty());
        let live = json!({"apiVersion": "v1", "kind": "Namespace",
            "metadata": {"name": "a", "labels": {"kubernetes.io/metadata.name": "a"}}});
        let second = apply(Some(&live), Some(vec![]), &ns, "talboot", "v1", true).unwrap();
        assert!(second.entries.is_empty());
        let untracked = apply(Some(&live), None, &ns, "talboot", "v1", true).unwrap();
        assert_eq!(untracked.entries.len(), 1);
        assert_eq!(untracked.entries[0].manager, BEFORE_FIRST_APPLY);
    }

    #[test]
    fn update_takes_changed_fields_and_never_conflicts() {
        let old = deploy(json!(true), json!(5));
        let owned = apply(None, None, &old, "talboot", "apps/v1", true)
            .unwrap()
            .entries;
        let new = deploy(json!(true), json!(7));
        let e = update(Some(&old), Some(owned), &new, "helm", "apps/v1");
        let helm = e.iter().find(|e| e.manager == "helm").unwrap();
        assert_eq!(helm.fields.len(), 1);
        assert!(print_path(helm.fields.iter().next().unwrap()).ends_with("initialDelaySeconds"));
    }

    #[test]
    fn patches_and_typed_errors() {
        let t = deploy(json!(true), json!(5));
        let p = json!({"spec": {"template": {"spec": {
            "$setElementOrder/containers": [{"name": "c"}],
            "containers": [{"name": "c", "image": "j"}, {"name": "x", "$patch": "delete"}]}}}});
        let out = strategic_merge(&t, &p, "");
        assert_eq!(
            out["spec"]["template"]["spec"]["containers"][0]["image"],
            "j"
        );
        assert_eq!(
            out["spec"]["template"]["spec"]["containers"][0]["readinessProbe"]["initialDelaySeconds"],
            5
        );
        assert_eq!(
            json_merge(&json!({"a": 1, "b": 2}), &json!({"a": null, "c": 3})),
            json!({"b": 2, "c": 3})
        );
        let jp = json!([{"op": "test", "path": "/a", "value": 1}, {"op": "replace", "path": "/a", "value": 2}]);
        assert_eq!(json_patch(&json!({"a": 1}), &jp).unwrap(), json!({"a": 2}));
        assert!(json_patch(&json!({"a": 3}), &jp).is_err());
        let bad = json!({"spec": {"template": {"spec": {"volumes": [{"name": "v",
            "projected": {"defaultMode": "0400"}}]}}}});
        assert_eq!(
            numeric_type_error(&bad).unwrap(),
            ".spec.template.spec.volumes[name=\"v\"].projected.defaultMode: expected numeric (int or float), got string"
        );
    }

    #[test]
    fn pod_security_restricted_warning_wording() {
        let ns = json!({"metadata": {"labels": {"pod-security.kubernetes.io/warn": "restricted"}}});
        let d = deploy(json!(true), json!(1));
        let w = pod_security_warning(&ns, &d).unwrap();
        assert_eq!(
            w,
            "would violate PodSecurity \"restricted:latest\": allowPrivilegeEscalation != false \
             (container \"c\" must set securityContext.allowPrivilegeEscalation=false), \
             unrestricted capabilities (container \"c\" must set \
             securityContext.capabilities.drop=[\"ALL\"]), runAsNonRoot != true (pod or \
             container \"c\" must set securityContext.runAsNonRoot=true), seccompProfile (pod \
             or container \"c\" must set securityContext.seccompProfile.type to \
             \"RuntimeDefault\" or \"Localhost\")"
        );
        assert!(pod_security_warning(&json!({}), &d).is_none());
    }

    /// A Secret as client-go's protobuf encoder writes it (hand-assembled wire bytes).
    #[test]
    fn protobuf_secrets_decode() {
        fn field(n: u8, payload: &[u8]) -> Vec<u8> {
            let mut v = vec![(n << 3) | 2, payload.len() as u8];
            v.extend_from_slice(payload);
            v
        }
        let entry = |k: &str, v: &[u8]| [field(1, k.as_bytes()), field(2, v)].concat();
        let meta = [
            field(1, b"sh.helm.release.v1.relay.v2"),
            field(3, b"hubble"),
            field(11, &entry("owner", b"helm")),
        ]
        .concat();
        let secret = [
            field(1, &meta),
            field(2, &entry("release", b"\x00\x01")),
            field(3, b"helm.sh/release.v1"),
        ]
        .concat();
        let type_meta = [field(1, b"v1"), field(2, b"Secret")].concat();
        let body = [b"k8s\0".to_vec(), field(1, &type_meta), field(2, &secret)].concat();
        assert_eq!(
            protobuf_secret(&body).unwrap(),
            json!({"apiVersion": "v1", "kind": "Secret", "type": "helm.sh/release.v1",
                "metadata": {"name": "sh.helm.release.v1.relay.v2", "namespace": "hubble",
                    "labels": {"owner": "helm"}},
                "data": {"release": "AAE="}})
        );
        assert!(protobuf_secret(b"{}").is_err());
    }
}
