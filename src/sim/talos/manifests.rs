//! The bootstrap manifests in the Talos double: the `Manifests.kubernetes.talos.dev` COSI
//! resources (namespace `controlplane`) a control plane node renders from its running machine
//! config, served over COSI Get and List, so that `talboot upgrade --kubernetes`' manifest
//! sync reads what a real node would hand `talosctl upgrade-k8s`. Owns nothing: every call
//! renders from the running config the node has now (so a no-reboot config patch shows at
//! once, as Talos's controllers re-render on every config change).
//!
//! Which config fields are read, a v1.14 document before its legacy v1alpha1 field, is
//! [`super::config_view`]'s (v1.14.0-rc.1's `container.go` and
//! `controllers/k8s/control_plane.go` `ControlPlaneBootstrapManifestsController`: CoreDNS and
//! kube-proxy from `K8sCoreDNSConfig()`/`K8sProxyConfig()`, the domain and service CIDRs from
//! `K8sNetworkConfig()`).
//!
//! Upstream (siderolabs/talos v1.13.9):
//! - `pkg/machinery/resources/k8s/manifest.go`: `ManifestType`, default namespace
//!   `controlplane`, no `Sensitivity` (non-sensitive: `internal/app/resources/access.go`
//!   admits every role that may read resources at all, os:reader included); spec
//!   `ManifestSpec { repeated SingleManifest items = 1 }`, each `SingleManifest { Struct
//!   object = 1 }` (`api/resource/definitions/k8s/k8s.proto`).
//! - `internal/app/machined/pkg/controllers/k8s/control_plane.go`
//!   (`BootstrapManifestsConfig`, on control planes only): `ProxyEnabled`/`ProxyImage` from
//!   `cluster.proxy`, `CoreDNSEnabled`/`CoreDNSImage` from `cluster.coreDNS`, the DNS service
//!   IP (the 10th address of the first service subnet, `DNSServiceIPs`), the DNS domain;
//!   defaults from `pkg/machinery/constants/constants.go` (`KubeProxyImage` with
//!   `DefaultKubernetesVersion` 1.36.3, `CoreDNSImage` with `DefaultCoreDNSVersion` v1.14.6,
//!   `DefaultDNSDomain`).
//! - `internal/app/machined/pkg/controllers/k8s/manifest.go` (`ManifestController.render`):
//!   which resource holds which objects, by ID; kube-proxy only when enabled, CoreDNS only
//!   when enabled.
//! - `internal/app/machined/pkg/controllers/k8s/internal/k8stemplates/*.go`: names, namespaces
//!   and the fields that matter for a sync (images, selectors, role references).
//!
//! Deliberately narrower: the objects carry the fields above, not every field of the
//! templates (args, volumes, probes); `13-talos-service-account-crd` and flannel (`cni: none`
//! on talboot's racks) are not rendered. `00-kubelet-bootstrapping-token` is, from
//! `cluster.token` (`<id>.<secret>`, `secrets/root.go`: `Token().ID()`), with `stringData` as
//! the template sets it (`k8stemplates/kubelet.go`, `KubeletBootstrapTokenSecret`).

use serde_json::{Value, json};
use tonic::Status;

use super::Shared;
use super::config_view::ConfigView;
use crate::daytwo::manifests::{MANIFEST_NAMESPACE, MANIFEST_TYPE, json_to_struct};
use crate::talos::api::cosi::resource as cosi;
use crate::talos::api::talos::resource::definitions::k8s::{ManifestSpec, SingleManifest};

fn at<'a>(v: &'a yaml_serde::Value, path: &[&str]) -> Option<&'a yaml_serde::Value> {
    path.iter().try_fold(v, |cur, k| cur.get(*k))
}

fn string_at(v: &yaml_serde::Value, path: &[&str]) -> Option<String> {
    at(v, path).and_then(|v| v.as_str()).map(str::to_owned)
}

/// The 10th address of an IPv4 subnet (`DNSServiceIPs`: the first service subnet's base
/// plus 10).
fn dns_ip(subnet: &str) -> String {
    let base = subnet.split('/').next().unwrap_or("10.96.0.0");
    match base.parse::<std::net::Ipv4Addr>() {
        Ok(ip) => std::net::Ipv4Addr::from(u32::from(ip).wrapping_add(10)).to_string(),
        Err(_) => "10.96.0.10".into(),
    }
}

