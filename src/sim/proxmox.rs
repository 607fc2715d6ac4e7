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

/// Why PVE refuses one parameter (qemu-server's schema checks, as their messages read); the
/// 400 answer lists it under the parameter's name.
#[derive(Debug, thiserror::Error)]
enum ParamError {
    /// Not an unsigned integer (the value).
    #[error("type check ('integer') failed - got '{0}'")]
    NotInteger(String),
    /// A VM name that is not a DNS name.
    #[error("invalid format - value does not look like a valid DNS name")]
    NotDnsName,
    /// Below the schema's minimum (the minimum).
    #[error("value must have a minimum value of {0}")]
    BelowMinimum(u64),
    /// A `boot` value without `order=`.
    #[error("format error - expected order=DEV;DEV")]
    BootFormat,
    /// A boot order with an empty device.
    #[error("format error - empty device in boot order")]
    EmptyBootDevice,
    /// A `netN` option PVE does not know (the option).
    #[error("format error - unknown net option '{0}'")]
    UnknownNetOption(String),
    /// A `netN` MAC address that is not one (the value).
    #[error("format error - invalid MAC address '{0}'")]
    InvalidMac(String),
    /// A `netN` without a NIC model.
    #[error("format error - missing model")]
    MissingModel,
    /// A bridge the node does not have.
    #[error("bridge '{0}' does not exist")]
    NoBridge(String),
    /// A `scsiN` value without `STORAGE:SIZE`.
    #[error("format error - expected STORAGE:SIZE_GB")]
    DiskFormat,
    /// A storage the node does not have.
    #[error("storage '{0}' does not exist")]
    NoStorage(String),
    /// A parameter the schema does not have.
    #[error(
        "property is not defined in schema and the schema does not allow additional properties"
    )]
    NotInSchema,
}

/// Check one VM-config parameter against the subset of qemu-server's schema modelled here;
/// `Err` is the per-parameter message PVE would give.
fn check_param(k: &str, v: &str, o: &ProxmoxDoubleOptions) -> Result<(), ParamError> {
    let int = |v: &str| {
        v.parse::<u64>()
            .map_err(|_| ParamError::NotInteger(v.to_owned()))
    };
    match k {
        "name" => (!v.is_empty()
            && v.chars()
                .all(|c| c.is_ascii_alphanumeric() || "-.".contains(c)))
        .then_some(())
        .ok_or(ParamError::NotDnsName),
        "memory" => int(v).and_then(|m| {
            if m >= 16 {
                Ok(())
            } else {
                Err(ParamError::BelowMinimum(16))
            }
        }),
        "cores" | "sockets" => int(v).map(|_| ()),
        "cpu" | "ostype" | "scsihw" | "serial0" | "vga" | "agent" | "description" => Ok(()),
        "tags" => Ok(()),
        "boot" => {
            let order = v.strip_prefix("order=").ok_or(ParamError::BootFormat)?;
            if order.split(';').all(|d| !d.is_empty()) {
                Ok(())
            } else {
                Err(ParamError::EmptyBootDevice)
            }
        }
        _ if k.starts_with("net") && k[3..].parse::<u8>().is_ok_and(|i| i < 32) => check_net(v, o),
        _ if k.starts_with("scsi") && k[4..].parse::<u8>().is_ok_and(|i| i < 31) => {
            let first = v.split(',').next().unwrap_or("");
            let (storage, size) = first.split_once(':').ok_or(ParamError::DiskFormat)?;
            if !o.storages.iter().any(|s| s == storage) {
                return Err(ParamError::NoStorage(storage.to_owned()));
            }
            int(size).map(|_| ())
        }
        _ => Err(ParamError::NotInSchema),
    }
}

