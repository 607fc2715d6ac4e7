//! A strict double of the Proxmox VE API endpoints talboot uses, for tests and the home-lab
//! docs: one PVE node with VMs, API-token auth, async tasks with UPIDs that run for a poll
//! before they stop, and PVE's error shapes. It rejects what real PVE rejects (a bad or
//! missing token, an unknown node or VM, a method an endpoint lacks, a parameter its schema
//! lacks) so the driver cannot pass against it by accident. Plain HTTP on loopback.
//!
//! Sources (docs/conformance.md rows "Proxmox VE"): proxmox/pve-http-server
//! src/PVE/APIServer/Formatter/Standard.pm (`{"data":...}`, errors add `message` and
//! `errors`), proxmox/pve-manager PVE/HTTPServer.pm (`501 Method 'M /path' not implemented`),
//! proxmox/qemu-server PVE/API2/Qemu.pm (create, config, status/*, delete; which return a
//! UPID), proxmox/pve-manager PVE/API2/Tasks.pm (task status), pve-common
//! src/PVE/Tools.pm (UPID layout).

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};

use axum::body::Bytes;
use axum::http::{HeaderMap, Method, StatusCode, Uri};
use axum::response::{IntoResponse, Response};
use serde_json::{Value, json};

/// One VM of the double.
#[derive(Debug, Clone, PartialEq)]
pub struct SimVm {
    pub config: BTreeMap<String, String>,
    pub running: bool,
}

#[derive(Debug, Clone)]
enum Effect {
    None,
    Create(u32, SimVm),
    Run(u32, bool),
    Destroy(u32),
}

#[derive(Debug)]
struct Task {
    /// Status polls left that answer `running`.
    polls_left: u32,
    exit: String,
    effect: Effect,
}

#[derive(Debug, Default)]
struct State {
    vms: BTreeMap<u32, SimVm>,
    tasks: BTreeMap<String, Task>,
    next_pid: u32,
    /// How many times a task's status was read.
    task_polls: u32,
    /// Every request, `METHOD /path`, for tests.
    log: Vec<String>,
}

/// The double's settings.
#[derive(Debug, Clone)]
pub struct ProxmoxDoubleOptions {
    pub node: String,
    pub token_id: String,
    pub secret: String,
    pub storages: Vec<String>,
    pub bridges: Vec<String>,
}

impl Default for ProxmoxDoubleOptions {
    fn default() -> Self {
        Self {
            node: "pve".into(),
            token_id: "talboot@pve!lab".into(),
            secret: "8d2f6a4e-1c0b-4e7a-9d3f-5b6c7d8e9f01".into(),
            storages: vec!["local-lvm".into()],
            bridges: vec!["vmbr0".into()],
        }
    }
}

/// A running double.
pub struct ProxmoxDouble {
    pub addr: SocketAddr,
    pub opts: ProxmoxDoubleOptions,
    state: Arc<Mutex<State>>,
    task: tokio::task::JoinHandle<()>,
}

impl Drop for ProxmoxDouble {
    fn drop(&mut self) {
        self.task.abort();
    }
}

impl ProxmoxDouble {
    /// Serve on 127.0.0.1 (an ephemeral port).
    pub async fn start(opts: ProxmoxDoubleOptions) -> std::io::Result<Self> {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
        let addr = listener.local_addr()?;
        let state = Arc::new(Mutex::new(State::default()));
        let (st, o) = (state.clone(), opts.clone());
        let app = axum::Router::new().fallback(move |m: Method, u: Uri, h: HeaderMap, b: Bytes| {
            let (st, o) = (st.clone(), o.clone());
            async move { handle(&st, &o, m, u, h, b) }
        });
        let task = tokio::spawn(async move {
            let _ = axum::serve(listener, app).await;
        });
        Ok(Self {
            addr,
            opts,
            state,
            task,
        })
    }

    pub fn url(&self) -> String {
        format!("http://{}", self.addr)
    }

