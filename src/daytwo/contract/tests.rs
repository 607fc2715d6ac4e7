//! Contract detection and choice from upstream facts (`docs/design/talos-v114-items-4-6.md`
//! §5a: the contract is only what the config contains), and resolution against Talos doubles
//! on 127.0.81.x (no other test uses it).

use super::*;
use crate::daytwo::diff;
use crate::daytwo::rollout::Role;
use crate::inventory::Inventory;
use crate::machineconfig::render::render_node_at;
use crate::talos::api::machine::apply_configuration_request::Mode;

fn rack_at(talos: &str) -> Inventory {
    let mut inv = crate::daytwo::upgrade::tests::rack().0.clone();
    inv.cluster.talos_version.value = talos.parse().unwrap();
    inv
}

fn render(inv: &Inventory, node: &str, contract: Contract) -> String {
    let secrets = &crate::daytwo::upgrade::tests::rack().1;
    render_node_at(inv, secrets, inv.node(node).unwrap(), contract)
        .unwrap()
        .to_yaml()
        .unwrap()
}

#[test]
fn every_rack_node_is_detected_at_the_contract_it_was_rendered_at() {
    let inv = rack_at("v1.14.0");
    for node in &inv.nodes {
        for c in Contract::ALL {
            let text = render(&inv, node.name.as_str(), c);
            assert_eq!(detect(&text), Ok(c), "{} at {c}", node.name.as_str());
        }
    }
}

#[test]
fn only_contract_documents_move_a_config_to_v1_14() {
    let inv = rack_at("v1.14.0");
    let v113 = render(&inv, "rack1-wk-01", Contract::V1_13);
    // v1.14 features an operator may add to a v1.13-shaped config on a v1.14 node.
    for kind in ["SysctlConfig", "FilesystemTrimConfig", "RAIDArrayConfig"] {
        let text = format!("{v113}---\napiVersion: v1alpha1\nkind: {kind}\nname: x\n");
        assert_eq!(detect(&text), Ok(Contract::V1_13), "{kind}");
    }
    // A new document wins over the legacy field, as Talos's accessors prefer it.
    for kind in ["KubeletConfig", "UnattendedInstallConfig"] {
        let text = format!("{v113}---\napiVersion: v1alpha1\nkind: {kind}\n");
        assert_eq!(detect(&text), Ok(Contract::V1_14), "{kind}");
    }
    assert_eq!(
        detect("apiVersion: v1alpha1\nkind: HostnameConfig\nauto: stable\n"),
        Err(DetectError::NoV1alpha1)
    );
    assert!(matches!(detect("machine: ["), Err(DetectError::Yaml(_))));
}

#[test]
fn the_v1_14_documents_are_unknown_to_talos_v1_13_and_known_to_v1_14() {
    use crate::machineconfig::schema::embedded_for;
    let v113: Vec<String> = embedded_for(Contract::V1_13)
        .kinds()
        .map(str::to_owned)
        .collect();
    let v114: Vec<String> = embedded_for(Contract::V1_14)
        .kinds()
        .map(str::to_owned)
        .collect();
    for kind in V1_14_DOCUMENTS {
        assert!(!v113.iter().any(|k| k == kind), "{kind} is a v1.13 kind");
        assert!(v114.iter().any(|k| k == kind), "{kind} is not a v1.14 kind");
    }
}

#[test]
fn contract_flag_values() {
    assert_eq!(parse_contract("v1.14"), Ok(Contract::V1_14));
    assert_eq!(parse_contract("1.13"), Ok(Contract::V1_13));
    assert_eq!(parse_contract("v1.14.2"), Ok(Contract::V1_14));
    for bad in ["v1.12", "2.14", "v1", "latest"] {
        assert!(parse_contract(bad).is_err(), "{bad}");
    }
    assert_eq!(
        parse_contract("v1.12").unwrap_err().to_string(),
        "\"v1.12\" is not a contract talboot renders; use v1.13 or v1.14"
    );
}

