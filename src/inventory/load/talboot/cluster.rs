//! The `cluster` section of `talboot.yaml`: identity, versions, subnets, secrets and the
//! installer image.

use std::path::Path;

use crate::inventory::diag::Diagnostics;
use crate::inventory::model::*;
use crate::inventory::parts::{DEFAULT_FACTORY_URL, DEFAULT_POD_SUBNET, DEFAULT_SERVICE_SUBNET};
use crate::inventory::read::{self, missing};
use crate::inventory::yaml::{MapReader, Node as Y, Value};

const CLUSTER: &[&str] = &[
    "name",
    "talosVersion",
    "kubernetesVersion",
    "endpoint",
    "vip",
    "podSubnets",
    "serviceSubnets",
    "dnsDomain",
    "allowSchedulingOnControlPlanes",
    "secrets",
    "patches",
    "installer",
];

pub(super) fn cluster(node: &Y, base: &Path, d: &mut Diagnostics) -> Option<Cluster> {
    let mut r = MapReader::new(node, "cluster", d)?;
    let p = |k: &str| format!("cluster.{k}");
    let (name, talos_version, kubernetes_version, endpoint) = identity(&mut r, d);
    let vip = r.get("vip").and_then(|n| read::ipv4(n, &p("vip"), d));
    let subnets =
        |r: &mut MapReader<'_>, key: &str, default: &str, d: &mut Diagnostics| match r.get(key) {
            Some(n) => read::list(n, &p(key), d, true, |n, p, d| {
                read::ipv4_subnet(n, p, d).map(|s| s.value)
            }),
            None => vec![default.parse().expect("default subnet parses")],
        };
    let pod_subnets = subnets(&mut r, "podSubnets", DEFAULT_POD_SUBNET, d);
    let service_subnets = subnets(&mut r, "serviceSubnets", DEFAULT_SERVICE_SUBNET, d);
    let dns_domain = dns_domain(&mut r, d);
    let allow_sched = r
        .get("allowSchedulingOnControlPlanes")
        .map(|n| read::boolean(n, &p("allowSchedulingOnControlPlanes"), d).unwrap_or(false))
        .unwrap_or(false);
    let secrets = match r.get("secrets") {
        Some(n) => secrets(n, base, d),
        None => Some(Secrets {
            file: base.join("secrets.age"),
            age_recipients: Vec::new(),
        }),
    };
    let patches = r
        .get("patches")
        .map(|n| read::patches(n, &p("patches"), base, d))
        .unwrap_or_default();
    let installer = match r.get("installer") {
        Some(n) => installer(n, d),
        None => Some(Installer {
            schematic: None,
            image: None,
            factory_url: DEFAULT_FACTORY_URL.into(),
        }),
    };
    r.finish(CLUSTER, d);
    Some(Cluster {
        name: name?,
        talos_version: talos_version?,
        kubernetes_version: kubernetes_version?,
        endpoint: endpoint?,
        vip,
        pod_subnets,
        service_subnets,
        dns_domain: dns_domain?,
        allow_scheduling_on_control_planes: allow_sched,
        secrets: secrets?,
        patches,
        installer: installer?,
        external_cni: false,
    })
}

/// Name, Talos version, Kubernetes version and endpoint; each `None` when missing or
/// unreadable (already reported).
type Identity = (
    Option<Spanned<String>>,
    Option<Spanned<Version>>,
    Option<Spanned<Version>>,
    Option<Spanned<Endpoint>>,
);

/// The fields that name the cluster and its versions, all required, read in this order.
fn identity(r: &mut MapReader<'_>, d: &mut Diagnostics) -> Identity {
    let p = |k: &str| format!("cluster.{k}");
    let loc = r.loc().clone();
    let name = match r.get("name") {
        Some(n) => read::hostname(n, &p("name"), d),
        None => {
            missing(d, &loc, "cluster", "name", "e.g. name: homelab");
            None
        }
    };
    let talos_version = match r.get("talosVersion") {
        Some(n) => read::version(n, &p("talosVersion"), d),
        None => {
            missing(
                d,
                &loc,
                "cluster",
                "talosVersion",
                "e.g. talosVersion: v1.13.9",
            );
            None
        }
    };
    let kubernetes_version = match r.get("kubernetesVersion") {
        Some(n) => read::version(n, &p("kubernetesVersion"), d),
        None => {
            missing(
                d,
                &loc,
                "cluster",
                "kubernetesVersion",
                "e.g. kubernetesVersion: 1.36.3",
            );
            None
        }
    };
    let endpoint = match r.get("endpoint") {
        Some(n) => read::parsed(
            n,
            &p("endpoint"),
            d,
            "an https endpoint",
            "https://10.0.40.101:6443",
            Endpoint::parse,
        ),
        None => {
            missing(
                d,
                &loc,
                "cluster",
                "endpoint",
                "e.g. endpoint: https://10.0.40.101:6443",
            );
            None
        }
    };
    (name, talos_version, kubernetes_version, endpoint)
}

