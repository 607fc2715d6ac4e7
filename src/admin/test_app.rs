//! The admin app the admin module's tests serve: config/rack.yaml's inventory over a throwaway
//! redb store, rebuilds offline, and no rollouts, power, leader or fleet until a test sets them.

use std::path::Path;
use std::sync::Arc;

use super::AdminApp;

/// The app over a store in `dir/state`; its event writer runs on the current runtime.
pub(super) fn offline_app(dir: &Path) -> AdminApp {
    let inventory = crate::inventory::load_with_env(
        &Path::new(env!("CARGO_MANIFEST_DIR")).join("config/rack.yaml"),
        &std::collections::BTreeMap::new(),
    )
    .unwrap()
    .inventory;
    let (store, w) = crate::store::open(&dir.join("state")).unwrap().split();
    let store: Arc<dyn crate::store::Store> = store;
    let (events, _writer) =
        crate::events::EventBus::start(w.events, Arc::new(crate::events::SystemClock));
    let inventory = Arc::new(inventory);
    let view = Arc::new(crate::view::StateView::new());
    let offline = Arc::new(crate::provision::OfflineObserver {
        inventory: inventory.clone(),
        store: store.clone(),
        nodes: Arc::new(w.nodes),
        view: view.clone(),
    });
    AdminApp {
        inventory,
        store,
        view,
        events,
        metrics: None,
        commands: crate::provision::Rebuilds::Offline(offline),
        rollouts: None,
        power: None,
        leader: None,
        ha: None,
    }
}
