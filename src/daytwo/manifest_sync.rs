//! The bootstrap manifest sync's I/O, the last step of `talboot upgrade --kubernetes` as of
//! `talosctl upgrade-k8s` (siderolabs/talos v1.13.9 `pkg/cluster/kubernetes/talos_managed.go`,
//! `PerformManifestsSync` -> `syncManifestsSSA`): the `Manifest` COSI resources read from one
//! control plane node (`getManifests` -> go-kubernetes v0.2.38 `kubernetes/manifests/get.go`,
//! `GetBootstrapManifests`: every item of every `Manifests.kubernetes.talos.dev` resource in
//! namespace `controlplane`, in List order), server-side applied with field manager `talos`
//! through talboot's Kubernetes adapter ([`crate::addons::kube::Kube`], forcing conflicts as
//! fluxcd ssa does), the inventory ConfigMap read, created, updated and pruned from as
//! go-kubernetes' `ssa` manager does, and the rollout of the set's workloads waited for
//! (`ssacli.Wait`, unless skipped). The decisions are [`super::manifests`].
//!
//! Each object's action comes from the server's own dry run of the apply (`dryRun=All`),
//! compared with the live object, as go-kubernetes' `Diff` does: fields the server rewrites
//! (a Secret's `stringData` stored as `data`) do not show as changes.
//!
//! Where talboot differs: a dry run does not create a missing inventory (go-kubernetes'
//! `NewInventory` creates it even for `Diff`); the wait covers every Deployment, DaemonSet
//! and StatefulSet of the set (go-kubernetes waits for every changed object's kstatus).

use std::collections::BTreeMap;
use std::time::Duration;

use k8s_openapi::api::core::v1::{ConfigMap, Namespace};
use kube::api::{Api, ObjectMeta, PostParams};
use prost::Message;
use serde_json::Value;

use super::manifests::{
    self, Action, Change, Desired, FIELD_MANAGER, INVENTORY_NAME, INVENTORY_NAMESPACE,
    MANIFEST_NAMESPACE, MANIFEST_TYPE, ManifestError, ObjMeta,
};
use crate::addons::kube::Kube;
use crate::addons::manifest::ObjectRef;
use crate::talos::TalosClient;
use crate::talos::api::talos::resource::definitions::k8s::ManifestSpec;

/// Every bootstrap manifest object the node renders, in Talos's order.
pub async fn fetch(talos: &TalosClient) -> Result<Vec<Value>, ManifestError> {
    let resources = talos
        .cosi_list(MANIFEST_NAMESPACE, MANIFEST_TYPE)
        .await
        .map_err(|e| ManifestError::Read(Box::new(e)))?;
    let mut out = Vec::new();
    for r in resources {
        let id = r
            .metadata
            .as_ref()
            .map(|m| m.id.clone())
            .unwrap_or_default();
        let bytes = r.spec.map(|s| s.proto_spec).unwrap_or_default();
        let spec = ManifestSpec::decode(bytes.as_slice())
            .map_err(|source| ManifestError::Undecodable { id, source })?;
        for item in spec.items {
            if let Some(obj) = item.object.as_ref() {
                out.push(manifests::struct_to_json(obj));
            }
        }
    }
    Ok(out)
}

fn reference(meta: &ObjMeta, api_version: String) -> ObjectRef {
    ObjectRef {
        api_version,
        kind: meta.kind.clone(),
        namespace: (!meta.namespace.is_empty()).then(|| meta.namespace.clone()),
        name: meta.name.clone(),
    }
}

/// An inventory entry's `apiVersion`: its group's preferred version that serves the kind
/// (inventory keys carry no version). `None` when the kind is not served any more.
async fn api_version_of(kube: &Kube, meta: &ObjMeta) -> Result<Option<String>, ManifestError> {
    let group = match kube::discovery::oneshot::group(kube.client(), &meta.group).await {
        Ok(g) => g,
        Err(kube::Error::Api(s)) if s.code == 404 => return Ok(None),
        Err(e) => {
            return Err(ManifestError::Discover {
                object: meta.clone(),
                source: Box::new(e),
            });
        }
    };
    Ok(group
        .recommended_kind(&meta.kind)
        .map(|(ar, _)| ar.api_version))
}