/// `cluster.dnsDomain`, `cluster.local` when not written.
fn dns_domain(r: &mut MapReader<'_>, d: &mut Diagnostics) -> Option<String> {
    let p = |k: &str| format!("cluster.{k}");
    match r.get("dnsDomain") {
        Some(n) => read::parsed(
            n,
            &p("dnsDomain"),
            d,
            "a DNS domain",
            "cluster.local",
            |s| {
                if is_dns_name(s) {
                    Ok(s.to_string())
                } else {
                    Err("not a DNS name")
                }
            },
        )
        .map(|s| s.value),
        None => Some("cluster.local".into()),
    }
}

fn secrets(node: &Y, base: &Path, d: &mut Diagnostics) -> Option<Secrets> {
    if let Value::Str(s) = &node.value {
        return Some(Secrets {
            file: base.join(s),
            age_recipients: Vec::new(),
        });
    }
    let mut r = MapReader::new(node, "cluster.secrets", d)?;
    let file = match r.get("file") {
        Some(n) => read::string(n, "cluster.secrets.file", d).map(|s| base.join(s)),
        None => {
            missing(
                d,
                r.loc(),
                "cluster.secrets",
                "file",
                "e.g. file: secrets.age",
            );
            None
        }
    };
    let age_recipients = r
        .get("ageRecipients")
        .map(|n| {
            read::list(n, "cluster.secrets.ageRecipients", d, true, |n, p, d| {
                read::parsed(n, p, d, "an age recipient", "age1…", |s| {
                    if s.starts_with("age1") && s.len() > 10 {
                        Ok(s.to_string())
                    } else {
                        Err("age recipients start with age1")
                    }
                })
                .map(|s| s.value)
            })
        })
        .unwrap_or_default();
    r.finish(&["file", "ageRecipients"], d);
    Some(Secrets {
        file: file?,
        age_recipients,
    })
}

fn installer(node: &Y, d: &mut Diagnostics) -> Option<Installer> {
    let mut r = MapReader::new(node, "cluster.installer", d)?;
    let schematic = r.get("schematic").and_then(|n| {
        read::parsed(
            n,
            "cluster.installer.schematic",
            d,
            "an Image Factory schematic ID (64 hex digits)",
            VANILLA_SCHEMATIC,
            |s| {
                if s.len() == 64 && s.bytes().all(|b| b.is_ascii_hexdigit()) {
                    Ok(s.to_ascii_lowercase())
                } else {
                    Err("expected 64 hex digits")
                }
            },
        )
        .map(|s| s.value)
    });
    let image = r
        .get("image")
        .and_then(|n| read::string(n, "cluster.installer.image", d));
    if let Some(img) = &image
        && img
            .rsplit('/')
            .next()
            .is_some_and(|last| last.contains(':'))
    {
        d.error_hint(
            &node.loc,
            "cluster.installer.image",
            format!("`{img}` has a tag"),
            "write the image without a tag; talboot appends the cluster's talosVersion",
        );
    }
    let factory_url = match r.get("factoryUrl") {
        Some(n) => read::parsed(
            n,
            "cluster.installer.factoryUrl",
            d,
            "an http(s) URL",
            DEFAULT_FACTORY_URL,
            |s| {
                if s.starts_with("https://") || s.starts_with("http://") {
                    Ok(s.trim_end_matches('/').to_string())
                } else {
                    Err("must start with https:// or http://")
                }
            },
        )
        .map(|s| s.value),
        None => Some(DEFAULT_FACTORY_URL.into()),
    };
    r.finish(&["schematic", "image", "factoryUrl"], d);
    Some(Installer {
        schematic,
        image,
        factory_url: factory_url?,
    })
}