    /// A VM as the double holds it.
    pub fn vm(&self, vmid: u32) -> Option<SimVm> {
        self.state.lock().unwrap().vms.get(&vmid).cloned()
    }

    /// Add a VM directly (one talboot did not create).
    pub fn insert_vm(&self, vmid: u32, vm: SimVm) {
        self.state.lock().unwrap().vms.insert(vmid, vm);
    }

    pub fn task_polls(&self) -> u32 {
        self.state.lock().unwrap().task_polls
    }

    pub fn requests(&self) -> Vec<String> {
        self.state.lock().unwrap().log.clone()
    }
}

fn answer(status: StatusCode, data: Value) -> Response {
    (
        status,
        [("content-type", "application/json;charset=UTF-8")],
        json!({ "data": data }).to_string(),
    )
        .into_response()
}

/// PVE's error shape: the status, `data: null` and the message (with a newline, as PVE's
/// `die "...\n"` leaves it).
fn fail(status: StatusCode, message: impl Into<String>) -> Response {
    let mut m = message.into();
    if !m.ends_with('\n') {
        m.push('\n');
    }
    (
        status,
        [("content-type", "application/json;charset=UTF-8")],
        json!({"data": null, "message": m}).to_string(),
    )
        .into_response()
}

fn param_fail(errors: BTreeMap<String, String>) -> Response {
    let errors: serde_json::Map<String, Value> = errors
        .into_iter()
        .map(|(k, v)| (k, Value::String(format!("{v}\n"))))
        .collect();
    (
        StatusCode::BAD_REQUEST,
        [("content-type", "application/json;charset=UTF-8")],
        json!({"data": null, "message": "Parameter verification failed.\n", "errors": errors})
            .to_string(),
    )
        .into_response()
}

fn parse_form(s: &str) -> BTreeMap<String, String> {
    let u = reqwest::Url::parse(&format!("http://x/?{s}")).expect("static URL");
    u.query_pairs()
        .map(|(k, v)| (k.into_owned(), v.into_owned()))
        .collect()
}

fn is_mac(s: &str) -> bool {
    let parts: Vec<&str> = s.split(':').collect();
    parts.len() == 6
        && parts
            .iter()
            .all(|p| p.len() == 2 && p.chars().all(|c| c.is_ascii_hexdigit()))
}

/// Check one VM-config parameter against the subset of qemu-server's schema modelled here;
/// `Err` is the per-parameter message PVE would give.
fn check_param(k: &str, v: &str, o: &ProxmoxDoubleOptions) -> Result<(), String> {
    let int = |v: &str| {
        v.parse::<u64>()
            .map_err(|_| format!("type check ('integer') failed - got '{v}'"))
    };
    match k {
        "name" => (!v.is_empty()
            && v.chars()
                .all(|c| c.is_ascii_alphanumeric() || "-.".contains(c)))
        .then_some(())
        .ok_or_else(|| "invalid format - value does not look like a valid DNS name".into()),
        "memory" => int(v).and_then(|m| {
            if m >= 16 {
                Ok(())
            } else {
                Err("value must have a minimum value of 16".into())
            }
        }),
        "cores" | "sockets" => int(v).map(|_| ()),
        "cpu" | "ostype" | "scsihw" | "serial0" | "vga" | "agent" | "description" => Ok(()),
        "tags" => Ok(()),
        "boot" => {
            let order = v
                .strip_prefix("order=")
                .ok_or("format error - expected order=DEV;DEV")?;
            if order.split(';').all(|d| !d.is_empty()) {
                Ok(())
            } else {
                Err("format error - empty device in boot order".into())
            }
        }
        _ if k.starts_with("net") && k[3..].parse::<u8>().is_ok_and(|i| i < 32) => {
            let mut model_mac = None;
            let mut bridge = None;
            for part in v.split(',') {
                match part.split_once('=') {
                    Some(("bridge", b)) => bridge = Some(b),
                    Some((m, mac)) if ["virtio", "e1000", "rtl8139", "vmxnet3"].contains(&m) => {
                        model_mac = Some(mac)
                    }
                    Some(("firewall" | "tag" | "mtu" | "queues" | "link_down", _)) => {}
                    _ => return Err(format!("format error - unknown net option '{part}'")),
                }
            }
            match model_mac {
                Some(mac) if is_mac(mac) => {}
                Some(mac) => return Err(format!("format error - invalid MAC address '{mac}'")),
                None => return Err("format error - missing model".into()),
            }
            match bridge {
                Some(b) if o.bridges.iter().any(|x| x == b) => Ok(()),
                Some(b) => Err(format!("bridge '{b}' does not exist")),
                None => Ok(()),
            }
        }
        _ if k.starts_with("scsi") && k[4..].parse::<u8>().is_ok_and(|i| i < 31) => {
            let first = v.split(',').next().unwrap_or("");
            let (storage, size) = first
                .split_once(':')
                .ok_or("format error - expected STORAGE:SIZE_GB")?;
            if !o.storages.iter().any(|s| s == storage) {
                return Err(format!("storage '{storage}' does not exist"));
            }
            int(size).map(|_| ())
        }
        _ => Err(
            "property is not defined in schema and the schema does not allow additional properties"
                .into(),
        ),
    }
}