/// The live objects of the set and of the inventory, those that exist.
async fn live(
    kube: &Kube,
    desired: &Desired,
    inventory: &[ObjMeta],
) -> Result<BTreeMap<ObjMeta, Value>, ManifestError> {
    let mut out = BTreeMap::new();
    for (meta, obj) in &desired.objects {
        let r = ObjectRef::of(obj).ok_or_else(|| ManifestError::NotAnObject(meta.clone()))?;
        // A kind not served yet (a CRD of the set not applied yet) is "created".
        if let Ok(Some(v)) = kube.get(&r).await {
            out.insert(meta.clone(), v);
        }
    }
    for meta in inventory {
        if out.contains_key(meta) {
            continue;
        }
        let Some(api_version) = api_version_of(kube, meta).await? else {
            continue;
        };
        if let Some(v) = kube
            .get(&reference(meta, api_version))
            .await
            .map_err(|e| ManifestError::Kube(Box::new(e)))?
        {
            out.insert(meta.clone(), v);
        }
    }
    Ok(out)
}

/// The server's dry run of applying each object of the set as Talos does (`Manager.diff` ->
/// fluxcd ssa `ResourceManager.Diff`: forced, field manager `talos`, `dryRun=All`), for
/// those it could try; an object missing here would be created.
async fn dry_runs(
    kube: &Kube,
    desired: &Desired,
) -> Result<BTreeMap<ObjMeta, Value>, ManifestError> {
    let mut out = BTreeMap::new();
    for (meta, obj) in &desired.objects {
        let found = kube
            .dry_run_apply_as(obj, "default", FIELD_MANAGER)
            .await
            .map_err(|e| ManifestError::DryRun {
                object: meta.clone(),
                source: Box::new(e),
            })?;
        if let Some(v) = found {
            out.insert(meta.clone(), v);
        }
    }
    Ok(out)
}

fn inventory_api(kube: &Kube) -> Api<ConfigMap> {
    Api::namespaced(kube.client().clone(), INVENTORY_NAMESPACE)
}

/// The inventory's entries; `None` when there is no inventory ConfigMap yet.
async fn read_inventory(kube: &Kube) -> Result<Option<Vec<ObjMeta>>, ManifestError> {
    let cm = inventory_api(kube)
        .get_opt(INVENTORY_NAME)
        .await
        .map_err(|e| ManifestError::FetchInventory(Box::new(e)))?;
    match cm {
        None => Ok(None),
        Some(cm) => {
            let data: BTreeMap<String, String> = cm.data.unwrap_or_default().into_iter().collect();
            manifests::inventory_entries(&data).map(Some)
        }
    }
}

/// `GetInventory`: the inventory namespace created if missing, then the inventory ConfigMap
/// created empty if missing; its entries.
async fn ensure_inventory(kube: &Kube) -> Result<Vec<ObjMeta>, ManifestError> {
    let namespaces: Api<Namespace> = Api::all(kube.client().clone());
    let ns = namespaces
        .get_opt(INVENTORY_NAMESPACE)
        .await
        .map_err(|e| ManifestError::ReadNamespace(Box::new(e)))?;
    if ns.is_none() {
        let ns = Namespace {
            metadata: ObjectMeta {
                name: Some(INVENTORY_NAMESPACE.into()),
                ..Default::default()
            },
            ..Default::default()
        };
        match namespaces.create(&PostParams::default(), &ns).await {
            Ok(_) => {}
            Err(kube::Error::Api(s)) if s.code == 409 => {}
            Err(e) => return Err(ManifestError::CreateNamespace(Box::new(e))),
        }
    }
    if let Some(entries) = read_inventory(kube).await? {
        return Ok(entries);
    }
    let cm = ConfigMap {
        metadata: ObjectMeta {
            name: Some(INVENTORY_NAME.into()),
            namespace: Some(INVENTORY_NAMESPACE.into()),
            ..Default::default()
        },
        ..Default::default()
    };
    inventory_api(kube)
        .create(&params(), &cm)
        .await
        .map_err(|e| ManifestError::CreateInventory(Box::new(e)))?;
    Ok(Vec::new())
}

fn params() -> PostParams {
    PostParams {
        dry_run: false,
        field_manager: Some(FIELD_MANAGER.into()),
    }
}

/// `Inventory.Write`: the whole ConfigMap replaced with `entries` as its keys.
async fn write_inventory(kube: &Kube, entries: &[ObjMeta]) -> Result<(), ManifestError> {
    let cm = ConfigMap {
        metadata: ObjectMeta {
            name: Some(INVENTORY_NAME.into()),
            namespace: Some(INVENTORY_NAMESPACE.into()),
            ..Default::default()
        },
        data: Some(manifests::inventory_data(entries).into_iter().collect()),
        ..Default::default()
    };
    inventory_api(kube)
        .replace(INVENTORY_NAME, &params(), &cm)
        .await
        .map_err(|e| ManifestError::UpdateInventory(Box::new(e)))?;
    Ok(())
}

