//! A vendor-like Redfish BMC for tests: real captured resource trees served by a real mockup
//! server (`sushy-static`, openstack/sushy-tools 2.2.0 `sushy_tools/static/main.py`, which
//! serves a DMTF mockup directory read-only: GET of `<path>/index.json`, 204 to anything
//! else), behind a thin front that adds what a real BMC enforces and a mockup server does
//! not. Each behaviour and its source (rows in docs/conformance.md, "Redfish: vendor-shaped
//! trees"):
//!
//! - the service root answers without credentials, every other resource needs HTTP Basic or
//!   an `X-Auth-Token` (DMTF DSP0266 1.x, "Authentication": the service root is unauthenticated;
//!   "Session login authentication": POST `UserName`/`Password` to the `Sessions` collection
//!   answers 201 with `X-Auth-Token` and `Location`, DELETE of that URI ends the session);
//!   [`FrontOptions::basic`] off models a BMC that refuses Basic (some refuse or throttle it);
//! - the ComputerSystem carries an `ETag`, weak (`W/"n"`) when [`FrontOptions::weak_etags`]
//!   (as the iLO 5 capture of issue 24 did; a real BMC's
//!   weak `W/"7dc5e2b9"` is also in the sushy 5.14.0 wheel's `session_creation_headers.json`); a PATCH's `If-Match` is compared weakly (the opaque
//!   tag, `W/` or not), a PATCH without it is 428 when [`FrontOptions::require_if_match`]
//!   (RFC 6585 section 3), a stale tag is 412 (RFC 7232 section 3.1, DSP0266 "ETags");
//!   [`FrontOptions::stale_reads`] makes the system change under the client after each of
//!   that many reads (another writer between the client's read and its PATCH);
//! - `BootSourceOverrideMode` starts at [`FrontOptions::override_mode`] (`Legacy`: a
//!   common default on HPE and Supermicro BMCs, as issue 24 found) and takes only
//!   [`FrontOptions::allowed_modes`]; a value outside an `@Redfish.AllowableValues` list is
//!   400 `PropertyValueNotInList` (DMTF Base message registry);
//! - `ComputerSystem.Reset` takes only the tree's `ResetType@Redfish.AllowableValues` (400
//!   `ActionParameterNotSupported` otherwise) and applies at once.
//!
//! - the Secure Boot resources (issue 27 item 4, [`secureboot`]): `SecureBootEnable` PATCHed
//!   with the same `If-Match` rules, certificates POSTed into a database's `Certificates`
//!   stored and listed (201 with `Location`, DSP0266 "POST (create)"), or refused with
//!   [`FrontOptions::cert_post_status`] (405/501) as a read-only BMC answers.
//!
//! The front keeps the mutable state (power, override, ETag version, sessions) and overlays
//! it on the captured system resource; everything else is the captured tree as served.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use axum::Router;
use axum::body::Bytes;
use axum::extract::State;
use axum::http::{HeaderMap, Method, StatusCode, Uri, header};
use axum::response::{IntoResponse, Response};
use serde_json::{Value, json};

use super::qemu::die_with_parent;

mod secureboot;
use super::sushy::{VENV, free_port};

/// The sushy 5.14.0 wheel's json samples (installed by scripts/test-deps into the sushy-tools
/// venv): DMTF mockup resources and a Dell iDRAC capture.
pub fn samples() -> Option<PathBuf> {
    let lib = Path::new(VENV).join("lib");
    for py in std::fs::read_dir(&lib).ok()?.flatten() {
        let p = py.path().join("site-packages/sushy/tests");
        if p.join("unit/json_samples/system.json").exists() {
            return Some(p);
        }
    }
    None
}

/// True when sushy-static and the samples are installed; otherwise panics unless
/// TALBOOT_SKIP_SUSHY is set.
pub fn available() -> bool {
    if Path::new(VENV).join("bin/sushy-static").exists() && samples().is_some() {
        return true;
    }
    if std::env::var_os("TALBOOT_SKIP_SUSHY").is_some() {
        eprintln!("sushy-static or the sushy samples missing; skipped (TALBOOT_SKIP_SUSHY is set)");
        return false;
    }
    panic!(
        "{VENV}/bin/sushy-static or the sushy 5.14.0 samples are missing: run scripts/test-deps (or set TALBOOT_SKIP_SUSHY=1)"
    );
}