fn binding(name: &str, role: &str, subjects: Value) -> Value {
    json!({"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRoleBinding",
        "metadata": {"name": name},
        "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": role},
        "subjects": subjects})
}

fn group(name: &str) -> Value {
    json!({"apiGroup": "rbac.authorization.k8s.io", "kind": "Group", "name": name})
}

/// The manifests a node with running config `text` and machine type `machine_type` renders:
/// (resource ID, objects), sorted by ID as COSI lists them. Empty on a worker. CoreDNS,
/// kube-proxy and the network come from their v1.14 documents where the config has them
/// ([`super::config_view`]), else from v1alpha1.
pub(crate) fn render(text: &str, machine_type: &str) -> Vec<(String, Vec<Value>)> {
    if machine_type != "controlplane" && machine_type != "init" {
        return Vec::new();
    }
    let view = ConfigView::new(text);
    let Some(cfg) = view.v1alpha1() else {
        return Vec::new();
    };
    let mut out = fixed_manifests();
    if view.enabled("coreDNS") {
        out.extend(core_dns(&view));
    }
    if view.enabled("proxy") {
        out.push(kube_proxy(&view));
    }
    out.extend(bootstrap_token(cfg));
    out.sort_by(|a, b| a.0.cmp(&b.0));
    out
}

/// The manifests every control plane renders whatever its config: the CSR approval and node
/// RBAC bindings, and the in-cluster kubeconfig.
fn fixed_manifests() -> Vec<(String, Vec<Value>)> {
    vec![
        (
            "01-csr-approver-role-binding".into(),
            vec![binding(
                "system-bootstrap-approve-node-client-csr",
                "system:certificates.k8s.io:certificatesigningrequests:nodeclient",
                json!([group("system:bootstrappers:nodes")]),
            )],
        ),
        (
            "01-csr-node-bootstrap".into(),
            vec![binding(
                "system-bootstrap-node-bootstrapper",
                "system:node-bootstrapper",
                json!([group("system:bootstrappers:nodes"), group("system:nodes")]),
            )],
        ),
        (
            "01-csr-renewal-role-binding".into(),
            vec![binding(
                "system-bootstrap-node-renewal",
                "system:certificates.k8s.io:certificatesigningrequests:selfnodeclient",
                json!([group("system:nodes")]),
            )],
        ),
        (
            "11-kube-config-in-cluster".into(),
            vec![json!({"apiVersion": "v1", "kind": "ConfigMap",
            "metadata": {"name": "kubeconfig-in-cluster", "namespace": "kube-system"},
            "data": {"kubeconfig": "apiVersion: v1\nkind: Config\nclusters:\n- name: local\n  cluster:\n    server: https://localhost:6443\n    certificate-authority: /var/run/secrets/kubernetes.io/serviceaccount/ca.crt\n"}})],
        ),
        (
            "11-talos-node-rbac-template".into(),
            vec![
                binding(
                    "system:talos-nodes",
                    "system:talos-nodes",
                    json!([group("system:nodes")]),
                ),
                json!({"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRole",
                "metadata": {"name": "system:talos-nodes"},
                "rules": [{"apiGroups": [""], "resources": ["nodes"],
                           "verbs": ["get", "list", "watch"]}]}),
            ],
        ),
    ]
}