fn new_task(
    st: &mut State,
    o: &ProxmoxDoubleOptions,
    kind: &str,
    id: u32,
    exit: String,
    effect: Effect,
) -> Response {
    st.next_pid += 1;
    // UPID:node:pid:pstart:starttime:type:id:user: (pve-common src/PVE/Tools.pm upid_encode)
    let upid = format!(
        "UPID:{}:{:08X}:{:08X}:{:08X}:{kind}:{id}:{}:",
        o.node,
        0x1000 + st.next_pid,
        0x20000 + st.next_pid,
        0x6700_0000u32 + st.next_pid,
        o.token_id
    );
    st.tasks.insert(
        upid.clone(),
        Task {
            polls_left: 1,
            exit,
            effect,
        },
    );
    answer(StatusCode::OK, Value::String(upid))
}

fn handle(
    st: &Mutex<State>,
    o: &ProxmoxDoubleOptions,
    method: Method,
    uri: Uri,
    headers: HeaderMap,
    body: Bytes,
) -> Response {
    let mut st = st.lock().unwrap();
    let path = uri.path().to_string();
    st.log.push(format!("{method} {path}"));
    let Some(rel) = path.strip_prefix("/api2/json") else {
        return (StatusCode::NOT_FOUND, "").into_response();
    };
    // Token auth (pve-http-server src/PVE/APIServer/AnyEvent.pm: `PVEAPIToken=` then
    // `USER@REALM!TOKENID=SECRET`).
    let auth = headers
        .get("authorization")
        .and_then(|v| v.to_str().ok())
        .unwrap_or("");
    let Some(token) = auth.strip_prefix("PVEAPIToken=") else {
        return fail(StatusCode::UNAUTHORIZED, "No ticket");
    };
    match token.split_once('=') {
        Some((id, secret)) if id == o.token_id && secret == o.secret => {}
        _ => return fail(StatusCode::UNAUTHORIZED, "authentication failure"),
    }
    let mut params = parse_form(uri.query().unwrap_or(""));
    if method == Method::POST || method == Method::PUT {
        params.extend(parse_form(std::str::from_utf8(&body).unwrap_or("")));
    }
    let not_impl = || {
        fail(
            StatusCode::NOT_IMPLEMENTED,
            format!("Method '{method} {rel}' not implemented"),
        )
    };
    let segs: Vec<&str> = rel.trim_matches('/').split('/').collect();
    if segs.first() != Some(&"nodes") || segs.len() < 3 {
        return not_impl();
    }
    if segs[1] != o.node {
        return fail(
            StatusCode::INTERNAL_SERVER_ERROR,
            format!(
                "hostname lookup '{}' failed - failed to get address info for: {}: Name or service not known",
                segs[1], segs[1]
            ),
        );
    }
    match (segs[2], &segs[3..]) {
        ("tasks", [upid, "status"]) => {
            if method != Method::GET {
                return not_impl();
            }
            st.task_polls += 1;
            let upid = upid.to_string();
            let Some(t) = st.tasks.get_mut(&upid) else {
                return fail(
                    StatusCode::INTERNAL_SERVER_ERROR,
                    format!("unable to parse worker upid '{upid}'"),
                );
            };
            if t.polls_left > 0 {
                t.polls_left -= 1;
                return answer(
                    StatusCode::OK,
                    json!({"upid": upid, "status": "running", "node": o.node}),
                );
            }
            let effect = std::mem::replace(&mut t.effect, Effect::None);
            let exit = t.exit.clone();
            match effect {
                Effect::None => {}
                Effect::Create(id, vm) => {
                    st.vms.insert(id, vm);
                }
                Effect::Run(id, on) => {
                    if let Some(vm) = st.vms.get_mut(&id) {
                        vm.running = on;
                    }
                }
                Effect::Destroy(id) => {
                    st.vms.remove(&id);
                }
            }
            answer(
                StatusCode::OK,
                json!({"upid": upid, "status": "stopped", "exitstatus": exit, "node": o.node}),
            )
        }
        ("qemu", []) => match method {
            Method::GET => {
                let list: Vec<Value> = st
                    .vms
                    .iter()
                    .map(|(id, vm)| {
                        json!({
                            "vmid": id,
                            "name": vm.config.get("name").cloned().unwrap_or_default(),
                            "status": if vm.running { "running" } else { "stopped" },
                            "tags": vm.config.get("tags").cloned().unwrap_or_default(),
                        })
                    })
                    .collect();
                answer(StatusCode::OK, Value::Array(list))
            }
            Method::POST => {
                let mut errors = BTreeMap::new();
                let vmid = match params.remove("vmid") {
                    Some(v) => match v.parse::<u32>() {
                        Ok(n) if n >= 100 => Some(n),
                        Ok(_) => {
                            errors.insert(
                                "vmid".into(),
                                "value must have a minimum value of 100".into(),
                            );
                            None
                        }
                        Err(_) => {
                            errors.insert(
                                "vmid".into(),
                                format!("type check ('integer') failed - got '{v}'"),
                            );
                            None
                        }
                    },
                    None => {
                        errors.insert(
                            "vmid".into(),
                            "property is missing and it is not optional".into(),
                        );
                        None
                    }
                };
                for (k, v) in &params {
                    if let Err(e) = check_param(k, v, o) {
                        errors.insert(k.clone(), e);
                    }
                }
                if !errors.is_empty() {
                    return param_fail(errors);
                }
                let vmid = vmid.expect("checked");
                if st.vms.contains_key(&vmid) {
                    return fail(
                        StatusCode::INTERNAL_SERVER_ERROR,
                        format!(
                            "unable to create VM {vmid} - VM {vmid} already exists on node '{}'",
                            o.node
                        ),
                    );
                }
                let vm = SimVm {
                    config: params,
                    running: false,
                };
                new_task(
                    &mut st,
                    o,
                    "qmcreate",
                    vmid,
                    "OK".into(),
                    Effect::Create(vmid, vm),
                )
            }
            _ => not_impl(),
        },
        ("qemu", [id, rest @ ..]) => {
            let Ok(vmid) = id.parse::<u32>() else {
                return param_fail(BTreeMap::from([(
                    "vmid".to_string(),
                    format!("type check ('integer') failed - got '{id}'"),
                )]));
            };
            // Which methods each endpoint has (qemu-server PVE/API2/Qemu.pm).
            let allowed: &[Method] = match rest {
                [] => &[Method::GET, Method::DELETE],
                ["config"] => &[Method::GET, Method::POST, Method::PUT],
                ["status", "current"] => &[Method::GET],
                ["status", "start" | "stop" | "reset" | "shutdown"] => &[Method::POST],
                _ => &[],
            };
            if !allowed.contains(&method) {
                return not_impl();
            }
            let Some(vm) = st.vms.get(&vmid).cloned() else {
                return fail(
                    StatusCode::INTERNAL_SERVER_ERROR,
                    format!(
                        "Configuration file 'nodes/{}/qemu-server/{vmid}.conf' does not exist",
                        o.node
                    ),
                );
            };
            match (rest, &method) {
                ([], &Method::GET) => answer(
                    StatusCode::OK,
                    json!([{"subdir": "config"}, {"subdir": "status"}]),
                ),
                ([], &Method::DELETE) => {
                    if vm.running {
                        return fail(
                            StatusCode::INTERNAL_SERVER_ERROR,
                            format!("VM {vmid} is running - destroy failed"),
                        );
                    }
                    new_task(
                        &mut st,
                        o,
                        "qmdestroy",
                        vmid,
                        "OK".into(),
                        Effect::Destroy(vmid),
                    )
                }
                (["config"], &Method::GET) => {
                    let mut c: serde_json::Map<String, Value> = vm
                        .config
                        .iter()
                        .map(|(k, v)| {
                            let v = match k.as_str() {
                                "memory" | "cores" | "sockets" => v
                                    .parse::<u64>()
                                    .map(Value::from)
                                    .unwrap_or(Value::from(v.clone())),
                                _ => Value::String(v.clone()),
                            };
                            (k.clone(), v)
                        })
                        .collect();
                    c.insert(
                        "digest".into(),
                        Value::String(format!("{:040x}", vm.config.len())),
                    );
                    answer(StatusCode::OK, Value::Object(c))
                }
                (["config"], m) => {
                    let mut errors = BTreeMap::new();
                    for (k, v) in &params {
                        if k == "digest" || k == "delete" {
                            continue;
                        }
                        if let Err(e) = check_param(k, v, o) {
                            errors.insert(k.clone(), e);
                        }
                    }
                    if let Some(order) = params.get("boot").and_then(|b| b.strip_prefix("order="))
                        && let Some(missing) =
                            order.split(';').find(|d| !vm.config.contains_key(*d))
                    {
                        errors.insert(
                            "boot".into(),
                            format!("invalid bootorder: device '{missing}' does not exist'"),
                        );
                    }
                    if !errors.is_empty() {
                        return param_fail(errors);
                    }
                    let entry = st.vms.get_mut(&vmid).expect("present");
                    for (k, v) in params {
                        entry.config.insert(k, v);
                    }
                    if *m == Method::POST {
                        new_task(&mut st, o, "qmconfig", vmid, "OK".into(), Effect::None)
                    } else {
                        answer(StatusCode::OK, Value::Null)
                    }
                }
                (["status", "current"], _) => answer(
                    StatusCode::OK,
                    json!({
                        "vmid": vmid,
                        "name": vm.config.get("name").cloned().unwrap_or_default(),
                        "status": if vm.running { "running" } else { "stopped" },
                        "qmpstatus": if vm.running { "running" } else { "stopped" },
                    }),
                ),
                (["status", action], _) => {
                    let (kind, exit, effect) = match (*action, vm.running) {
                        ("start", true) => (
                            "qmstart",
                            format!("VM {vmid} already running"),
                            Effect::None,
                        ),
                        ("start", false) => ("qmstart", "OK".into(), Effect::Run(vmid, true)),
                        ("stop", _) => ("qmstop", "OK".into(), Effect::Run(vmid, false)),
                        ("shutdown", _) => ("qmshutdown", "OK".into(), Effect::Run(vmid, false)),
                        ("reset", true) => ("qmreset", "OK".into(), Effect::None),
                        ("reset", false) => {
                            ("qmreset", format!("VM {vmid} not running"), Effect::None)
                        }
                        _ => return not_impl(),
                    };
                    new_task(&mut st, o, kind, vmid, exit, effect)
                }
                _ => not_impl(),
            }
        }
        _ => not_impl(),
    }
}