/// Writes `value` as the mockup resource at `uri` (DMTF mockup layout: `<uri>/index.json`).
pub fn put(tree: &Path, uri: &str, value: &Value) {
    let rel = uri
        .trim_start_matches("/redfish/v1")
        .trim_matches('/')
        .to_string();
    let dir = tree.join(rel);
    std::fs::create_dir_all(&dir).unwrap();
    std::fs::write(
        dir.join("index.json"),
        serde_json::to_vec_pretty(value).unwrap(),
    )
    .unwrap();
}

/// Reads a sample file of the sushy wheel.
pub fn sample(rel: &str) -> Value {
    let p = samples().unwrap().join(rel);
    serde_json::from_slice(&std::fs::read(&p).unwrap_or_else(|e| panic!("{}: {e}", p.display())))
        .unwrap()
}

/// How the front behaves.
#[derive(Clone, Debug)]
pub struct FrontOptions {
    /// The ComputerSystem's URI exactly as the tree links it (trailing slash and all).
    pub system: String,
    pub user: String,
    pub password: String,
    /// HTTP Basic accepted.
    pub basic: bool,
    /// Sessions can be created (at [`Self::sessions_uri`]).
    pub sessions: bool,
    /// Where sessions are created: the tree's `Links.Sessions`.
    pub sessions_uri: String,
    pub weak_etags: bool,
    /// The ETag only as the resource's `@odata.etag`, with no `ETag` header (DSP0266 allows
    /// either; Redfish-Mockup-Server sends no header unless its mockup has headers files).
    pub etag_in_body: bool,
    pub require_if_match: bool,
    /// The system changes under the client after each of this many reads.
    pub stale_reads: u32,
    /// The override mode the BMC starts at; `None`: the system has no such property.
    pub override_mode: Option<String>,
    /// `BootSourceOverrideMode@Redfish.AllowableValues`; `None`: no list.
    pub allowed_modes: Option<Vec<String>>,
    pub power: String,
    /// What a POST to a Secure Boot database's `Certificates` answers: 201 stores it; 405
    /// or 501 refuse it as a read-only collection.
    pub cert_post_status: u16,
}

impl FrontOptions {
    pub fn new(system: &str) -> Self {
        Self {
            system: system.into(),
            user: "admin".into(),
            password: "bmc-pass-Vf3".into(),
            basic: true,
            sessions: true,
            sessions_uri: "/redfish/v1/SessionService/Sessions".into(),
            weak_etags: true,
            etag_in_body: false,
            require_if_match: true,
            stale_reads: 0,
            override_mode: Some("Legacy".into()),
            allowed_modes: Some(vec!["Legacy".into(), "UEFI".into()]),
            power: "On".into(),
            cert_post_status: 201,
        }
    }
}

/// One request as the front saw it.
#[derive(Clone, Debug)]
pub struct Seen {
    pub method: String,
    pub path: String,
    /// `basic`, `token`, or `none`.
    pub auth: &'static str,
    pub if_match: Option<String>,
    pub status: u16,
    pub body: Option<Value>,
}

#[derive(Debug, Default)]
pub struct BmcState {
    pub power: String,
    pub target: String,
    pub enabled: String,
    pub mode: Option<String>,
    pub version: u64,
    pub stale_left: u32,
    /// Open sessions: URI to token.
    pub sessions: BTreeMap<String, String>,
    pub sessions_made: u32,
    pub seen: Vec<Seen>,
    /// `SecureBootEnable` once PATCHed (`None`: as the tree says).
    pub sb_enable: Option<bool>,
    /// `SecureBootMode` once keys were reset (`None`: as the tree says).
    pub sb_mode: Option<String>,
    /// The SecureBoot resource's ETag version.
    pub sb_version: u64,
    /// Certificates POSTed, per collection URI (no trailing slash).
    pub certs: BTreeMap<String, Vec<Value>>,
}

struct Inner {
    opts: FrontOptions,
    upstream: String,
    http: reqwest::Client,
    state: Mutex<BmcState>,
}

pub struct Front {
    child: Child,
    pub endpoint: String,
    inner: Arc<Inner>,
    _task: tokio::task::JoinHandle<()>,
}