/// A `netN` value: `MODEL=MAC` with an existing bridge and the options PVE knows.
fn check_net(v: &str, o: &ProxmoxDoubleOptions) -> Result<(), ParamError> {
    let mut model_mac = None;
    let mut bridge = None;
    for part in v.split(',') {
        match part.split_once('=') {
            Some(("bridge", b)) => bridge = Some(b),
            Some((m, mac)) if ["virtio", "e1000", "rtl8139", "vmxnet3"].contains(&m) => {
                model_mac = Some(mac)
            }
            Some(("firewall" | "tag" | "mtu" | "queues" | "link_down", _)) => {}
            _ => return Err(ParamError::UnknownNetOption(part.to_owned())),
        }
    }
    match model_mac {
        Some(mac) if is_mac(mac) => {}
        Some(mac) => return Err(ParamError::InvalidMac(mac.to_owned())),
        None => return Err(ParamError::MissingModel),
    }
    match bridge {
        Some(b) if o.bridges.iter().any(|x| x == b) => Ok(()),
        Some(b) => Err(ParamError::NoBridge(b.to_owned())),
        None => Ok(()),
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
    if let Err(refused) = authenticate(&headers, o) {
        return *refused;
    }
    let mut params = parse_form(uri.query().unwrap_or(""));
    if method == Method::POST || method == Method::PUT {
        params.extend(parse_form(std::str::from_utf8(&body).unwrap_or("")));
    }
    let mut call = Call {
        st: &mut st,
        o,
        method,
        rel,
        params,
    };
    let segs: Vec<&str> = rel.trim_matches('/').split('/').collect();
    if segs.first() != Some(&"nodes") || segs.len() < 3 {
        return call.not_impl();
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
    // One arm per endpoint; kept whole so the routes read in one place.
    match (segs[2], &segs[3..], call.method.clone()) {
        ("tasks", [upid, "status"], Method::GET) => call.task_status(upid),
        ("qemu", [], Method::GET) => call.list_vms(),
        ("qemu", [], Method::POST) => call.create_vm(),
        ("qemu", [id, rest @ ..], _) => call.vm_endpoint(id, rest),
        _ => call.not_impl(),
    }
}

/// Token auth (pve-http-server src/PVE/APIServer/AnyEvent.pm: `PVEAPIToken=` then
/// `USER@REALM!TOKENID=SECRET`); `Err` is the 401 PVE answers.
fn authenticate(headers: &HeaderMap, o: &ProxmoxDoubleOptions) -> Result<(), Box<Response>> {
    let auth = headers
        .get("authorization")
        .and_then(|v| v.to_str().ok())
        .unwrap_or("");
    let Some(token) = auth.strip_prefix("PVEAPIToken=") else {
        return Err(Box::new(fail(StatusCode::UNAUTHORIZED, "No ticket")));
    };
    match token.split_once('=') {
        Some((id, secret)) if id == o.token_id && secret == o.secret => Ok(()),
        _ => Err(Box::new(fail(
            StatusCode::UNAUTHORIZED,
            "authentication failure",
        ))),
    }
}

/// One authenticated request as the endpoint handlers see it: the double's state (locked
/// for the whole request), its settings, the method and path, and the query and form
/// parameters merged.
struct Call<'a> {
    st: &'a mut State,
    o: &'a ProxmoxDoubleOptions,
    method: Method,
    rel: &'a str,
    params: BTreeMap<String, String>,
}

impl Call<'_> {
    /// PVE's answer for a method an endpoint lacks (pve-manager PVE/HTTPServer.pm).
    fn not_impl(&self) -> Response {
        fail(
            StatusCode::NOT_IMPLEMENTED,
            format!("Method '{} {}' not implemented", self.method, self.rel),
        )
    }

    /// `GET /nodes/{node}/tasks/{upid}/status` (pve-manager PVE/API2/Tasks.pm): `running`
    /// for the task's first poll, then `stopped` with its exit status, the task's effect on
    /// the VMs taking place at that moment.
    fn task_status(&mut self, upid: &str) -> Response {
        let (st, o) = (&mut *self.st, self.o);
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

    /// `GET /nodes/{node}/qemu`: every VM with its name, status and tags.
    fn list_vms(&self) -> Response {
        let list: Vec<Value> = self
            .st
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

    /// `POST /nodes/{node}/qemu`: every parameter checked first (all refusals in one 400),
    /// then a `qmcreate` task that creates the VM when it stops.
    fn create_vm(&mut self) -> Response {
        let o = self.o;
        let mut errors = BTreeMap::new();
        let vmid = match self.params.remove("vmid") {
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
        for (k, v) in &self.params {
            if let Err(e) = check_param(k, v, o) {
                errors.insert(k.clone(), e.to_string());
            }
        }
        if !errors.is_empty() {
            return param_fail(errors);
        }
        let vmid = vmid.expect("checked");
        if self.st.vms.contains_key(&vmid) {
            return fail(
                StatusCode::INTERNAL_SERVER_ERROR,
                format!(
                    "unable to create VM {vmid} - VM {vmid} already exists on node '{}'",
                    o.node
                ),
            );
        }
        let vm = SimVm {
            config: std::mem::take(&mut self.params),
            running: false,
        };
        new_task(
            self.st,
            o,
            "qmcreate",
            vmid,
            "OK".into(),
            Effect::Create(vmid, vm),
        )
    }

    /// `/nodes/{node}/qemu/{vmid}/...`: the VM id checked, the method checked against what
    /// the endpoint has, the VM looked up, then the endpoint.
    fn vm_endpoint(&mut self, id: &str, rest: &[&str]) -> Response {
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
        if !allowed.contains(&self.method) {
            return self.not_impl();
        }
        let Some(vm) = self.st.vms.get(&vmid).cloned() else {
            return fail(
                StatusCode::INTERNAL_SERVER_ERROR,
                format!(
                    "Configuration file 'nodes/{}/qemu-server/{vmid}.conf' does not exist",
                    self.o.node
                ),
            );
        };
        // One arm per endpoint; kept whole so the routes read in one place.
        match (rest, self.method.clone()) {
            ([], Method::GET) => answer(
                StatusCode::OK,
                json!([{"subdir": "config"}, {"subdir": "status"}]),
            ),
            ([], Method::DELETE) => self.destroy_vm(vmid, &vm),
            (["config"], Method::GET) => vm_config(&vm),
            (["config"], _) => self.set_vm_config(vmid, &vm),
            (["status", "current"], _) => vm_status(vmid, &vm),
            (["status", action], _) => self.vm_action(vmid, &vm, action),
            _ => self.not_impl(),
        }
    }

    /// `DELETE /nodes/{node}/qemu/{vmid}`: refused while the VM runs, else a `qmdestroy`
    /// task.
    fn destroy_vm(&mut self, vmid: u32, vm: &SimVm) -> Response {
        if vm.running {
            return fail(
                StatusCode::INTERNAL_SERVER_ERROR,
                format!("VM {vmid} is running - destroy failed"),
            );
        }
        new_task(
            self.st,
            self.o,
            "qmdestroy",
            vmid,
            "OK".into(),
            Effect::Destroy(vmid),
        )
    }

    /// `POST` (async, a `qmconfig` task) or `PUT` (sync) `/nodes/{node}/qemu/{vmid}/config`:
    /// every parameter checked, and a boot order naming only devices the VM has.
    fn set_vm_config(&mut self, vmid: u32, vm: &SimVm) -> Response {
        let o = self.o;
        let mut errors = BTreeMap::new();
        for (k, v) in &self.params {
            if k == "digest" || k == "delete" {
                continue;
            }
            if let Err(e) = check_param(k, v, o) {
                errors.insert(k.clone(), e.to_string());
            }
        }
        if let Some(order) = self
            .params
            .get("boot")
            .and_then(|b| b.strip_prefix("order="))
            && let Some(missing) = order.split(';').find(|d| !vm.config.contains_key(*d))
        {
            errors.insert(
                "boot".into(),
                format!("invalid bootorder: device '{missing}' does not exist'"),
            );
        }
        if !errors.is_empty() {
            return param_fail(errors);
        }
        let entry = self.st.vms.get_mut(&vmid).expect("present");
        for (k, v) in std::mem::take(&mut self.params) {
            entry.config.insert(k, v);
        }
        if self.method == Method::POST {
            new_task(self.st, o, "qmconfig", vmid, "OK".into(), Effect::None)
        } else {
            answer(StatusCode::OK, Value::Null)
        }
    }

    /// `POST /nodes/{node}/qemu/{vmid}/status/{action}`: a task whose exit status says
    /// what PVE says for that action in the VM's state, and which changes the power state
    /// when it stops.
    fn vm_action(&mut self, vmid: u32, vm: &SimVm, action: &str) -> Response {
        let (kind, exit, effect) = match (action, vm.running) {
            ("start", true) => (
                "qmstart",
                format!("VM {vmid} already running"),
                Effect::None,
            ),
            ("start", false) => ("qmstart", "OK".into(), Effect::Run(vmid, true)),
            ("stop", _) => ("qmstop", "OK".into(), Effect::Run(vmid, false)),
            ("shutdown", _) => ("qmshutdown", "OK".into(), Effect::Run(vmid, false)),
            ("reset", true) => ("qmreset", "OK".into(), Effect::None),
            ("reset", false) => ("qmreset", format!("VM {vmid} not running"), Effect::None),
            _ => return self.not_impl(),
        };
        new_task(self.st, self.o, kind, vmid, exit, effect)
    }
}

/// `GET /nodes/{node}/qemu/{vmid}/config`: the config with numbers typed as PVE types them,
/// and a digest.
fn vm_config(vm: &SimVm) -> Response {
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

/// `GET /nodes/{node}/qemu/{vmid}/status/current`.
fn vm_status(vmid: u32, vm: &SimVm) -> Response {
    answer(
        StatusCode::OK,
        json!({
            "vmid": vmid,
            "name": vm.config.get("name").cloned().unwrap_or_default(),
            "status": if vm.running { "running" } else { "stopped" },
            "qmpstatus": if vm.running { "running" } else { "stopped" },
        }),
    )
}
