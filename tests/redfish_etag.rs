//! Redfish If-Match/ETag: talboot's Redfish driver against a strict BMC double on loopback
//! that sends an `ETag` with the ComputerSystem and refuses a boot-override PATCH without a
//! matching `If-Match`.
//!
//! The double's rules, and where they come from (rows in docs/conformance.md):
//! - a PATCH without `If-Match` is refused with 428 Precondition Required (RFC 6585 section
//!   3: the origin requires the request to be conditional);
//! - `If-Match` is compared with the strong comparison function (RFC 7232 section 3.1): a
//!   tag that differs, or any weak `W/` tag, is refused with 412 Precondition Failed;
//! - each accepted PATCH changes the resource, so its ETag changes (RFC 7232 section 2.3);
//! - the "weak" BMC hands out `W/"n"` and takes the strong form `"n"` in `If-Match`: the BMC
//!   behaviour openstack/sushy 5.8.0 sushy/connector.py `_etag_handler` retries for.
//!
//! sushy-tools 2.2.0 (the emulator of tests/redfish_sushy.rs and redfish_libvirt.rs) sends no
//! ETag at all, so those tests cover the PATCH without `If-Match`.

use std::sync::{Arc, Mutex};

use axum::Router;
use axum::extract::State;
use axum::http::{HeaderMap, StatusCode, header};
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use serde_json::json;
use talboot::inventory::Credential;
use talboot::power::redfish::{Redfish, RedfishConfig};
use talboot::power::{BootDevice, BootPersistence};

#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum Tags {
    Strong,
    Weak,
}

#[derive(Default)]
struct Bmc {
    version: u64,
    /// The `If-Match` of every PATCH, in order.
    patches: Vec<Option<String>>,
    /// The boot override the accepted PATCHes left.
    boot: Option<serde_json::Value>,
}

type Shared = Arc<(Tags, Mutex<Bmc>)>;

fn etag(tags: Tags, version: u64) -> String {
    match tags {
        Tags::Strong => format!("\"{version}\""),
        Tags::Weak => format!("W/\"{version}\""),
    }
}

async fn collection() -> Response {
    axum::Json(json!({"Members": [{"@odata.id": "/redfish/v1/Systems/1"}]})).into_response()
}

async fn system(State(s): State<Shared>) -> Response {
    let (tags, bmc) = &*s;
    let b = bmc.lock().unwrap();
    let body = json!({
        "@odata.id": "/redfish/v1/Systems/1",
        "PowerState": "Off",
        "Boot": {
            "BootSourceOverrideTarget": b.boot.as_ref().and_then(|v| v.get("BootSourceOverrideTarget")).cloned().unwrap_or(json!("None")),
            "BootSourceOverrideTarget@Redfish.AllowableValues": ["Pxe", "Hdd"]
        },
        "Actions": {"#ComputerSystem.Reset": {"target": "/redfish/v1/Systems/1/Actions/ComputerSystem.Reset"}}
    });
    ([(header::ETAG, etag(*tags, b.version))], axum::Json(body)).into_response()
}

async fn patch_system(State(s): State<Shared>, headers: HeaderMap, body: String) -> Response {
    let mut b = s.1.lock().unwrap();
    let if_match = headers
        .get(header::IF_MATCH)
        .and_then(|v| v.to_str().ok())
        .map(str::to_owned);
    b.patches.push(if_match.clone());
    let Some(tag) = if_match else {
        return StatusCode::PRECONDITION_REQUIRED.into_response();
    };
    // Strong comparison: never a weak tag; the opaque tag of the current version.
    let current = format!("\"{}\"", b.version);
    if tag.starts_with("W/") || tag != current {
        return StatusCode::PRECONDITION_FAILED.into_response();
    }
    let v: serde_json::Value = serde_json::from_str(&body).unwrap();
    b.boot = v.get("Boot").cloned();
    b.version += 1;
    StatusCode::NO_CONTENT.into_response()
}

async fn start(tags: Tags) -> (Redfish, Shared) {
    let shared: Shared = Arc::new((tags, Mutex::new(Bmc::default())));
    let app = Router::new()
        .route("/redfish/v1/Systems", get(collection))
        .route("/redfish/v1/Systems/1", get(system).patch(patch_system))
        .with_state(shared.clone());
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move { axum::serve(listener, app).await.unwrap() });
    let rf = Redfish::new(RedfishConfig::new(
        format!("http://{addr}"),
        "root",
        Credential::new("calvin"),
    ))
    .unwrap();
    (rf, shared)
}

#[tokio::test]
async fn the_boot_override_carries_the_etag_the_bmc_sent() {
    let (rf, bmc) = start(Tags::Strong).await;
    rf.set_boot_device(BootDevice::Network, BootPersistence::Once)
        .await
        .unwrap();
    // A later change reads the resource again: the ETag the first PATCH left, not a stale one.
    rf.set_boot_device(BootDevice::Disk, BootPersistence::Persistent)
        .await
        .unwrap();
    let b = bmc.1.lock().unwrap();
    assert_eq!(
        b.patches,
        [Some("\"0\"".to_owned()), Some("\"1\"".to_owned())]
    );
    assert_eq!(b.boot.as_ref().unwrap()["BootSourceOverrideTarget"], "Hdd");
}

#[tokio::test]
async fn a_weak_etag_refused_as_such_is_retried_in_its_strong_form() {
    let (rf, bmc) = start(Tags::Weak).await;
    rf.set_boot_device(BootDevice::Network, BootPersistence::Once)
        .await
        .unwrap();
    let b = bmc.1.lock().unwrap();
    assert_eq!(
        b.patches,
        [Some("W/\"0\"".to_owned()), Some("\"0\"".to_owned())]
    );
    assert_eq!(b.boot.as_ref().unwrap()["BootSourceOverrideTarget"], "Pxe");
}