/// What a sync of `objects` would change, changing nothing (`Manager.Diff`).
pub async fn diff(
    kube: &Kube,
    objects: Vec<Value>,
    no_prune: bool,
) -> Result<Vec<Change>, ManifestError> {
    let desired = Desired::prepare(objects)?;
    let inventory = read_inventory(kube).await?.unwrap_or_default();
    let live = live(kube, &desired, &inventory).await?;
    let dry = dry_runs(kube, &desired).await?;
    manifests::plan(&desired, &live, &dry, &inventory, no_prune)
}

/// Applies `objects`, updates the inventory and prunes (`Manager.Apply`); the changes made.
/// A failed apply names the object; the inventory then holds what was applied before it.
pub async fn apply(
    kube: &Kube,
    objects: Vec<Value>,
    no_prune: bool,
) -> Result<Vec<Change>, ManifestError> {
    let desired = Desired::prepare(objects)?;
    let inventory = ensure_inventory(kube).await?;
    let live = live(kube, &desired, &inventory).await?;
    // The policy is checked before anything is applied, as go-kubernetes diffs every object
    // first (`Apply` -> `m.diff`, a dry run each).
    let dry = dry_runs(kube, &desired).await?;
    let planned = manifests::plan(&desired, &live, &dry, &inventory, no_prune)?;
    let mut changes = Vec::new();
    let mut applied = Vec::new();
    for (meta, obj) in &desired.objects {
        match kube.apply_as(obj, "default", FIELD_MANAGER).await {
            Ok(a) => {
                applied.push(meta.clone());
                let action = if a.changed {
                    manifests::action_for(live.get(meta), dry.get(meta)).max_changed()
                } else {
                    Action::Unchanged
                };
                tracing::info!(object = %meta, %action, "bootstrap manifest applied");
                changes.push(Change {
                    object: meta.clone(),
                    action,
                });
            }
            Err(e) => {
                let inv = manifests::inventory_after_apply(&inventory, &applied);
                let written = write_inventory(kube, &inv).await;
                return Err(ManifestError::Apply {
                    object: meta.clone(),
                    source: Box::new(e),
                    inventory: written.err().map(Box::new),
                });
            }
        }
    }
    let mut inv = manifests::inventory_after_apply(&inventory, &applied);
    write_inventory(kube, &inv).await?;
    if no_prune {
        return Ok(changes);
    }
    let mut prune_errors = Vec::new();
    for entry in manifests::to_prune(&inv.clone(), &desired) {
        let was_planned = planned
            .iter()
            .any(|c| c.object == entry && c.action == Action::Pruned);
        let api_version = if was_planned {
            api_version_of(kube, &entry).await?
        } else {
            None
        };
        let Some(api_version) = api_version else {
            // Not in the cluster: dropped from the inventory.
            inv.retain(|e| e != &entry);
            continue;
        };
        match kube.delete(&reference(&entry, api_version)).await {
            Ok(_) => {
                tracing::info!(object = %entry, "bootstrap manifest pruned");
                inv.retain(|e| e != &entry);
                changes.push(Change {
                    object: entry,
                    action: Action::Pruned,
                });
            }
            Err(e) => prune_errors.push(format!("{entry}: {e}")),
        }
    }
    let written = write_inventory(kube, &inv).await;
    if !prune_errors.is_empty() {
        return Err(ManifestError::Prune(prune_errors));
    }
    written?;
    Ok(changes)
}

impl Action {
    /// An apply that changed the object: created stays created, anything else configured.
    fn max_changed(self) -> Action {
        match self {
            Action::Created => Action::Created,
            _ => Action::Configured,
        }
    }
}