#[test]
fn a_contract_newer_than_the_node_s_talos_is_refused() {
    let err = check_runs(Contract::V1_14, "v1.13.9").unwrap_err();
    assert_eq!(
        err.to_string(),
        "refusing the v1.14 contract: the node runs Talos v1.13.9, which does not know the \
         v1.14 documents; upgrade it first (`talboot upgrade --talos`)"
    );
    assert_eq!(check_runs(Contract::V1_14, "v1.14.0"), Ok(()));
    assert_eq!(check_runs(Contract::V1_14, "v1.15.1"), Ok(()));
    assert_eq!(check_runs(Contract::V1_13, "v1.14.0"), Ok(()));
    assert!(matches!(
        check_runs(Contract::V1_13, "dev"),
        Err(ContractError::UnknownRunning { .. })
    ));
}

#[test]
fn the_running_contract_is_kept_and_a_flag_moves_it() {
    let inv = rack_at("v1.14.0");
    let v113 = render(&inv, "rack1-cp-01", Contract::V1_13);
    let running = ContractChoice::Running;
    assert_eq!(choose(running, &v113, "v1.14.0"), Ok(Contract::V1_13));
    let to = ContractChoice::At(Contract::V1_14);
    assert_eq!(choose(to, &v113, "v1.14.0"), Ok(Contract::V1_14));
    assert!(matches!(
        choose(to, &v113, "v1.13.9"),
        Err(ContractError::TooNew { .. })
    ));
}

/// The migration of a control plane, v1.13 -> v1.14 contract, as `plan --contract v1.14`
/// shows it (printed for the reader with `--nocapture`).
#[test]
fn the_migration_is_a_per_node_diff() {
    let inv = rack_at("v1.14.0");
    let (old, new) = (
        render(&inv, "rack1-cp-01", Contract::V1_13),
        render(&inv, "rack1-cp-01", Contract::V1_14),
    );
    let d = diff::diff(&old, &new).unwrap();
    let plan = super::super::plan::NodePlan {
        name: "rack1-cp-01".into(),
        role: Role::ControlPlane,
        diff: Ok(d),
        mode: Some(Mode::NoReboot),
        dry_run: None,
    };
    let text = super::super::plan::render(&[plan]);
    println!("{text}");
    for want in [
        "rack1-cp-01: ",
        "includes REMOVALS",
        "  + document v1alpha1/UnattendedInstallConfig (added)",
        "  + document v1alpha1/KubeletConfig (added)",
        "    - machine.install.disk: ",
    ] {
        assert!(text.contains(want), "{want}:\n{text}");
    }
    // Rendering at v1.13 with the inventory moved on changes only the installer tag.
    let before = render(&rack_at("v1.13.9"), "rack1-cp-01", Contract::V1_13);
    let d = diff::diff(&before, &old).unwrap();
    assert_eq!(d.len(), 1, "{d}");
    assert!(d.to_string().contains("~ machine.install.image: "), "{d}");
}

fn resolved(name: &str, contract: Contract, running: Contract) -> Resolved {
    Resolved {
        target: NodeTarget {
            name: name.into(),
            role: Role::Worker,
            addr: "127.0.0.1:1".parse().unwrap(),
            node_ip: "127.0.0.1".parse().unwrap(),
            rendered: String::new(),
        },
        resolution: Resolution::At { contract, running },
    }
}