/// `11-core-dns` and `11-core-dns-svc`, from CoreDNS's image, the DNS domain and the first
/// service subnet.
fn core_dns(view: &ConfigView) -> [(String, Vec<Value>); 2] {
    let image = view.core_dns_image();
    let domain = view.dns_domain();
    let subnet = view
        .first_service_subnet()
        .unwrap_or_else(|| "10.96.0.0/12".to_owned());
    let labels = json!({"k8s-app": "kube-dns"});
    [
        (
            "11-core-dns".into(),
            vec![
                json!({"apiVersion": "v1", "kind": "ServiceAccount",
                "metadata": {"name": "coredns", "namespace": "kube-system"}}),
                json!({"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRole",
                "metadata": {"name": "system:coredns"},
                "rules": [{"apiGroups": [""],
                           "resources": ["endpoints", "services", "pods", "namespaces"],
                           "verbs": ["list", "watch"]}]}),
                binding(
                    "system:coredns",
                    "system:coredns",
                    json!([{"kind": "ServiceAccount", "name": "coredns",
                        "namespace": "kube-system"}]),
                ),
                json!({"apiVersion": "v1", "kind": "ConfigMap",
                "metadata": {"name": "coredns", "namespace": "kube-system"},
                "data": {"Corefile": format!(
                    ".:53 {{\n    errors\n    health\n    ready\n    kubernetes {domain} in-addr.arpa ip6.arpa\n    forward . /etc/resolv.conf\n    cache 30\n}}\n")}}),
                json!({"apiVersion": "apps/v1", "kind": "Deployment",
                "metadata": {"name": "coredns", "namespace": "kube-system",
                             "labels": labels.clone()},
                "spec": {"replicas": 2, "selector": {"matchLabels": labels.clone()},
                    "template": {"metadata": {"labels": labels.clone()},
                        "spec": {"serviceAccountName": "coredns",
                            "containers": [{"name": "coredns", "image": image}]}}}}),
            ],
        ),
        (
            "11-core-dns-svc".into(),
            vec![json!({"apiVersion": "v1", "kind": "Service",
            "metadata": {"name": "kube-dns", "namespace": "kube-system",
                         "labels": labels.clone()},
            "spec": {"selector": labels, "clusterIP": dns_ip(&subnet),
                "ports": [{"name": "dns", "port": 53, "protocol": "UDP"},
                          {"name": "dns-tcp", "port": 53, "protocol": "TCP"}]}})],
        ),
    ]
}

/// `10-kube-proxy`, from kube-proxy's image.
fn kube_proxy(view: &ConfigView) -> (String, Vec<Value>) {
    let image = view
        .image("proxy")
        .unwrap_or_else(|| "registry.k8s.io/kube-proxy:v1.36.3".into());
    let labels = json!({"tier": "node", "k8s-app": "kube-proxy"});
    (
        "10-kube-proxy".into(),
        vec![
            json!({"apiVersion": "apps/v1", "kind": "DaemonSet",
                "metadata": {"name": "kube-proxy", "namespace": "kube-system",
                             "labels": labels.clone()},
                "spec": {"selector": {"matchLabels": labels.clone()},
                    "updateStrategy": {"type": "RollingUpdate",
                                       "rollingUpdate": {"maxUnavailable": 1}},
                    "template": {"metadata": {"labels": labels},
                        "spec": {"hostNetwork": true, "serviceAccountName": "kube-proxy",
                            "priorityClassName": "system-cluster-critical",
                            "containers": [{"name": "kube-proxy", "image": image,
                                "command": ["/usr/local/bin/kube-proxy"]}]}}}}),
            json!({"apiVersion": "v1", "kind": "ServiceAccount",
                "metadata": {"name": "kube-proxy", "namespace": "kube-system"}}),
            binding(
                "kube-proxy",
                "system:node-proxier",
                json!([{"kind": "ServiceAccount", "name": "kube-proxy",
                        "namespace": "kube-system"}]),
            ),
        ],
    )
}

/// `00-kubelet-bootstrapping-token` (k8stemplates/kubelet.go, KubeletBootstrapTokenSecret):
/// the bootstrap token as `stringData`, which the API server stores as `data` and never
/// returns (issue 31 item 5: a diff against the template alone never matches). None without
/// a `cluster.token` of the form `<id>.<secret>`.
fn bootstrap_token(cfg: &yaml_serde::Value) -> Option<(String, Vec<Value>)> {
    let token = string_at(cfg, &["cluster", "token"])?;
    let (id, secret) = token.split_once('.')?;
    Some((
        "00-kubelet-bootstrapping-token".into(),
        vec![json!({"apiVersion": "v1", "kind": "Secret",
                "metadata": {"name": format!("bootstrap-token-{id}"), "namespace": "kube-system"},
                "type": "bootstrap.kubernetes.io/token",
                "stringData": {"token-id": id, "token-secret": secret,
                    "usage-bootstrap-authentication": "true",
                    "auth-extra-groups": "system:bootstrappers:nodes"}})],
    ))
}

fn resource(id: &str, objects: &[Value]) -> cosi::Resource {
    let spec = ManifestSpec {
        items: objects
            .iter()
            .map(|o| SingleManifest {
                object: json_to_struct(o),
            })
            .collect(),
    };
    let yaml = objects
        .iter()
        .map(|o| yaml_serde::to_string(o).unwrap_or_default())
        .collect::<Vec<_>>()
        .join("---\n");
    super::resource(
        MANIFEST_NAMESPACE,
        MANIFEST_TYPE,
        id,
        prost::Message::encode_to_vec(&spec),
        yaml,
    )
}

