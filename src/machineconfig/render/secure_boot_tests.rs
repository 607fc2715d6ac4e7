//! Issue 27 item 2: a `secureBoot: true` node installs with the Image Factory's
//! `metal-installer-secureboot/<schematic>:<version>`, in both contracts; other nodes keep
//! `metal-installer` (their v1.13 output is pinned byte for byte by
//! `tests::v1_13_output_is_unchanged_byte_for_byte`).

use super::tests::{fixture_secrets, load};
use super::*;
use crate::inventory::Spanned;

fn secure(inv: &mut Inventory, node: &str) {
    let n = inv.nodes.iter_mut().find(|n| n.name.value == node).unwrap();
    n.secure_boot = Some(Spanned::new(true, n.name.loc.clone()));
}

fn installer_of(bundle: &ConfigBundle, v114: bool) -> String {
    let v = if v114 {
        bundle
            .typed("UnattendedInstallConfig", None)
            .and_then(|d| lookup(d, &["installer", "image"]))
    } else {
        lookup(bundle.v1alpha1().unwrap(), &["machine", "install", "image"])
    };
    v.and_then(|v| v.as_str()).unwrap().to_owned()
}

#[test]
fn a_secure_boot_node_installs_the_secure_boot_installer_in_both_contracts() {
    for (talos, v114) in [("v1.13.9", false), ("v1.14.0", true)] {
        let mut inv = load("rack.yaml");
        inv.cluster.talos_version.value = talos.parse().unwrap();
        secure(&mut inv, "rack1-wk-02");
        let secrets = fixture_secrets();
        let sb = render_node(&inv, &secrets, inv.node("rack1-wk-02").unwrap()).unwrap();
        let plain = render_node(&inv, &secrets, inv.node("rack1-wk-01").unwrap()).unwrap();
        let schematic = crate::inventory::VANILLA_SCHEMATIC;
        assert_eq!(
            installer_of(&sb, v114),
            format!("factory.talos.dev/metal-installer-secureboot/{schematic}:{talos}")
        );
        assert_eq!(
            installer_of(&plain, v114),
            format!("factory.talos.dev/metal-installer/{schematic}:{talos}")
        );
    }
}

#[test]
fn an_operators_factory_mirror_gets_the_secure_boot_path_and_any_other_image_is_kept() {
    let mut inv = load("rack.yaml");
    secure(&mut inv, "rack1-wk-02");
    let v = inv.cluster.talos_version.value.clone();
    let node = inv.node("rack1-wk-02").unwrap().clone();
    inv.cluster.installer.image = Some("registry.lan:5000/metal-installer/abc".into());
    assert_eq!(
        node_installer_image_at(&inv, &node, &v),
        format!("registry.lan:5000/metal-installer-secureboot/abc:{v}")
    );
    inv.cluster.installer.image = Some("registry.lan/talos/installer".into());
    assert_eq!(
        node_installer_image_at(&inv, &node, &v),
        format!("registry.lan/talos/installer:{v}")
    );
}
