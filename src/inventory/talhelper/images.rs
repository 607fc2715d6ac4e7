//! Schematics and installer images: a node's or group's `schematic` body (hashed to its
//! Image Factory ID) and `talosImageURL`.

use std::collections::BTreeMap;

use crate::inventory::diag::Diagnostics;
use crate::inventory::read::{self};
use crate::inventory::schematic::Schematic;
use crate::inventory::yaml::{MapReader, Node as Y, join};

use super::cluster::FromNodes;

/// The groups' schematic and installer image, where no node gave one.
pub(super) fn group_images(
    groups: &BTreeMap<&str, &Y>,
    found: &mut FromNodes,
    d: &mut Diagnostics,
) {
    for g in groups.values() {
        if let Some((s, img)) = group_image(g, d) {
            if let Some(s) = s {
                found.schematic.get_or_insert(s);
            }
            if let Some(img) = img {
                found.installer_image.get_or_insert(img);
            }
        }
    }
}

pub(super) fn group_image(g: &Y, d: &mut Diagnostics) -> Option<(Option<String>, Option<String>)> {
    let mut r = MapReader::new(g, "group", &mut Diagnostics::new())?;
    Some(image_fields(&mut r, "group", d))
}

/// `schematic` (a body, hashed to its ID) and `talosImageURL` (an installer repository, whose
/// last path element is the schematic ID when it points at the Image Factory).
pub(super) fn image_fields(
    r: &mut MapReader<'_>,
    path: &str,
    d: &mut Diagnostics,
) -> (Option<String>, Option<String>) {
    let mut schematic = None;
    let mut image = None;
    if let Some(s) = r.get("schematic") {
        schematic = schematic_body(s, &join(path, "schematic"), d).map(|s| s.id());
    }
    if let Some(u) = r.get("talosImageURL")
        && let Some(url) = read::string(u, &join(path, "talosImageURL"), d)
    {
        let last = url.rsplit('/').next().unwrap_or("");
        if last.len() == 64 && last.bytes().all(|b| b.is_ascii_hexdigit()) {
            schematic.get_or_insert(last.to_ascii_lowercase());
        } else {
            image = Some(url);
        }
    }
    (schematic, image)
}

pub(super) fn schematic_body(n: &Y, path: &str, d: &mut Diagnostics) -> Option<Schematic> {
    let mut r = MapReader::new(n, path, d)?;
    let mut s = Schematic::default();
    if let Some(c) = r.get("customization") {
        let cp = join(path, "customization");
        let mut c = MapReader::new(c, &cp, d)?;
        if let Some(a) = c.get("extraKernelArgs") {
            s.extra_kernel_args =
                read::list(a, &join(&cp, "extraKernelArgs"), d, false, read::string);
        }
        if let Some(se) = c.get("systemExtensions") {
            let sp = join(&cp, "systemExtensions");
            if let Some(mut se) = MapReader::new(se, &sp, d) {
                if let Some(o) = se.get("officialExtensions") {
                    s.official_extensions =
                        read::list(o, &join(&sp, "officialExtensions"), d, false, read::string);
                }
                se.finish(&["officialExtensions"], d);
            }
        }
        if let Some(sb) = c.get("secureboot") {
            let sp = join(&cp, "secureboot");
            if let Some(mut sb) = MapReader::new(sb, &sp, d) {
                s.include_well_known_certificates = sb
                    .get("includeWellKnownCertificates")
                    .and_then(|b| read::boolean(b, &join(&sp, "includeWellKnownCertificates"), d))
                    .unwrap_or(false);
                sb.finish(&["includeWellKnownCertificates"], d);
            }
        }
        if let Some(m) = c.get("meta") {
            s.meta = read::list(m, &join(&cp, "meta"), d, false, |n, p, d| {
                let mut r = MapReader::new(n, p, d)?;
                let key = r.get("key").and_then(|k| {
                    read::parsed(k, &join(p, "key"), d, "a META key (0-255)", "10", |s| {
                        s.parse::<u8>()
                    })
                    .map(|s| s.value)
                });
                let value = r
                    .get("value")
                    .and_then(|v| read::string(v, &join(p, "value"), d));
                r.finish(&["key", "value"], d);
                Some((key?, value?))
            });
        }
        c.finish(
            &["extraKernelArgs", "systemExtensions", "secureboot", "meta"],
            d,
        );
    }
    if let Some(o) = r.get("overlay") {
        let op = join(path, "overlay");
        if let Some(mut o) = MapReader::new(o, &op, d) {
            let image = o
                .get("image")
                .and_then(|v| read::string(v, &join(&op, "image"), d));
            let name = o
                .get("name")
                .and_then(|v| read::string(v, &join(&op, "name"), d));
            if o.has("options") {
                d.warning(
                    o.loc(),
                    join(&op, "options"),
                    "overlay options are not supported; the schematic ID would differ",
                    Some(
                        "set talosImageURL to the factory installer URL with the ID instead".into(),
                    ),
                );
                o.get("options");
            }
            o.finish(&["image", "name", "options"], d);
            if let (Some(i), Some(n)) = (image, name) {
                s.overlay = Some((i, n));
            }
        }
    }
    r.finish(&["customization", "overlay"], d);
    Some(s)
}
