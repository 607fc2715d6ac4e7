//! What the doubles' Kubernetes-side controllers (the bootstrap manifests, the simulated
//! kubelets and static pods) read from a node's running config, resolved the way Talos's
//! config container resolves it: the first document of a kind wins, and only without one
//! does the legacy v1alpha1 field count. A v1.13-contract config has no such documents, so
//! everything comes from v1alpha1 as before; a v1.14-contract config keeps these facts in
//! its `Kube*Config` documents, which is where `talboot upgrade --kubernetes` patches them.
//! Owns nothing: pure reads of the config text.
//!
//! Upstream (siderolabs/talos v1.14.0-rc.1):
//! - `pkg/machinery/config/container/container.go`: `K8sAPIServerConfig`,
//!   `K8sControllerManagerConfig`, `K8sSchedulerConfig`, `K8sProxyConfig`,
//!   `K8sKubeletConfig`, `K8sCoreDNSConfig`, `K8sNetworkConfig`: `findMatchingDocs` first,
//!   then `container.v1alpha1Config.K8s...()`.
//! - `pkg/machinery/config/types/k8s/{apiserver,controller_manager,scheduler,kubelet}.go`:
//!   `Image()` is the document's `image` as written (no default).
//! - `pkg/machinery/config/types/k8s/proxy.go`: `Enabled()` is true unless `enabled: false`;
//!   `Image()` as written.
//! - `pkg/machinery/config/types/k8s/coredns.go`: `Enabled()` is true unless `enabled:
//!   false`; `Image()` defaults to `constants.CoreDNSImage:DefaultCoreDNSVersion`
//!   (`registry.k8s.io/coredns/coredns:v1.14.6`, `pkg/machinery/constants/constants.go`).
//! - `pkg/machinery/config/types/k8s/network.go`: `dnsDomain` (default
//!   `constants.DefaultDNSDomain`, `cluster.local`), `serviceSubnets`.

use yaml_serde::Value;

/// The CoreDNS image Talos falls back to (v1.13.9 and v1.14.0-rc.1 alike).
pub(crate) const DEFAULT_COREDNS_IMAGE: &str = "registry.k8s.io/coredns/coredns:v1.14.6";

/// Every document of a config text (unreadable ones skipped, as the loader would refuse the
/// config before it ran).
fn documents(text: &str) -> Vec<Value> {
    yaml_serde::Deserializer::from_str(text)
        .filter_map(|d| <Value as serde::Deserialize>::deserialize(d).ok())
        .collect()
}

fn at<'a>(v: &'a Value, path: &[&str]) -> Option<&'a Value> {
    path.iter().try_fold(v, |cur, k| cur.get(*k))
}

/// A running config, read as Talos's container reads it.
pub(crate) struct ConfigView {
    docs: Vec<Value>,
}

/// Where one Kubernetes component's facts live: its v1.14 document kind and its v1alpha1
/// path.
struct Place {
    kind: &'static str,
    legacy: &'static [&'static str],
}

/// The component of a v1alpha1 `cluster` key (`apiServer`, ...) or `kubelet`.
fn place(component: &str) -> Option<Place> {
    let (kind, legacy): (&str, &[&str]) = match component {
        "apiServer" => ("KubeAPIServerConfig", &["cluster", "apiServer"]),
        "controllerManager" => (
            "KubeControllerManagerConfig",
            &["cluster", "controllerManager"],
        ),
        "scheduler" => ("KubeSchedulerConfig", &["cluster", "scheduler"]),
        "proxy" => ("KubeProxyConfig", &["cluster", "proxy"]),
        "coreDNS" => ("KubeCoreDNSConfig", &["cluster", "coreDNS"]),
        "kubelet" => ("KubeletConfig", &["machine", "kubelet"]),
        "network" => ("KubeNetworkConfig", &["cluster", "network"]),
        _ => return None,
    };
    Some(Place { kind, legacy })
}

impl ConfigView {
    pub(crate) fn new(text: &str) -> Self {
        Self {
            docs: documents(text),
        }
    }

    /// The v1alpha1 document, if the config has one.
    pub(crate) fn v1alpha1(&self) -> Option<&Value> {
        self.docs
            .iter()
            .find(|v| v.get("version").and_then(Value::as_str) == Some("v1alpha1"))
    }

    /// The first document of `kind` (`findMatchingDocs`' `[0]`).
    fn document(&self, kind: &str) -> Option<&Value> {
        self.docs
            .iter()
            .find(|v| v.get("kind").and_then(Value::as_str) == Some(kind))
    }

    /// The component's settings: its document, else the v1alpha1 section, and whether it
    /// came from the document.
    fn section(&self, component: &str) -> Option<(&Value, bool)> {
        let p = place(component)?;
        if let Some(d) = self.document(p.kind) {
            return Some((d, true));
        }
        self.v1alpha1()
            .and_then(|v| at(v, p.legacy))
            .map(|s| (s, false))
    }

