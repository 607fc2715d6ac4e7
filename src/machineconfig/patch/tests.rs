//! The patch engine against the rule table, case by case, and its error messages.

use yaml_serde::Value;

use super::*;
use crate::inventory::PatchBody;

fn bundle(text: &str) -> ConfigBundle {
    ConfigBundle::parse(text).unwrap_or_else(|e| panic!("test YAML must parse: {e}\n{text}"))
}

fn patch(text: &str) -> PatchBody {
    parse_patch(text).unwrap_or_else(|e| panic!("test patch must parse: {e}\n{text}"))
}

/// One row of the rule table: `patches` applied in order to `base` give `expected`
/// (compared as YAML values, so key order does not matter but list order does).
struct Case {
    name: &'static str,
    base: &'static str,
    patches: &'static [&'static str],
    expected: &'static str,
}

const CP: &str = "version: v1alpha1
machine:
  type: controlplane
  token: t0ken
  certSANs: [10.0.0.1]
  install:
    disk: /dev/sda
    wipe: true
  features:
    kubePrism: {enabled: true, port: 7445}
  network:
    hostname: old
    nameservers: [1.1.1.1]
  nodeLabels:
    node.kubernetes.io/exclude-from-external-load-balancers: \"\"
cluster:
  clusterName: lab
  network:
    dnsDomain: cluster.local
    podSubnets: [10.244.0.0/16]
    serviceSubnets: [10.96.0.0/12]
  apiServer:
    certSANs: [api.lab]
    admissionControl:
      - name: PodSecurity
        configuration: {defaults: {enforce: baseline}}
    auditPolicy:
      apiVersion: audit.k8s.io/v1
      kind: Policy
      rules: [{level: Metadata}]
---
apiVersion: v1alpha1
kind: HostnameConfig
auto: stable
";