/// Waits until every Deployment, DaemonSet and StatefulSet of `objects` has rolled out,
/// the whole wait bounded by `timeout`.
pub async fn wait(kube: &Kube, objects: &[Value], timeout: Duration) -> Result<(), ManifestError> {
    let deadline = tokio::time::Instant::now() + timeout;
    for obj in objects {
        let Some(meta) = ObjMeta::of(obj) else {
            continue;
        };
        if !meta.is_workload() {
            continue;
        }
        let left = deadline.saturating_duration_since(tokio::time::Instant::now());
        let ns = if meta.namespace.is_empty() {
            "default"
        } else {
            meta.namespace.as_str()
        };
        let r = match meta.kind.as_str() {
            "Deployment" => kube.wait_deployment(ns, &meta.name, left).await,
            "DaemonSet" => kube.wait_daemonset(ns, &meta.name, left).await,
            _ => kube.wait_statefulset(ns, &meta.name, left).await,
        };
        r.map_err(|e| ManifestError::Kube(Box::new(e)))?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    //! The Kubernetes double's dry-run apply and Secret conversion, through talboot's own
    //! client, as the diff relies on them.

    use std::time::Duration;

    use serde_json::json;

    use crate::addons::kube::{Kube, client_from_kubeconfig};
    use crate::sim::kube::{DoubleOptions, KubeDouble};

    async fn session(double: &KubeDouble) -> Kube {
        crate::install_crypto_provider();
        let client = client_from_kubeconfig(double.kubeconfig().as_bytes())
            .await
            .unwrap();
        Kube::new(client, Duration::from_millis(10))
    }

    #[tokio::test]
    async fn the_double_folds_string_data_and_dry_runs_store_nothing() {
        let double = KubeDouble::start(DoubleOptions::default()).await.unwrap();
        let kube = session(&double).await;
        let secret = json!({"apiVersion": "v1", "kind": "Secret",
            "metadata": {"name": "bootstrap-token-abcdef", "namespace": "kube-system"},
            "type": "bootstrap.kubernetes.io/token",
            "data": {"token-id": "b2xk", "kept": "a2VwdA=="},
            "stringData": {"token-id": "abcdef", "token-secret": "0123456789abcdef"}});
        // A dry-run create: the would-be object, without a resourceVersion; nothing stored.
        let before = double.resource_versions();
        let dry = kube
            .dry_run_apply_as(&secret, "default", "talos")
            .await
            .unwrap()
            .expect("a dry-run answer");
        assert!(dry["metadata"].get("resourceVersion").is_none(), "{dry}");
        assert_eq!(dry["data"]["token-id"], "YWJjZGVm");
        assert_eq!(double.resource_versions(), before);
        assert!(double.applies().is_empty());
        assert!(
            double
                .object("v1", "Secret", "kube-system", "bootstrap-token-abcdef")
                .is_none()
        );
        // The apply stores stringData folded into data (it wins over data), never stringData.
        kube.apply_as(&secret, "default", "talos").await.unwrap();
        let live = double
            .object("v1", "Secret", "kube-system", "bootstrap-token-abcdef")
            .unwrap();
        assert!(live.get("stringData").is_none(), "{live}");
        assert_eq!(
            live["data"],
            json!({"token-id": "YWJjZGVm", "kept": "a2VwdA==",
                   "token-secret": "MDEyMzQ1Njc4OWFiY2RlZg=="})
        );
        // A dry-run update keeps the stored resourceVersion and changes nothing.
        let before = double.resource_versions();
        let mut changed = secret.clone();
        changed["stringData"]["token-secret"] = json!("rotated");
        let dry = kube
            .dry_run_apply_as(&changed, "default", "talos")
            .await
            .unwrap()
            .unwrap();
        assert_eq!(
            dry["metadata"]["resourceVersion"],
            live["metadata"]["resourceVersion"]
        );
        assert_eq!(dry["data"]["token-secret"], "cm90YXRlZA==");
        assert_eq!(double.resource_versions(), before);
        assert_eq!(double.applies().len(), 1);
        // A namespace that does not exist: not found, so "created".
        let mut elsewhere = secret.clone();
        elsewhere["metadata"]["namespace"] = json!("nowhere");
        assert!(
            kube.dry_run_apply_as(&elsewhere, "default", "talos")
                .await
                .unwrap()
                .is_none()
        );
        // A kind nobody serves: also "created" (its CRD comes with the set).
        let cr = json!({"apiVersion": "example.com/v1", "kind": "Widget",
            "metadata": {"name": "w"}});
        assert!(
            kube.dry_run_apply_as(&cr, "default", "talos")
                .await
                .unwrap()
                .is_none()
        );
        // Only dryRun=All is accepted.
        let req = axum::http::Request::patch(
            "/api/v1/namespaces/kube-system/secrets/x?fieldManager=talos&dryRun=Maybe",
        )
        .header("content-type", "application/apply-patch+yaml")
        .body(serde_json::to_vec(&secret).unwrap())
        .unwrap();
        match kube.client().request_text(req).await {
            Err(kube::Error::Api(s)) => {
                assert_eq!(s.code, 422);
                assert!(
                    s.message.contains("supported values: \"All\""),
                    "{}",
                    s.message
                );
            }
            other => panic!("{other:?}"),
        }
    }
}