impl Front {
    /// Serve `tree` with sushy-static and start the front before it.
    pub async fn start(tree: &Path, log: &Path, opts: FrontOptions) -> Front {
        talboot::install_crypto_provider();
        let port = free_port();
        let f = std::fs::File::create(log).unwrap();
        let mut cmd = Command::new(Path::new(VENV).join("bin/sushy-static"));
        cmd.args(["-i", "127.0.0.1", "-p", &port.to_string(), "-m"])
            .arg(tree)
            .stdout(Stdio::from(f.try_clone().unwrap()))
            .stderr(Stdio::from(f))
            .stdin(Stdio::null());
        let mut child = die_with_parent(&mut cmd)
            .spawn()
            .expect("spawn sushy-static");
        let deadline = Instant::now() + Duration::from_secs(30);
        while std::net::TcpStream::connect(("127.0.0.1", port)).is_err() {
            if let Ok(Some(st)) = child.try_wait() {
                panic!(
                    "sushy-static exited {st}: {}",
                    std::fs::read_to_string(log).unwrap_or_default()
                );
            }
            assert!(Instant::now() < deadline, "sushy-static not listening");
            std::thread::sleep(Duration::from_millis(50));
        }
        let state = BmcState {
            power: opts.power.clone(),
            target: "None".into(),
            enabled: "Disabled".into(),
            mode: opts.override_mode.clone(),
            stale_left: opts.stale_reads,
            ..Default::default()
        };
        let inner = Arc::new(Inner {
            opts,
            upstream: format!("http://127.0.0.1:{port}"),
            http: reqwest::Client::new(),
            state: Mutex::new(state),
        });
        let app = Router::new().fallback(handle).with_state(inner.clone());
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let task = tokio::spawn(async move { axum::serve(listener, app).await.unwrap() });
        Front {
            child,
            endpoint: format!("http://{addr}"),
            inner,
            _task: task,
        }
    }

    /// The BMC's state now.
    pub fn state<T>(&self, f: impl FnOnce(&BmcState) -> T) -> T {
        f(&self.inner.state.lock().unwrap())
    }
}