#[test]
fn the_summary_names_the_nodes_kept_and_moved() {
    let all_new = [resolved("a", Contract::V1_14, Contract::V1_14)];
    assert!(summary(&all_new, Contract::V1_14, ContractChoice::Running).is_empty());
    let kept = [
        resolved("a", Contract::V1_13, Contract::V1_13),
        resolved("b", Contract::V1_13, Contract::V1_13),
        resolved("c", Contract::V1_14, Contract::V1_14),
    ];
    let s = summary(&kept, Contract::V1_14, ContractChoice::Running);
    assert_eq!(s.len(), 1, "{s:?}");
    assert!(
        s[0].starts_with("contract: a, b run v1.13-contract configs"),
        "{s:?}"
    );
    assert!(s[0].contains("`talboot plan --contract v1.14`"), "{s:?}");
    let moving = [
        resolved("a", Contract::V1_14, Contract::V1_13),
        resolved("c", Contract::V1_14, Contract::V1_14),
    ];
    let s = summary(
        &moving,
        Contract::V1_14,
        ContractChoice::At(Contract::V1_14),
    );
    assert_eq!(
        s,
        [
            "contract: a move from the contract of their running config to v1.14 \
          (--contract v1.14); shown above as each node's diff"
        ]
    );
}

/// Two Talos doubles (v1.13.9) running v1.13-contract configs rendered from an inventory
/// already at v1.14.0: with the running contract nothing changes; `--contract v1.14` is
/// refused on them, naming the node's Talos.
#[cfg(feature = "sim")]
#[tokio::test]
async fn resolution_against_talos_doubles() {
    use crate::sim::talos::{FakeCluster, FakeNodeConfig, FakeTalosNode, Phase};
    use crate::talos::TalosClient;
    crate::install_crypto_provider();
    let inv = rack_at("v1.14.0");
    let cluster = FakeCluster::new();
    let mut nodes = Vec::new();
    let mut targets = Vec::new();
    let mut renderings = Renderings::default();
    for c in Contract::ALL {
        let configs = ["rack1-cp-01", "rack1-wk-01"]
            .iter()
            .map(|n| ((*n).to_owned(), render(&inv, n, c)))
            .collect();
        renderings.insert(c, Ok(configs));
    }
    for (i, (name, role)) in [
        ("rack1-cp-01", Role::ControlPlane),
        ("rack1-wk-01", Role::Worker),
    ]
    .into_iter()
    .enumerate()
    {
        let ip = std::net::IpAddr::from([127, 0, 81, 1 + i as u8]);
        let node = FakeTalosNode::start(FakeNodeConfig::new(ip, name), &cluster)
            .await
            .unwrap();
        let config = render(&inv, name, Contract::V1_13);
        TalosClient::maintenance(node.addr())
            .unwrap()
            .apply_configuration(config.as_bytes())
            .await
            .unwrap();
        node.wait_phase(Phase::Secured).await.unwrap();
        targets.push(NodeTarget {
            name: name.into(),
            role,
            addr: node.addr(),
            node_ip: ip,
            // What a naive day two renders: the inventory's contract.
            rendered: render(&inv, name, Contract::V1_14),
        });
        nodes.push(node);
    }
    let conn = crate::daytwo::remote::connector(&crate::daytwo::upgrade::tests::creds(), &targets);

    let kept = resolve(&conn, &targets, &renderings, ContractChoice::Running).await;
    for r in &kept {
        assert!(
            matches!(
                r.resolution,
                Resolution::At {
                    contract: Contract::V1_13,
                    running: Contract::V1_13
                }
            ),
            "{r:?}"
        );
    }
    let plans = plan_resolved(&conn, &kept).await;
    assert_eq!(
        super::super::plan::render(&plans),
        "rack1-cp-01: no changes\nrack1-wk-01: no changes\n"
    );

    let moved = resolve(
        &conn,
        &targets,
        &renderings,
        ContractChoice::At(Contract::V1_14),
    )
    .await;
    let plans = plan_resolved(&conn, &moved).await;
    let text = super::super::plan::render(&plans);
    assert_eq!(super::super::plan::exit_code(&plans), 2, "{text}");
    assert!(
        text.contains(
            "rack1-wk-01: ERROR refusing the v1.14 contract: the node runs Talos v1.13.9"
        ),
        "{text}"
    );
    drop(nodes);
}
