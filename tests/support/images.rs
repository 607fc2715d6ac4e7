//! Boot artifacts for `serve` tests: the sets an inventory needs, written as small fake files
//! and recorded in the catalog with their real sizes and digests, so `serve`'s start-up
//! verification passes without the Image Factory.

use std::collections::BTreeMap;
use std::path::Path;

use talboot::artifacts::{Catalog, Entry, FileRecord, Kind, hash_file};

/// Writes every boot set the inventory at `inventory` needs under `images` and records it.
pub fn fake_images(inventory: &Path, images: &Path) {
    let inv = talboot::inventory::load_with_env(inventory, &BTreeMap::new())
        .unwrap()
        .inventory;
    for id in talboot::artifacts::required_sets(&inv) {
        let mut files = BTreeMap::new();
        for kind in Kind::ALL {
            let p = images.join(id.rel_dir()).join(kind.file_name());
            std::fs::create_dir_all(p.parent().unwrap()).unwrap();
            std::fs::write(&p, format!("{kind:?} of {id}")).unwrap();
            let (size, sha256) = hash_file(&p).unwrap();
            files.insert(
                kind,
                FileRecord {
                    size,
                    sha256,
                    compression: None,
                    uki: None,
                },
            );
        }
        let mut c = Catalog::load(images).unwrap();
        c.upsert(Entry {
            id,
            source: "test".into(),
            pulled_at: 0,
            files,
            origin: Default::default(),
        });
        c.save(images).unwrap();
    }
}
