//! What a `secureBoot: true` node's firmware is offered (issue 27 item 2), and what a UEFI
//! HTTP Boot client without Secure Boot gets under `boot.httpBoot: uki` (item 5): the signed
//! UKI as a `.efi` URL with the `HTTPClient` echo EDK2 requires (NetworkPkg/HttpBootDxe/
//! HttpBootDhcp4.c, edk2-stable202211), the signed UKI over TFTP to UEFI PXE, and never iPXE.

use super::*;
use crate::dhcp::UkiSet;
use crate::inventory::HttpBoot;

const SIGNED_URL: &str = "http://10.0.0.1:8080/assets/v1.13.9/sch/amd64/secureboot-uki.efi";

fn sb_ctx(signed: bool, plain: bool) -> (DecideCtx, LeaseBook) {
    let (mut c, b) = auth();
    c.hosts.get_mut(&CP1).unwrap().secure_boot = true;
    c.ukis.insert(
        Arch::Amd64,
        UkiSet {
            dir: "assets/v1.13.9/sch/amd64".into(),
            plain,
            signed,
        },
    );
    (c, b)
}

fn refused(d: &Decision) -> Option<String> {
    match d {
        Decision::Reply { reply, .. } => reply.boot_refused.clone(),
        other => panic!("expected a reply, got {other:?}"),
    }
}

#[test]
fn a_secure_boot_node_asking_by_http_boot_gets_its_signed_uki_url_with_the_echo() {
    let (c, mut b) = sb_ctx(true, true);
    let d = run(
        &c,
        &mut b,
        with(m(MessageType::Discover, CP1), http(16)),
        t(0),
    );
    assert_eq!(refused(&d), None);
    let g = reply(d);
    assert_eq!(g.bootfile().as_deref(), Some(SIGNED_URL));
    assert_eq!(g.file().as_deref(), Some(SIGNED_URL));
    assert_eq!(
        g.bytes(OptionCode::ClassIdentifier),
        Some(b"HTTPClient".to_vec())
    );
    assert_eq!(g.msg.yiaddr(), ip("10.0.0.11"));
    // Its firmware says arm64 HTTP Boot (19), and the cache has no arm64 set: nothing
    // signed to offer, so no boot file and the reason.
    let d = run(
        &c,
        &mut b,
        with(m(MessageType::Discover, CP1), http(19)),
        t(0),
    );
    assert!(
        refused(&d)
            .unwrap()
            .contains("arm64 boot set has no Secure Boot UKI")
    );
    assert_eq!(reply(d).bootfile(), None);
}

#[test]
fn a_secure_boot_node_asking_by_uefi_pxe_gets_the_signed_uki_over_tftp() {
    let (c, mut b) = sb_ctx(true, false);
    for arch in [7, 9] {
        let g = reply(run(
            &c,
            &mut b,
            with(m(MessageType::Discover, CP1), pxe(arch)),
            t(0),
        ));
        assert_eq!(
            g.file().as_deref(),
            Some("assets/v1.13.9/sch/amd64/secureboot-uki.efi")
        );
        assert_eq!(g.msg.siaddr(), SERVER);
        assert_eq!(
            g.bytes(OptionCode::ClassIdentifier),
            Some(b"PXEClient".to_vec())
        );
    }
}

#[test]
fn a_secure_boot_node_gets_no_ipxe_and_a_reason_when_nothing_signed_exists() {
    // No signed UKI in the boot set (only the plain one): no boot file at all, for HTTP Boot
    // and PXE alike, and the reason names the node and the fix.
    let (c, mut b) = sb_ctx(false, true);
    for opts in [http(16), pxe(7)] {
        let d = run(&c, &mut b, with(m(MessageType::Discover, CP1), opts), t(0));
        let why = refused(&d).expect("a refusal");
        assert!(
            why.contains("cp1") && why.contains("no Secure Boot UKI"),
            "{why}"
        );
        assert!(why.contains("talboot images pull"), "{why}");
        let g = reply(d);
        assert_eq!(g.bootfile(), None);
        assert_eq!(g.file(), None);
        assert_eq!(
            g.msg.yiaddr(),
            ip("10.0.0.11"),
            "the address is still leased"
        );
    }
    // Legacy BIOS PXE: refused whatever the boot set has.
    let (c, mut b) = sb_ctx(true, true);
    let d = run(
        &c,
        &mut b,
        with(m(MessageType::Discover, CP1), pxe(0)),
        t(0),
    );
    let why = refused(&d).expect("a refusal");
    assert!(
        why.contains("cp1") && why.contains("BIOS has no Secure Boot"),
        "{why}"
    );
    assert_eq!(reply(d).file(), None);
}

#[test]
fn http_boot_without_secure_boot_gets_ipxe_or_the_plain_uki_as_the_inventory_says() {
    let (mut c, mut b) = sb_ctx(true, true);
    c.hosts.get_mut(&CP1).unwrap().secure_boot = false;
    let g = reply(run(
        &c,
        &mut b,
        with(m(MessageType::Discover, CP1), http(16)),
        t(0),
    ));
    assert_eq!(
        g.bootfile().as_deref(),
        Some("http://10.0.0.1:8080/ipxe.efi")
    );
    c.http_boot = HttpBoot::Uki;
    let g = reply(run(
        &c,
        &mut b,
        with(m(MessageType::Discover, CP1), http(16)),
        t(0),
    ));
    assert_eq!(
        g.bootfile().as_deref(),
        Some("http://10.0.0.1:8080/assets/v1.13.9/sch/amd64/uki.efi")
    );
    assert_eq!(
        g.bytes(OptionCode::ClassIdentifier),
        Some(b"HTTPClient".to_vec())
    );
    // PXE is not HTTP Boot: still iPXE over TFTP.
    let g = reply(run(
        &c,
        &mut b,
        with(m(MessageType::Discover, CP1), pxe(7)),
        t(0),
    ));
    assert_eq!(g.file().as_deref(), Some("ipxe.efi"));
    // `uki` without a plain UKI in the set: refused with the fix, not silently iPXE.
    c.ukis.get_mut(&Arch::Amd64).unwrap().plain = false;
    let d = run(
        &c,
        &mut b,
        with(m(MessageType::Discover, CP1), http(16)),
        t(0),
    );
    assert!(refused(&d).unwrap().contains("boot.httpBoot"));
}

#[test]
fn a_running_ipxe_on_a_secure_boot_node_still_gets_its_script() {
    // iPXE running means the firmware already ran unsigned code: the gate before apply
    // (SecurityState) decides about its config; DHCP only never hands out iPXE itself.
    let (c, mut b) = sb_ctx(true, true);
    let g = reply(run(
        &c,
        &mut b,
        with(m(MessageType::Discover, CP1), [ipxe_user_class()]),
        t(0),
    ));
    assert!(g.bootfile().unwrap().contains("/boot.ipxe?mac="));
}