const CASES: &[Case] = &[
        Case {
            name: "maps merge key by key",
            base: "version: v1alpha1
machine:
  kubelet: {image: k:1, extraArgs: {a: '1'}}
",
            patches: &["machine:
  kubelet: {extraArgs: {b: '2'}}
  nodeLabels: {rack: r1}
"],
            expected: "version: v1alpha1
machine:
  kubelet: {image: k:1, extraArgs: {a: '1', b: '2'}}
  nodeLabels: {rack: r1}
",
        },
        Case {
            name: "scalar override",
            base: "version: v1alpha1
machine: {install: {disk: /dev/sda, image: i:1}}
",
            patches: &["machine: {install: {disk: /dev/nvme0n1}}"],
            expected: "version: v1alpha1
machine: {install: {disk: /dev/nvme0n1, image: i:1}}
",
        },
        Case {
            name: "false always wins",
            base: "version: v1alpha1
machine: {install: {wipe: true}, features: {kubePrism: {enabled: true, port: 7445}}}
cluster: {proxy: {disabled: true}}
",
            patches: &["machine: {install: {wipe: false}, features: {kubePrism: {enabled: false}}}
cluster: {proxy: {disabled: false}}
"],
            expected: "version: v1alpha1
machine: {install: {wipe: false}, features: {kubePrism: {enabled: false, port: 7445}}}
cluster: {proxy: {disabled: false}}
",
        },
        Case {
            name: "empty string, zero and null keep the old value; absent keys still get them",
            base: "version: v1alpha1
machine: {install: {disk: /dev/sda}, features: {kubePrism: {port: 7445}}, network: {hostname: n1}}
",
            patches: &["machine:
  install: {disk: ''}
  features: {kubePrism: {port: 0}}
  network: {hostname: null}
  nodeLabels: {empty: ''}
"],
            expected: "version: v1alpha1
machine:
  install: {disk: /dev/sda}
  features: {kubePrism: {port: 7445}}
  network: {hostname: n1}
  nodeLabels: {empty: ''}
",
        },
        Case {
            name: "lists append, including nameservers, certSANs and extraKernelArgs",
            base: "version: v1alpha1
machine:
  certSANs: [10.0.0.1]
  network: {nameservers: [1.1.1.1]}
  install: {extraKernelArgs: [console=ttyS0]}
cluster: {apiServer: {certSANs: [api.lab]}}
",
            patches: &["machine:
  certSANs: [10.0.0.2]
  network: {nameservers: [9.9.9.9]}
  install: {extraKernelArgs: [net.ifnames=0]}
cluster: {apiServer: {certSANs: [vip.lab]}}
"],
            expected: "version: v1alpha1
machine:
  certSANs: [10.0.0.1, 10.0.0.2]
  network: {nameservers: [1.1.1.1, 9.9.9.9]}
  install: {extraKernelArgs: [console=ttyS0, net.ifnames=0]}
cluster: {apiServer: {certSANs: [api.lab, vip.lab]}}
",
        },
        Case {
            name: "merge:replace paths replace the list or mapping wholesale",
            base: CP,
            patches: &["cluster:
  network: {podSubnets: [10.200.0.0/16], serviceSubnets: []}
  apiServer:
    auditPolicy: {apiVersion: audit.k8s.io/v1, kind: Policy, rules: [{level: None}]}
"],
            expected: "version: v1alpha1
machine:
  type: controlplane
  token: t0ken
  certSANs: [10.0.0.1]
  install: {disk: /dev/sda, wipe: true}
  features: {kubePrism: {enabled: true, port: 7445}}
  network: {hostname: old, nameservers: [1.1.1.1]}
  nodeLabels: {node.kubernetes.io/exclude-from-external-load-balancers: ''}
cluster:
  clusterName: lab
  network: {dnsDomain: cluster.local, podSubnets: [10.200.0.0/16], serviceSubnets: []}
  apiServer:
    certSANs: [api.lab]
    admissionControl: [{name: PodSecurity, configuration: {defaults: {enforce: baseline}}}]
    auditPolicy: {apiVersion: audit.k8s.io/v1, kind: Policy, rules: [{level: None}]}
---
apiVersion: v1alpha1
kind: HostnameConfig
auto: stable
",
        },
        Case {
            name: "interfaces merge by `interface`",
            base: "version: v1alpha1
machine:
  network:
    interfaces:
      - {interface: eth0, dhcp: true, addresses: [10.0.0.5/24]}
      - {interface: eth1, dhcp: false}
",
            patches: &["machine:
  network:
    interfaces:
      - {interface: eth0, mtu: 9000, addresses: [10.0.1.5/24]}
      - {interface: eth2, dhcp: true}
"],
            expected: "version: v1alpha1
machine:
  network:
    interfaces:
      - {interface: eth0, dhcp: true, addresses: [10.0.0.5/24, 10.0.1.5/24], mtu: 9000}
      - {interface: eth1, dhcp: false}
      - {interface: eth2, dhcp: true}
",
        },
        Case {
            name: "interfaces merge by equal deviceSelector",
            base: "version: v1alpha1
machine:
  network:
    interfaces:
      - {deviceSelector: {hardwareAddr: '52:54:00:aa:bb:01', driver: virtio_net}, dhcp: true}
",
            patches: &["machine:
  network:
    interfaces:
      - deviceSelector: {driver: virtio_net, hardwareAddr: '52:54:00:aa:bb:01'}
        vip: {ip: 10.0.0.50}
      - {deviceSelector: {hardwareAddr: '52:54:00:aa:bb:02'}, dhcp: true}
"],
            expected: "version: v1alpha1
machine:
  network:
    interfaces:
      - deviceSelector: {hardwareAddr: '52:54:00:aa:bb:01', driver: virtio_net}
        dhcp: true
        vip: {ip: 10.0.0.50}
      - {deviceSelector: {hardwareAddr: '52:54:00:aa:bb:02'}, dhcp: true}
",
        },
        Case {
            name: "vlans merge by vlanId inside a merged interface",
            base: "version: v1alpha1
machine:
  network:
    interfaces:
      - interface: bond0
        vlans: [{vlanId: 10, dhcp: true}, {vlanId: 20, addresses: [10.20.0.2/24]}]
",
            patches: &["machine:
  network:
    interfaces:
      - interface: bond0
        vlans: [{vlanId: 20, mtu: 1400}, {vlanId: 30, dhcp: true}]
"],
            expected: "version: v1alpha1
machine:
  network:
    interfaces:
      - interface: bond0
        vlans:
          - {vlanId: 10, dhcp: true}
          - {vlanId: 20, addresses: [10.20.0.2/24], mtu: 1400}
          - {vlanId: 30, dhcp: true}
",
        },
        Case {
            name: "keyed list given where the config has none still merges its own duplicates",
            base: "version: v1alpha1
machine: {}
",
            patches: &["machine:
  network:
    interfaces: [{interface: eth0, dhcp: true}, {interface: eth0, mtu: 1500}]
"],
            expected: "version: v1alpha1
machine:
  network:
    interfaces: [{interface: eth0, dhcp: true, mtu: 1500}]
",
        },
        Case {
            name: "admission plugins merge by name",
            base: CP,
            patches: &["cluster:
  apiServer:
    admissionControl:
      - {name: PodSecurity, configuration: {defaults: {audit: restricted}}}
      - {name: EventRateLimit, configuration: {kind: Configuration}}
"],
            expected: "version: v1alpha1
machine:
  type: controlplane
  token: t0ken
  certSANs: [10.0.0.1]
  install: {disk: /dev/sda, wipe: true}
  features: {kubePrism: {enabled: true, port: 7445}}
  network: {hostname: old, nameservers: [1.1.1.1]}
  nodeLabels: {node.kubernetes.io/exclude-from-external-load-balancers: ''}
cluster:
  clusterName: lab
  network: {dnsDomain: cluster.local, podSubnets: [10.244.0.0/16], serviceSubnets: [10.96.0.0/12]}
  apiServer:
    certSANs: [api.lab]
    admissionControl:
      - {name: PodSecurity, configuration: {defaults: {enforce: baseline, audit: restricted}}}
      - {name: EventRateLimit, configuration: {kind: Configuration}}
    auditPolicy: {apiVersion: audit.k8s.io/v1, kind: Policy, rules: [{level: Metadata}]}
---
apiVersion: v1alpha1
kind: HostnameConfig
auto: stable
",
        },
        Case {
            name: "extension service config files merge by mountPath",
            base: "apiVersion: v1alpha1
kind: ExtensionServiceConfig
name: nut-client
configFiles: [{content: old, mountPath: /etc/a}, {content: b, mountPath: /etc/b}]
environment: [A=1]
",
            patches: &["apiVersion: v1alpha1
kind: ExtensionServiceConfig
name: nut-client
configFiles: [{content: new, mountPath: /etc/a}, {content: c, mountPath: /etc/c}]
environment: [B=2]
"],
            expected: "apiVersion: v1alpha1
kind: ExtensionServiceConfig
name: nut-client
configFiles: [{content: new, mountPath: /etc/a}, {content: b, mountPath: /etc/b}, {content: c, mountPath: /etc/c}]
environment: [A=1, B=2]
",
        },
        Case {
            name: "$patch: delete removes a key, and the emptied parents stay untouched",
            base: "version: v1alpha1
machine:
  network: {hostname: old, nameservers: [1.1.1.1]}
  nodeLabels: {node.kubernetes.io/exclude-from-external-load-balancers: '', rack: r1}
",
            patches: &["machine:
  network:
    hostname: {$patch: delete}
  nodeLabels:
    node.kubernetes.io/exclude-from-external-load-balancers: {$patch: delete}
"],
            expected: "version: v1alpha1
machine:
  network: {nameservers: [1.1.1.1]}
  nodeLabels: {rack: r1}
",
        },
        Case {
            name: "$patch: delete removes a list element, then the rest of the patch re-adds it",
            base: "version: v1alpha1
machine:
  network:
    interfaces: [{interface: eth0, dhcp: true}, {interface: eth1, addresses: [10.3.5.4/32]}]
",
            patches: &["machine:
  network:
    interfaces:
      - {interface: eth0, $patch: delete}
      - {interface: eth1, addresses: [10.3.5.5/32]}
      - {interface: eth0, dummy: true}
"],
            expected: "version: v1alpha1
machine:
  network:
    interfaces:
      - {interface: eth1, addresses: [10.3.5.4/32, 10.3.5.5/32]}
      - {interface: eth0, dummy: true}
",
        },
        Case {
            name: "$patch: delete removes a whole typed document, named or not",
            base: "version: v1alpha1
machine: {type: worker}
---
apiVersion: v1alpha1
kind: HostnameConfig
auto: stable
---
apiVersion: v1alpha1
kind: VolumeConfig
name: EPHEMERAL
mount: {secure: true}
---
apiVersion: v1alpha1
kind: VolumeConfig
name: IMAGECACHE
provisioning: {maxSize: 10GiB}
",
            patches: &["apiVersion: v1alpha1
kind: HostnameConfig
$patch: delete
---
apiVersion: v1alpha1
kind: VolumeConfig
name: EPHEMERAL
$patch: delete
"],
            expected: "version: v1alpha1
machine: {type: worker}
---
apiVersion: v1alpha1
kind: VolumeConfig
name: IMAGECACHE
provisioning: {maxSize: 10GiB}
",
        },
        Case {
            name: "a UserVolumeConfig is added as a new document",
            base: "version: v1alpha1
machine: {type: worker}
---
apiVersion: v1alpha1
kind: HostnameConfig
auto: stable
",
            patches: &["apiVersion: v1alpha1
kind: UserVolumeConfig
name: data
provisioning:
  diskSelector: {match: '!system_disk'}
  minSize: 100GiB
filesystem: {type: xfs}
"],
            expected: "version: v1alpha1
machine: {type: worker}
---
apiVersion: v1alpha1
kind: HostnameConfig
auto: stable
---
apiVersion: v1alpha1
kind: UserVolumeConfig
name: data
provisioning:
  diskSelector: {match: '!system_disk'}
  minSize: 100GiB
filesystem: {type: xfs}
",
        },
        Case {
            name: "VolumeConfig EPHEMERAL maxSize merges into the existing document of that name",
            base: "version: v1alpha1
machine: {type: worker}
---
apiVersion: v1alpha1
kind: VolumeConfig
name: IMAGECACHE
provisioning: {maxSize: 10GiB}
---
apiVersion: v1alpha1
kind: VolumeConfig
name: EPHEMERAL
mount: {secure: true}
",
            patches: &["apiVersion: v1alpha1
kind: VolumeConfig
name: EPHEMERAL
provisioning:
  maxSize: 50GiB
"],
            expected: "version: v1alpha1
machine: {type: worker}
---
apiVersion: v1alpha1
kind: VolumeConfig
name: IMAGECACHE
provisioning: {maxSize: 10GiB}
---
apiVersion: v1alpha1
kind: VolumeConfig
name: EPHEMERAL
mount: {secure: true}
provisioning: {maxSize: 50GiB}
",
        },
        Case {
            name: "one patch, several documents: each goes to its own target",
            base: "version: v1alpha1
machine: {type: worker}
---
apiVersion: v1alpha1
kind: LinkConfig
name: eth0
mtu: 1500
---
apiVersion: v1alpha1
kind: LinkConfig
name: eth1
mtu: 1500
",
            patches: &["machine: {install: {disk: /dev/vda}}
---
apiVersion: v1alpha1
kind: LinkConfig
name: eth1
mtu: 9000
addresses: [{address: 10.9.0.2/24}]
"],
            expected: "version: v1alpha1
machine: {type: worker, install: {disk: /dev/vda}}
---
apiVersion: v1alpha1
kind: LinkConfig
name: eth0
mtu: 1500
---
apiVersion: v1alpha1
kind: LinkConfig
name: eth1
mtu: 9000
addresses: [{address: 10.9.0.2/24}]
",
        },
        Case {
            name: "a v1alpha1 fragment on a config without one becomes the first document",
            base: "apiVersion: v1alpha1
kind: HostnameConfig
auto: stable
",
            patches: &["machine: {type: worker}"],
            expected: "version: v1alpha1
machine: {type: worker}
---
apiVersion: v1alpha1
kind: HostnameConfig
auto: stable
",
        },
        Case {
            name: "v1.14 extraArgs (meta.Args) replace each argument, lists included",
            base: "apiVersion: v1alpha1
kind: KubeAPIServerConfig
image: registry.k8s.io/kube-apiserver:v1.35.0
extraArgs:
  feature-gates: A=true
  admission-plugins: [NodeRestriction, PodSecurity]
",
            patches: &["apiVersion: v1alpha1
kind: KubeAPIServerConfig
extraArgs:
  admission-plugins: [EventRateLimit]
  audit-log-maxage: '30'
"],
            expected: "apiVersion: v1alpha1
kind: KubeAPIServerConfig
image: registry.k8s.io/kube-apiserver:v1.35.0
extraArgs:
  feature-gates: A=true
  admission-plugins: [EventRateLimit]
  audit-log-maxage: '30'
",
        },
        Case {
            name: "v1.14 KubeNetworkConfig subnets are replaced",
            base: "apiVersion: v1alpha1
kind: KubeNetworkConfig
dnsDomain: cluster.local
podSubnets: [10.244.0.0/16]
serviceSubnets: [10.96.0.0/12]
",
            patches: &["apiVersion: v1alpha1
kind: KubeNetworkConfig
podSubnets: [10.42.0.0/16]
"],
            expected: "apiVersion: v1alpha1
kind: KubeNetworkConfig
dnsDomain: cluster.local
podSubnets: [10.42.0.0/16]
serviceSubnets: [10.96.0.0/12]
",
        },
        Case {
            name: "common, then role, then node: the later patch wins",
            base: CP,
            patches: &[
                "machine: {install: {disk: /dev/sdb}, network: {hostname: common}, nodeLabels: {tier: common}}",
                "machine: {install: {disk: /dev/nvme0n1}, nodeLabels: {tier: role}}",
                "machine: {network: {hostname: cp1}}\n---\napiVersion: v1alpha1\nkind: HostnameConfig\nauto: 'off'\nhostname: cp1\n",
            ],
            expected: "version: v1alpha1
machine:
  type: controlplane
  token: t0ken
  certSANs: [10.0.0.1]
  install: {disk: /dev/nvme0n1, wipe: true}
  features: {kubePrism: {enabled: true, port: 7445}}
  network: {hostname: cp1, nameservers: [1.1.1.1]}
  nodeLabels: {node.kubernetes.io/exclude-from-external-load-balancers: '', tier: role}
cluster:
  clusterName: lab
  network: {dnsDomain: cluster.local, podSubnets: [10.244.0.0/16], serviceSubnets: [10.96.0.0/12]}
  apiServer:
    certSANs: [api.lab]
    admissionControl: [{name: PodSecurity, configuration: {defaults: {enforce: baseline}}}]
    auditPolicy: {apiVersion: audit.k8s.io/v1, kind: Policy, rules: [{level: Metadata}]}
---
apiVersion: v1alpha1
kind: HostnameConfig
auto: 'off'
hostname: cp1
",
        },
        Case {
            name: "JSON patch add, replace and remove on the v1alpha1 document of a multi-doc config",
            base: CP,
            patches: &["- {op: add, path: /machine/network/interfaces, value: [{interface: eth0, dhcp: true}]}
- {op: replace, path: /machine/install/disk, value: /dev/vda}
- {op: remove, path: /machine/nodeLabels}
- {op: test, path: /cluster/clusterName, value: lab}
- {op: add, path: /machine/certSANs/-, value: 10.0.0.9}
"],
            expected: "version: v1alpha1
machine:
  type: controlplane
  token: t0ken
  certSANs: [10.0.0.1, 10.0.0.9]
  install: {disk: /dev/vda, wipe: true}
  features: {kubePrism: {enabled: true, port: 7445}}
  network: {hostname: old, nameservers: [1.1.1.1], interfaces: [{interface: eth0, dhcp: true}]}
cluster:
  clusterName: lab
  network: {dnsDomain: cluster.local, podSubnets: [10.244.0.0/16], serviceSubnets: [10.96.0.0/12]}
  apiServer:
    certSANs: [api.lab]
    admissionControl: [{name: PodSecurity, configuration: {defaults: {enforce: baseline}}}]
    auditPolicy: {apiVersion: audit.k8s.io/v1, kind: Policy, rules: [{level: Metadata}]}
---
apiVersion: v1alpha1
kind: HostnameConfig
auto: stable
",
        },
    ];

#[test]
fn patch_rule_table() {
    for case in CASES {
        let mut got = bundle(case.base);
        let patches: Vec<PatchBody> = case.patches.iter().map(|p| patch(p)).collect();
        apply_all(&mut got, &patches).unwrap_or_else(|e| panic!("case `{}`: {e}", case.name));
        let want = bundle(case.expected);
        assert_eq!(
            got.docs,
            want.docs,
            "case `{}` produced:\n{}",
            case.name,
            got.to_yaml().expect("emit")
        );
    }
}

/// A patch that must fail: which patch, and a check on the problem.
struct Bad {
    name: &'static str,
    base: &'static str,
    patches: &'static [&'static str],
    index: usize,
    check: fn(&PatchProblem) -> bool,
    message: &'static str,
}

const BAD: &[Bad] = &[
    Bad {
        name: "mapping patched with a list",
        base: CP,
        patches: &["machine: {network: [1.1.1.1]}"],
        index: 0,
        check: |p| matches!(p, PatchProblem::TypeMismatch { path, base: "mapping", patch: "list", .. } if path == "machine.network"),
        message: "at `machine.network`: the config has a mapping but the patch has a list",
    },
    Bad {
        name: "scalar patched with a mapping",
        base: CP,
        patches: &["machine: {install: {disk: {path: /dev/sda}}}"],
        index: 0,
        check: |p| {
            matches!(
                p,
                PatchProblem::TypeMismatch {
                    base: "string",
                    patch: "mapping",
                    ..
                }
            )
        },
        message: "machine.install.disk",
    },
    Bad {
        name: "delete of a key that is not there",
        base: CP,
        patches: &["machine: {kubelet: {extraArgs: {$patch: delete}}}"],
        index: 0,
        check: |p| matches!(p, PatchProblem::NothingToDelete { path, .. } if path == "machine.kubelet.extraArgs"),
        message: "`machine.kubelet` is not in the config",
    },
    Bad {
        name: "delete of a list element that is not there",
        base: CP,
        patches: &["cluster: {apiServer: {admissionControl: [{name: Nope, $patch: delete}]}}"],
        index: 0,
        check: |p| matches!(p, PatchProblem::NothingToDelete { .. }),
        message: "no element of `cluster.apiServer.admissionControl` has `name: Nope`",
    },
    Bad {
        name: "delete of an inner key of a list element",
        base: CP,
        patches: &["machine: {network: {interfaces: [{interface: eth0, mtu: {$patch: delete}}]}}"],
        index: 0,
        check: |p| matches!(p, PatchProblem::DeleteInsideListElement { path, .. } if path == "machine.network.interfaces[0].mtu"),
        message: "cannot delete a key inside a list element",
    },
    Bad {
        name: "delete of an element in a nested list",
        base: CP,
        patches: &[
            "machine: {network: {interfaces: [{interface: eth0, vlans: [{vlanId: 5, $patch: delete}]}]}}",
        ],
        index: 0,
        check: |p| matches!(p, PatchProblem::DeleteInNestedList { .. }),
        message: "nested in another list",
    },
    Bad {
        name: "element delete without a selector",
        base: CP,
        patches: &["cluster: {apiServer: {admissionControl: [{$patch: delete}]}}"],
        index: 0,
        check: |p| matches!(p, PatchProblem::DeleteWithoutSelector { .. }),
        message: "needs one other scalar",
    },
    Bad {
        name: "the v1alpha1 document cannot be deleted",
        base: CP,
        patches: &["version: v1alpha1\n$patch: delete\n"],
        index: 0,
        check: |p| matches!(p, PatchProblem::DeleteV1Alpha1),
        message: "cannot be deleted",
    },
    Bad {
        name: "deleting a document that is not there",
        base: CP,
        patches: &["apiVersion: v1alpha1\nkind: VolumeConfig\nname: EPHEMERAL\n$patch: delete\n"],
        index: 0,
        check: |p| matches!(p, PatchProblem::DocumentToDeleteMissing { .. }),
        message: "the VolumeConfig document `EPHEMERAL` is not in the config",
    },
    Bad {
        name: "only `$patch: delete` exists",
        base: CP,
        patches: &["cluster: {network: {podSubnets: {$patch: replace}}}"],
        index: 0,
        check: |p| matches!(p, PatchProblem::UnsupportedDirective { value, .. } if value == "replace"),
        message: "`$patch: replace` is not supported",
    },
    Bad {
        name: "one patch touching one document twice",
        base: CP,
        patches: &[
            "apiVersion: v1alpha1\nkind: HostnameConfig\nauto: 'off'\n---\napiVersion: v1alpha1\nkind: HostnameConfig\nhostname: x\n",
        ],
        index: 0,
        check: |p| {
            matches!(
                p,
                PatchProblem::DuplicateDocument {
                    first: 0,
                    second: 1,
                    ..
                }
            )
        },
        message: "both patch the HostnameConfig document",
    },
    Bad {
        name: "typed patch document without apiVersion",
        base: CP,
        patches: &["kind: UserVolumeConfig\nname: data\n"],
        index: 0,
        check: |p| matches!(p, PatchProblem::MissingApiVersion { doc: 0, .. }),
        message: "add `apiVersion: v1alpha1`",
    },
    Bad {
        name: "keyed list element that is not a mapping",
        base: CP,
        patches: &["machine: {network: {interfaces: [eth0]}}"],
        index: 0,
        check: |p| matches!(p, PatchProblem::KeyedElementNotMapping { .. }),
        message: "must be mappings",
    },
    Bad {
        name: "JSON test failure names the patch and the operation",
        base: CP,
        patches: &[
            "machine: {install: {disk: /dev/vda}}",
            "- {op: replace, path: /machine/network/hostname, value: n1}\n- {op: test, path: /machine/install/disk, value: /dev/sda}\n",
        ],
        index: 1,
        check: |p| matches!(p, PatchProblem::JsonFailed { op: 1, name: "test", path, .. } if path == "/machine/install/disk"),
        message: "patches[1]: JSON patch operations[1] (`test` at `/machine/install/disk`) failed: value did not match",
    },
    Bad {
        name: "JSON remove of a missing path",
        base: CP,
        patches: &["- {op: remove, path: /machine/kubelet}"],
        index: 0,
        check: |p| {
            matches!(
                p,
                PatchProblem::JsonFailed {
                    op: 0,
                    name: "remove",
                    ..
                }
            )
        },
        message: "path is invalid",
    },
    Bad {
        name: "JSON operation that is not RFC 6902",
        base: CP,
        patches: &["- {op: add, path: /a, value: 1}\n- {op: merge, path: /machine}\n"],
        index: 0,
        check: |p| matches!(p, PatchProblem::JsonBadOperation { op: 1, .. }),
        message: "`op: merge` is not an RFC 6902 operation",
    },
    Bad {
        name: "JSON operation missing its value",
        base: CP,
        patches: &["- {op: replace, path: /machine/type}"],
        index: 0,
        check: |p| matches!(p, PatchProblem::JsonBadOperation { op: 0, .. }),
        message: "`replace` needs `value`",
    },
    Bad {
        name: "JSON path that is not a pointer",
        base: CP,
        patches: &["- {op: remove, path: machine.type}"],
        index: 0,
        check: |p| matches!(p, PatchProblem::JsonBadOperation { op: 0, .. }),
        message: "must be a JSON pointer",
    },
    Bad {
        name: "JSON patch on a config without a v1alpha1 document",
        base: "apiVersion: v1alpha1\nkind: HostnameConfig\nauto: stable\n",
        patches: &["- {op: add, path: /machine, value: {}}"],
        index: 0,
        check: |p| matches!(p, PatchProblem::JsonWithoutV1Alpha1),
        message: "has none",
    },
];

#[test]
fn bad_patches_are_refused_and_leave_the_config_alone() {
    for case in BAD {
        let mut got = bundle(case.base);
        let before = got.clone();
        let patches: Vec<PatchBody> = case.patches.iter().map(|p| patch(p)).collect();
        let err = match apply_all(&mut got, &patches) {
            Ok(()) => panic!("case `{}` applied but must fail", case.name),
            Err(e) => e,
        };
        assert_eq!(err.index, case.index, "case `{}`: {err}", case.name);
        assert!(
            (case.check)(&err.problem),
            "case `{}`: unexpected problem {err}",
            case.name
        );
        let text = err.to_string();
        assert!(
            text.contains(case.message),
            "case `{}`: message `{text}` lacks `{}`",
            case.name,
            case.message
        );
        assert_eq!(
            got, before,
            "case `{}` changed the config despite failing",
            case.name
        );
    }
}

#[test]
fn errors_never_quote_config_values() {
    let mut b = bundle(CP);
    let err =
        apply(&mut b, &patch("machine: {token: [not, a, scalar]}")).expect_err("shape mismatch");
    assert!(!err.to_string().contains("t0ken"), "{err}");
    assert!(
        !format!("{b:?}").contains("t0ken"),
        "Debug must not show values: {b:?}"
    );
    assert!(format!("{b:?}").contains("the HostnameConfig document"));
}

#[test]
fn single_apply_reports_index_zero() {
    let mut b = bundle(CP);
    let err = apply(&mut b, &patch("- {op: remove, path: /nope}")).expect_err("missing path");
    assert_eq!(err.index, 0);
    assert!(err.to_string().starts_with("patches[0]: "), "{err}");
}

#[test]
fn patch_detection_follows_talosctl() {
    assert!(
        matches!(patch("- {op: remove, path: /machine/network}"), PatchBody::Json(ops) if ops.len() == 1)
    );
    assert!(
        matches!(patch("machine: {}\n---\napiVersion: v1alpha1\nkind: HostnameConfig\nauto: stable\n"), PatchBody::Merge(d) if d.len() == 2)
    );
    assert!(matches!(patch("---\nmachine: {}\n---\n"), PatchBody::Merge(d) if d.len() == 1));
}

#[test]
fn round_trip_parse_emit_parse() {
    let multiline = "version: v1alpha1
machine:
  type: controlplane
  files:
    - content: |
        line one
        line two
      path: /var/etc/x
      permissions: 0o644
      op: create
cluster:
  inlineManifests:
    - name: cilium
      contents: \"---\\napiVersion: v1\\nkind: Namespace\\n\"
";
    // Block scalars with an indentation indicator and with kept trailing lines, tags,
    // nested and empty containers.
    let awkward = "version: v1alpha1
machine:
  files:
    - content: \"  leading spaces\\nx\\n\"
      op: create
  nested: [[a, b], [], {}, [{k: v}], !t {a: 1}, !t [1], !t x]
  keep: \"a\\n\\n\"
  quoted: ['', 'true', '0o644', 'a: b', '- x', '#c', \"tab\\there\"]
";
    for text in [CP, multiline, awkward] {
        let first = bundle(text);
        let emitted = first.to_yaml().expect("emit");
        let second = bundle(&emitted);
        assert_eq!(first, second, "round trip changed the config:\n{emitted}");
        assert_eq!(
            emitted,
            second.to_yaml().expect("emit"),
            "emission is not stable"
        );
    }
    let emitted = bundle(CP).to_yaml().expect("emit");
    assert!(
        emitted.starts_with("version: v1alpha1\nmachine:\n  type: controlplane\n"),
        "{emitted}"
    );
    assert!(
        emitted.contains("\n---\napiVersion: v1alpha1\nkind: HostnameConfig\n"),
        "{emitted}"
    );
    // Key order is preserved as written.
    let machine = emitted.find("machine:").expect("machine");
    let cluster = emitted.find("cluster:").expect("cluster");
    assert!(machine < cluster);
}

#[test]
fn bundle_parse_checks_document_identity() {
    let dup = "version: v1alpha1\nmachine: {}\n---\nversion: v1alpha1\ncluster: {}\n";
    assert!(matches!(
        ConfigBundle::parse(dup),
        Err(BundleError::Duplicate {
            first: 0,
            second: 1,
            id: DocId::V1Alpha1
        })
    ));
    let dup_named = "apiVersion: v1alpha1\nkind: LinkConfig\nname: eth0\n---\napiVersion: v1alpha1\nkind: LinkConfig\nname: eth0\n";
    assert!(matches!(
        ConfigBundle::parse(dup_named),
        Err(BundleError::Duplicate { .. })
    ));
    let distinct = "apiVersion: v1alpha1\nkind: LinkConfig\nname: eth0\n---\napiVersion: v1alpha1\nkind: LinkConfig\nname: eth1\n";
    assert_eq!(
        ConfigBundle::parse(distinct).expect("two links").docs.len(),
        2
    );
    assert!(matches!(
        ConfigBundle::parse("machine: {}\n"),
        Err(BundleError::Unidentified { doc: 0 })
    ));
    assert!(matches!(
        ConfigBundle::parse("kind: HostnameConfig\n"),
        Err(BundleError::MissingApiVersion { .. })
    ));
    assert!(matches!(
        ConfigBundle::parse("- a\n"),
        Err(BundleError::NotMapping { found: "list", .. })
    ));
    assert!(matches!(
        ConfigBundle::parse("a: [\n"),
        Err(BundleError::Yaml { doc: 0, .. })
    ));
}

#[test]
fn lookups_find_documents_by_identity() {
    let b = bundle(CP);
    assert_eq!(
        b.v1alpha1()
            .and_then(|d| d.get("machine"))
            .and_then(|m| m.get("type")),
        Some(&Value::from("controlplane"))
    );
    assert!(b.typed("HostnameConfig", None).is_some());
    assert!(b.typed("HostnameConfig", Some("x")).is_none());
    assert!(b.typed("VolumeConfig", Some("EPHEMERAL")).is_none());
}