fn current(shared: &Shared) -> Vec<(String, Vec<Value>)> {
    super::machine_config::running_and_type(shared)
        .map(|(text, t)| render(&text, &t))
        .unwrap_or_default()
}

/// COSI Get of one manifest; None for any other resource type.
pub(crate) fn cosi_get(
    shared: &Shared,
    r: &cosi::GetRequest,
) -> Option<Result<cosi::GetResponse, Status>> {
    if (r.namespace.as_str(), r.r#type.as_str()) != (MANIFEST_NAMESPACE, MANIFEST_TYPE) {
        return None;
    }
    Some(
        match current(shared).into_iter().find(|(id, _)| *id == r.id) {
            Some((id, objects)) => Ok(cosi::GetResponse {
                resource: Some(resource(&id, &objects)),
            }),
            None => Err(Status::not_found(format!(
                "resource {}({}/{}@undefined) doesn't exist",
                r.r#type, r.namespace, r.id
            ))),
        },
    )
}

/// COSI List of the manifests, by ID; None for any other resource type.
pub(crate) fn cosi_list(shared: &Shared, r: &cosi::ListRequest) -> Option<Vec<cosi::Resource>> {
    if (r.namespace.as_str(), r.r#type.as_str()) != (MANIFEST_NAMESPACE, MANIFEST_TYPE) {
        return None;
    }
    Some(
        current(shared)
            .iter()
            .map(|(id, objects)| resource(id, objects))
            .collect(),
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    const CP: &str = "version: v1alpha1\nmachine:\n  type: controlplane\ncluster:\n  proxy:\n    \
                      image: registry.k8s.io/kube-proxy:v1.36.4\n  network:\n    \
                      serviceSubnets: [10.100.0.0/16]\n";

    fn ids(text: &str, t: &str) -> Vec<String> {
        render(text, t).into_iter().map(|(id, _)| id).collect()
    }

    #[test]
    fn a_control_plane_renders_from_its_config_and_a_worker_renders_nothing() {
        let m = render(CP, "controlplane");
        let proxy = &m.iter().find(|(id, _)| id == "10-kube-proxy").unwrap().1[0];
        assert_eq!(
            proxy["spec"]["template"]["spec"]["containers"][0]["image"],
            "registry.k8s.io/kube-proxy:v1.36.4"
        );
        let svc = &m.iter().find(|(id, _)| id == "11-core-dns-svc").unwrap().1[0];
        assert_eq!(svc["spec"]["clusterIP"], "10.100.0.10");
        let dns = &m.iter().find(|(id, _)| id == "11-core-dns").unwrap().1[4];
        assert_eq!(
            dns["spec"]["template"]["spec"]["containers"][0]["image"],
            "registry.k8s.io/coredns/coredns:v1.14.6"
        );
        let sorted = ids(CP, "controlplane");
        let mut want = sorted.clone();
        want.sort();
        assert_eq!(sorted, want);
        assert!(ids(CP, "worker").is_empty());
        // With a cluster token, the bootstrap token Secret, as stringData.
        let with_token = CP.replace("cluster:\n", "cluster:\n  token: abcdef.0123456789abcdef\n");
        let m = render(&with_token, "controlplane");
        let (id, objs) = &m[0];
        assert_eq!(id, "00-kubelet-bootstrapping-token");
        assert_eq!(objs[0]["metadata"]["name"], "bootstrap-token-abcdef");
        assert_eq!(objs[0]["stringData"]["token-secret"], "0123456789abcdef");
        assert!(objs[0].get("data").is_none());
    }

    #[test]
    fn disabled_components_are_not_rendered() {
        let off = CP.replace(
            "  proxy:\n",
            "  coreDNS:\n    disabled: true\n  proxy:\n    disabled: true\n",
        );
        let ids = ids(&off, "controlplane");
        assert!(
            !ids.iter()
                .any(|i| i.contains("kube-proxy") || i.contains("core-dns"))
        );
        assert!(ids.contains(&"11-talos-node-rbac-template".to_owned()));
    }
}