    /// The image a component runs (`apiServer`, `controllerManager`, `scheduler`, `proxy`,
    /// `kubelet`), as written in the config.
    pub(crate) fn image(&self, component: &str) -> Option<String> {
        let (s, _) = self.section(component)?;
        s.get("image").and_then(Value::as_str).map(str::to_owned)
    }

    /// Whether kube-proxy or CoreDNS (`proxy`, `coreDNS`) is on: a document's `enabled`, a
    /// v1alpha1 section's `disabled`; on when neither says otherwise.
    pub(crate) fn enabled(&self, component: &str) -> bool {
        match self.section(component) {
            Some((s, true)) => s.get("enabled").and_then(Value::as_bool) != Some(false),
            Some((s, false)) => s.get("disabled").and_then(Value::as_bool) != Some(true),
            None => true,
        }
    }

    /// CoreDNS's image, with Talos's default.
    pub(crate) fn core_dns_image(&self) -> String {
        self.image("coreDNS")
            .filter(|i| !i.is_empty())
            .unwrap_or_else(|| DEFAULT_COREDNS_IMAGE.to_owned())
    }

    /// The cluster's DNS domain, with Talos's default.
    pub(crate) fn dns_domain(&self) -> String {
        self.section("network")
            .and_then(|(s, _)| s.get("dnsDomain").and_then(Value::as_str))
            .filter(|d| !d.is_empty())
            .unwrap_or("cluster.local")
            .to_owned()
    }

    /// The first service subnet, if the config names one.
    pub(crate) fn first_service_subnet(&self) -> Option<String> {
        self.section("network")
            .and_then(|(s, _)| s.get("serviceSubnets"))
            .and_then(|s| s.get(0))
            .and_then(Value::as_str)
            .map(str::to_owned)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const LEGACY: &str = "version: v1alpha1\nmachine:\n  kubelet:\n    image: k/kubelet:v1.36.3\n\
cluster:\n  apiServer:\n    image: k/apiserver:v1.36.3\n  proxy:\n    disabled: true\n    \
image: k/proxy:v1.36.3\n  network:\n    dnsDomain: rack.local\n    serviceSubnets: [10.96.0.0/12]\n";

    const DOCUMENTS: &str = "version: v1alpha1\nmachine:\n  type: controlplane\n---\n\
apiVersion: v1alpha1\nkind: KubeletConfig\nimage: k/kubelet:v1.37.0\n---\n\
apiVersion: v1alpha1\nkind: KubeAPIServerConfig\nimage: k/apiserver:v1.37.0\n---\n\
apiVersion: v1alpha1\nkind: KubeProxyConfig\nenabled: false\nimage: k/proxy:v1.37.0\n---\n\
apiVersion: v1alpha1\nkind: KubeCoreDNSConfig\nenabled: true\n---\n\
apiVersion: v1alpha1\nkind: KubeNetworkConfig\ndnsDomain: dc.local\nserviceSubnets: [10.100.0.0/16]\n";

    #[test]
    fn a_v1_13_contract_config_is_read_from_v1alpha1() {
        let v = ConfigView::new(LEGACY);
        assert_eq!(v.image("kubelet").as_deref(), Some("k/kubelet:v1.36.3"));
        assert_eq!(v.image("apiServer").as_deref(), Some("k/apiserver:v1.36.3"));
        assert_eq!(v.image("scheduler"), None);
        assert!(!v.enabled("proxy"));
        assert!(v.enabled("coreDNS"));
        assert_eq!(v.core_dns_image(), DEFAULT_COREDNS_IMAGE);
        assert_eq!(v.dns_domain(), "rack.local");
        assert_eq!(v.first_service_subnet().as_deref(), Some("10.96.0.0/12"));
    }

    #[test]
    fn a_v1_14_contract_config_is_read_from_its_documents() {
        let v = ConfigView::new(DOCUMENTS);
        assert_eq!(v.image("kubelet").as_deref(), Some("k/kubelet:v1.37.0"));
        assert_eq!(v.image("apiServer").as_deref(), Some("k/apiserver:v1.37.0"));
        assert!(!v.enabled("proxy"));
        assert!(v.enabled("coreDNS"));
        assert_eq!(v.core_dns_image(), DEFAULT_COREDNS_IMAGE);
        assert_eq!(v.dns_domain(), "dc.local");
        assert_eq!(v.first_service_subnet().as_deref(), Some("10.100.0.0/16"));
    }

    #[test]
    fn the_document_wins_over_a_legacy_field() {
        // The loader refuses most such mixes (`V1Alpha1ConflictValidate`); where one gets
        // through, `findMatchingDocs` is asked first.
        let both = format!(
            "{LEGACY}---\napiVersion: v1alpha1\nkind: KubeletConfig\nimage: k/kubelet:v9\n"
        );
        assert_eq!(
            ConfigView::new(&both).image("kubelet").as_deref(),
            Some("k/kubelet:v9")
        );
        let v = ConfigView::new(
            "version: v1alpha1\n---\napiVersion: v1alpha1\nkind: KubeProxyConfig\nimage: p\n",
        );
        assert!(v.enabled("proxy"), "enabled unless `enabled: false`");
    }
}
