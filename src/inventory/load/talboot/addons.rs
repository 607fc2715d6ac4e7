//! The `addons` section of `talboot.yaml`: Cilium, Argo CD and where their charts come from.

use std::net::Ipv4Addr;
use std::path::Path;

use crate::inventory::diag::Diagnostics;
use crate::inventory::model::*;
use crate::inventory::read::{self, missing};
use crate::inventory::yaml::{MapReader, Node as Y, Value};

pub(super) fn addons(node: &Y, base: &Path, d: &mut Diagnostics) -> Addons {
    let mut out = Addons::default();
    let Some(mut r) = MapReader::new(node, "addons", d) else {
        return out;
    };
    if let Some(n) = r.get("cilium") {
        out.cilium = cilium(n, base, d);
    }
    if let Some(n) = r.get("argocd") {
        out.argocd = argocd(n, base, d);
    }
    r.finish(&["cilium", "argocd"], d);
    out
}

/// `addons.cilium`; left out when its version cannot be read.
fn cilium(n: &Y, base: &Path, d: &mut Diagnostics) -> Option<CiliumAddon> {
    let mut c = MapReader::new(n, "addons.cilium", d)?;
    let enabled = c
        .get("enabled")
        .and_then(|n| read::boolean(n, "addons.cilium.enabled", d))
        .unwrap_or(true);
    let version = match c.get("version") {
        Some(n) => read::version(n, "addons.cilium.version", d),
        None => {
            missing(
                d,
                c.loc(),
                "addons.cilium",
                "version",
                "the chart version, e.g. version: 1.18.0",
            );
            None
        }
    };
    let values = c
        .get("values")
        .map(|n| values(n, "addons.cilium.values", d))
        .unwrap_or(yaml_serde::Value::Mapping(Default::default()));
    let kpr = c
        .get("kubeProxyReplacement")
        .and_then(|n| read::boolean(n, "addons.cilium.kubeProxyReplacement", d))
        .unwrap_or(true);
    let chart = c
        .get("chart")
        .and_then(|n| chart_ref(n, "addons.cilium.chart", base, d));
    c.finish(
        &[
            "enabled",
            "version",
            "values",
            "kubeProxyReplacement",
            "chart",
        ],
        d,
    );
    Some(CiliumAddon {
        enabled,
        version: version?,
        values,
        kube_proxy_replacement: kpr,
        chart,
    })
}

/// `addons.argocd`; left out when its version cannot be read.
fn argocd(n: &Y, base: &Path, d: &mut Diagnostics) -> Option<ArgoCdAddon> {
    let mut a = MapReader::new(n, "addons.argocd", d)?;
    let enabled = a
        .get("enabled")
        .and_then(|n| read::boolean(n, "addons.argocd.enabled", d))
        .unwrap_or(true);
    let version = match a.get("version") {
        Some(n) => read::version(n, "addons.argocd.version", d),
        None => {
            missing(
                d,
                a.loc(),
                "addons.argocd",
                "version",
                "the argo-cd chart version, e.g. version: 10.1.1",
            );
            None
        }
    };
    let values = a
        .get("values")
        .map(|n| values(n, "addons.argocd.values", d))
        .unwrap_or(yaml_serde::Value::Mapping(Default::default()));
    let domain = a.get("domain").and_then(|n| {
        read::parsed(
            n,
            "addons.argocd.domain",
            d,
            "a DNS name",
            "argocd.lab.example.com",
            |s| {
                if is_dns_name(s) {
                    Ok(s.to_string())
                } else {
                    Err("not a DNS name")
                }
            },
        )
        .map(|s| s.value)
    });
    let ksops = a
        .get("ksops")
        .and_then(|n| read::boolean(n, "addons.argocd.ksops", d))
        .unwrap_or(false);
    let insecure = a
        .get("insecure")
        .and_then(|n| read::boolean(n, "addons.argocd.insecure", d))
        .unwrap_or(false);
    let root_app = a.get("rootApp").and_then(|n| root_app(n, d));
    let chart = a
        .get("chart")
        .and_then(|n| chart_ref(n, "addons.argocd.chart", base, d));
    a.finish(
        &[
            "enabled", "version", "values", "domain", "ksops", "insecure", "rootApp", "chart",
        ],
        d,
    );
    Some(ArgoCdAddon {
        enabled,
        version: version?,
        values,
        domain,
        ksops,
        insecure,
        root_app,
        chart,
    })
}

/// `addons.<name>.chart`: an `https://` (or `http://`) repository URL, an `oci://` chart
/// reference, or a local chart directory or `.tgz` relative to the inventory's folder. A
/// local chart that is not there (yet) is a warning: `talboot check` may run on another
/// machine than `serve`, and only `helm template` needs it.
fn chart_ref(n: &Y, path: &str, base: &Path, d: &mut Diagnostics) -> Option<ChartRef> {
    let s = read::string(n, path, d)?;
    let s = s.trim();
    let example = "write a chart repository URL (https://helm.cilium.io), an OCI reference \
                   (oci://quay.io/cilium/charts/cilium) or a local chart directory or .tgz";
    if s.is_empty() {
        d.error_hint(&n.loc, path, "the chart is empty", example);
        return None;
    }
    if let Some(rest) = s
        .strip_prefix("https://")
        .or_else(|| s.strip_prefix("http://"))
        .or_else(|| s.strip_prefix("oci://"))
    {
        let host = rest.split(['/', ':']).next().unwrap_or_default();
        if host.is_empty() || !is_dns_name(host) && host.parse::<Ipv4Addr>().is_err() {
            d.error_hint(
                &n.loc,
                path,
                format!("`{s}` has no valid host name"),
                example,
            );
            return None;
        }
        return Some(if s.starts_with("oci://") {
            ChartRef::Oci(s.to_owned())
        } else {
            ChartRef::Repo(s.to_owned())
        });
    }
    if s.contains("://") {
        d.error_hint(
            &n.loc,
            path,
            format!("`{s}` uses a scheme helm cannot fetch charts from"),
            example,
        );
        return None;
    }
    let p = read::relative_path(base, s);
    if !p.exists() {
        d.warning(
            &n.loc,
            path,
            format!("local chart {} does not exist", p.display()),
            Some("`helm template` needs it on the machine running `talboot serve`".into()),
        );
    }
    Some(ChartRef::Local(p))
}

fn values(n: &Y, path: &str, d: &mut Diagnostics) -> yaml_serde::Value {
    if !matches!(n.value, Value::Map(_)) {
        d.error(
            &n.loc,
            path,
            format!("Helm values must be a mapping, found {}", n.kind()),
        );
    }
    n.to_yaml()
}

fn root_app(n: &Y, d: &mut Diagnostics) -> Option<RootApp> {
    let path = "addons.argocd.rootApp";
    let mut r = MapReader::new(n, path, d)?;
    let field = |r: &mut MapReader<'_>, key: &str, hint: &str, d: &mut Diagnostics| match r.get(key)
    {
        Some(v) => read::string(v, &format!("{path}.{key}"), d),
        None => {
            missing(d, r.loc(), path, key, hint);
            None
        }
    };
    let repo_url = field(
        &mut r,
        "repoUrl",
        "e.g. repoUrl: https://git.example.com/infra.git",
        d,
    );
    let p = field(&mut r, "path", "e.g. path: clusters/lab", d);
    let revision = r
        .get("revision")
        .and_then(|v| read::string(v, &format!("{path}.revision"), d))
        .unwrap_or_else(|| "HEAD".into());
    r.finish(&["repoUrl", "path", "revision"], d);
    Some(RootApp {
        repo_url: repo_url?,
        path: p?,
        revision,
    })
}