impl Drop for Front {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn same(a: &str, b: &str) -> bool {
    a.trim_end_matches('/')
        .eq_ignore_ascii_case(b.trim_end_matches('/'))
}

fn error(status: StatusCode, id: &str, msg: &str) -> Response {
    (
        status,
        axum::Json(json!({"error": {"code": id, "message": msg,
            "@Message.ExtendedInfo": [{"MessageId": id, "Message": msg}]}})),
    )
        .into_response()
}

fn etag(o: &FrontOptions, v: u64) -> String {
    if o.weak_etags {
        format!("W/\"{v}\"")
    } else {
        format!("\"{v}\"")
    }
}

async fn handle(
    State(inner): State<Arc<Inner>>,
    method: Method,
    uri: Uri,
    headers: HeaderMap,
    body: Bytes,
) -> Response {
    let path = uri.path().to_string();
    let o = &inner.opts;
    let body_json: Option<Value> = serde_json::from_slice(&body).ok();
    let if_match = headers
        .get(header::IF_MATCH)
        .and_then(|v| v.to_str().ok())
        .map(str::to_owned);
    let (auth, ok) = authenticate(&inner, &headers);
    let resp = route(
        &inner,
        &method,
        &path,
        auth,
        ok,
        if_match.as_deref(),
        body_json.as_ref(),
    )
    .await;
    let mut st = inner.state.lock().unwrap();
    // The login body carries the password: never kept.
    let keep = if path.starts_with(&o.sessions_uri) {
        None
    } else {
        body_json
    };
    st.seen.push(Seen {
        method: method.to_string(),
        path,
        auth,
        if_match,
        status: resp.status().as_u16(),
        body: keep,
    });
    resp
}

fn authenticate(inner: &Inner, headers: &HeaderMap) -> (&'static str, bool) {
    use base64::Engine;
    let o = &inner.opts;
    if let Some(t) = headers.get("X-Auth-Token").and_then(|v| v.to_str().ok()) {
        let ok = inner
            .state
            .lock()
            .unwrap()
            .sessions
            .values()
            .any(|v| v == t);
        return ("token", ok);
    }
    if let Some(b) = headers
        .get(header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.strip_prefix("Basic "))
    {
        let want =
            base64::engine::general_purpose::STANDARD.encode(format!("{}:{}", o.user, o.password));
        return ("basic", o.basic && b == want);
    }
    ("none", false)
}

async fn route(
    inner: &Inner,
    method: &Method,
    path: &str,
    auth: &'static str,
    authed: bool,
    if_match: Option<&str>,
    body: Option<&Value>,
) -> Response {
    let o = &inner.opts;
    let sessions_uri = o.sessions_uri.as_str();
    // The service root needs no credentials.
    if method == Method::GET && same(path, "/redfish/v1") {
        return proxy(inner, path).await;
    }
    if o.sessions && method == Method::POST && same(path, sessions_uri) {
        let b = body.cloned().unwrap_or(Value::Null);
        if b["UserName"] != o.user.as_str() || b["Password"] != o.password.as_str() {
            return error(
                StatusCode::UNAUTHORIZED,
                "Base.1.8.NoValidSession",
                "invalid credentials",
            );
        }
        let mut st = inner.state.lock().unwrap();
        st.sessions_made += 1;
        let id = format!("s{:04}", st.sessions_made);
        let token = format!(
            "tok-{:x}",
            0x5eed_0000u64 + u64::from(st.sessions_made) * 7919
        );
        let uri = format!("{sessions_uri}/{id}");
        st.sessions.insert(uri.clone(), token.clone());
        return (
            StatusCode::CREATED,
            [
                ("X-Auth-Token", token),
                (header::LOCATION.as_str(), uri.clone()),
            ],
            axum::Json(json!({"@odata.id": uri, "Id": id, "UserName": o.user})),
        )
            .into_response();
    }
    if !authed {
        return error(
            StatusCode::UNAUTHORIZED,
            "Base.1.8.InsufficientPrivilege",
            if auth == "basic" {
                "Basic authentication refused"
            } else {
                "no valid session"
            },
        );
    }
    if method == Method::DELETE && path.starts_with(sessions_uri) {
        let mut st = inner.state.lock().unwrap();
        return match st.sessions.remove(path.trim_end_matches('/')) {
            Some(_) => StatusCode::NO_CONTENT.into_response(),
            None => error(
                StatusCode::NOT_FOUND,
                "Base.1.8.ResourceMissingAtURI",
                "no such session",
            ),
        };
    }
    if let Some(r) = secureboot::route(inner, method, path, if_match, body).await {
        return r;
    }
    if same(path, &o.system) {
        return match *method {
            Method::GET => system(inner, path).await,
            Method::PATCH => patch(inner, if_match, body),
            _ => error(
                StatusCode::METHOD_NOT_ALLOWED,
                "Base.1.8.OperationNotAllowed",
                "GET, PATCH",
            ),
        };
    }
    if method == Method::POST && path.contains("ComputerSystem.Reset") {
        return reset(inner, path, body).await;
    }
    if method == Method::GET {
        return proxy(inner, path).await;
    }
    error(
        StatusCode::METHOD_NOT_ALLOWED,
        "Base.1.8.OperationNotAllowed",
        "not here",
    )
}

async fn upstream_json(inner: &Inner, path: &str) -> Option<Value> {
    let r = inner
        .http
        .get(format!("{}{path}", inner.upstream))
        .send()
        .await
        .ok()?;
    if !r.status().is_success() {
        return None;
    }
    serde_json::from_str(&r.text().await.ok()?).ok()
}

async fn proxy(inner: &Inner, path: &str) -> Response {
    match upstream_json(inner, path).await {
        Some(v) => axum::Json(v).into_response(),
        None => error(StatusCode::NOT_FOUND, "Base.1.8.ResourceMissingAtURI", path),
    }
}

/// The captured system with the front's state laid over it.
async fn system(inner: &Inner, path: &str) -> Response {
    let Some(mut v) = upstream_json(inner, path).await else {
        return error(StatusCode::NOT_FOUND, "Base.1.8.ResourceMissingAtURI", path);
    };
    let o = &inner.opts;
    let mut st = inner.state.lock().unwrap();
    v["PowerState"] = json!(st.power);
    let boot = v
        .as_object_mut()
        .unwrap()
        .entry("Boot")
        .or_insert_with(|| json!({}));
    boot["BootSourceOverrideTarget"] = json!(st.target);
    boot["BootSourceOverrideEnabled"] = json!(st.enabled);
    let b = boot.as_object_mut().unwrap();
    match &st.mode {
        Some(m) => {
            b.insert("BootSourceOverrideMode".into(), json!(m));
        }
        None => {
            b.remove("BootSourceOverrideMode");
        }
    }
    match &o.allowed_modes {
        Some(l) if st.mode.is_some() => {
            b.insert(
                "BootSourceOverrideMode@Redfish.AllowableValues".into(),
                json!(l),
            );
        }
        _ => {
            b.remove("BootSourceOverrideMode@Redfish.AllowableValues");
        }
    }
    let tag = etag(o, st.version);
    if st.stale_left > 0 {
        // Another writer changes the system right after this read.
        st.stale_left -= 1;
        st.version += 1;
    }
    if o.etag_in_body {
        v["@odata.etag"] = json!(tag);
        return axum::Json(v).into_response();
    }
    ([(header::ETAG, tag)], axum::Json(v)).into_response()
}

fn opaque(tag: &str) -> &str {
    tag.trim().strip_prefix("W/").unwrap_or(tag.trim())
}

fn patch(inner: &Inner, if_match: Option<&str>, body: Option<&Value>) -> Response {
    let o = &inner.opts;
    let mut st = inner.state.lock().unwrap();
    match if_match {
        None if o.require_if_match => {
            return error(
                StatusCode::PRECONDITION_REQUIRED,
                "Base.1.8.PreconditionRequired",
                "If-Match is required",
            );
        }
        Some(t) if opaque(t) != opaque(&etag(o, st.version)) => {
            return error(
                StatusCode::PRECONDITION_FAILED,
                "Base.1.8.PreconditionFailed",
                "the ETag does not match the resource",
            );
        }
        _ => {}
    }
    let boot = body
        .and_then(|b| b.get("Boot"))
        .cloned()
        .unwrap_or(Value::Null);
    if let Some(m) = boot.get("BootSourceOverrideMode").and_then(Value::as_str) {
        let allowed = match (&st.mode, &o.allowed_modes) {
            (None, _) => false,
            (Some(_), Some(l)) => l.iter().any(|a| a == m),
            (Some(_), None) => true,
        };
        if !allowed {
            return error(
                StatusCode::BAD_REQUEST,
                "Base.1.8.PropertyValueNotInList",
                &format!(
                    "the value {m} for BootSourceOverrideMode is not in the list of acceptable values"
                ),
            );
        }
        st.mode = Some(m.to_string());
    }
    if let Some(t) = boot.get("BootSourceOverrideTarget").and_then(Value::as_str) {
        st.target = t.to_string();
    }
    if let Some(e) = boot
        .get("BootSourceOverrideEnabled")
        .and_then(Value::as_str)
    {
        st.enabled = e.to_string();
    }
    st.version += 1;
    StatusCode::NO_CONTENT.into_response()
}

async fn reset(inner: &Inner, path: &str, body: Option<&Value>) -> Response {
    let Some(sys) = upstream_json(inner, &inner.opts.system).await else {
        return error(StatusCode::NOT_FOUND, "Base.1.8.ResourceMissingAtURI", path);
    };
    let action = &sys["Actions"]["#ComputerSystem.Reset"];
    if !same(action["target"].as_str().unwrap_or(""), path) {
        return error(StatusCode::NOT_FOUND, "Base.1.8.ResourceMissingAtURI", path);
    }
    let t = body.and_then(|b| b["ResetType"].as_str()).unwrap_or("");
    let allowed = action["ResetType@Redfish.AllowableValues"]
        .as_array()
        .is_none_or(|l| l.iter().any(|a| a == t));
    if !allowed {
        return error(
            StatusCode::BAD_REQUEST,
            "Base.1.8.ActionParameterNotSupported",
            &format!("the parameter ResetType value {t} is not supported"),
        );
    }
    let mut st = inner.state.lock().unwrap();
    st.power = match t {
        "On" | "ForceOn" | "ForceRestart" | "GracefulRestart" | "PowerCycle" => "On".into(),
        "ForceOff" | "GracefulShutdown" => "Off".into(),
        "PushPowerButton" if st.power == "On" => "Off".into(),
        "PushPowerButton" => "On".into(),
        _ => st.power.clone(),
    };
    StatusCode::NO_CONTENT.into_response()
}
