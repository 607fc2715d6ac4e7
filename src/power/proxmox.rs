//! The Proxmox VE driver: a small client of the PVE REST API (`/api2/json`) owning one VM's
//! power and boot order, plus the few calls `talboot proxmox create|destroy` needs (create,
//! config, list, delete), with API-token auth and task (UPID) polling.
//!
//! Written from the Proxmox VE API reference (pve.proxmox.com/pve-docs/api-viewer) and its
//! sources; each behaviour relied on has a row in docs/conformance.md:
//! - auth: header `Authorization: PVEAPIToken=USER@REALM!TOKENID=SECRET`
//!   (proxmox/pve-http-server src/PVE/APIServer/AnyEvent.pm);
//! - JSON answers are `{"data": ...}`; errors keep the HTTP status and add `message` (and
//!   `errors`, per parameter, for 400) (src/PVE/APIServer/Formatter/Standard.pm);
//! - `GET /nodes/{node}/qemu/{vmid}/status/current` -> `status` `running`|`stopped`;
//!   `POST .../status/{start,stop,reset}`, `POST /nodes/{node}/qemu` (create),
//!   `POST .../config` and `DELETE /nodes/{node}/qemu/{vmid}` answer a task UPID
//!   (proxmox/qemu-server PVE/API2/Qemu.pm);
//! - `GET /nodes/{node}/tasks/{upid}/status` -> `status` `running`|`stopped` and, once
//!   stopped, `exitstatus` `OK` or the error (proxmox/pve-manager PVE/API2/Tasks.pm).
//!
//! Proxmox has no one-time boot device: the boot order (`boot: order=net0;scsi0`) is the
//! VM's config, so [`BootPersistence::Once`] is carried out as a persistent order (logged).

use std::time::Duration;

use reqwest::{Method, StatusCode};
use serde_json::Value;

use futures_util::future::BoxFuture;

use super::{BootDevice, BootPersistence, BootSet, PowerAction, PowerError, PowerState};
use crate::inventory::{Credential, ProxmoxTarget};

/// The tag `talboot proxmox create` puts on every VM it creates; `destroy` touches no other.
pub(crate) const TALBOOT_TAG: &str = "talboot";

/// How to reach a Proxmox VE API.
#[derive(Debug, Clone)]
pub struct ProxmoxApiConfig {
    /// `https://pve.example:8006` (no path).
    pub api_url: String,
    /// `USER@REALM!TOKENID`.
    pub token_id: String,
    /// The token's secret (a UUID).
    pub secret: Credential,
    pub verify_tls: bool,
    pub ca_pem: Option<Vec<u8>>,
    pub timeout: Duration,
}

impl ProxmoxApiConfig {
    pub fn new(
        api_url: impl Into<String>,
        token_id: impl Into<String>,
        secret: Credential,
    ) -> Self {
        Self {
            api_url: api_url.into(),
            token_id: token_id.into(),
            secret,
            verify_tls: true,
            ca_pem: None,
            timeout: Duration::from_secs(30),
        }
    }
}

/// Why a token id is not `USER@REALM!TOKENID` (each variant holds the id as written).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub(crate) enum TokenIdError {
    /// No `!` before a token name.
    #[error("token id `{0}` has no `!TOKENID`; write USER@REALM!TOKENID")]
    NoTokenName(String),
    /// No `@` before a realm.
    #[error("token id `{0}` has no `@REALM`; write USER@REALM!TOKENID")]
    NoRealm(String),
    /// An empty user, or a realm or token name with other characters.
    #[error("token id `{0}` is not USER@REALM!TOKENID")]
    Malformed(String),
}

/// `USER@REALM!TOKENID` is the token id's shape (pve-access-control PVE/AccessControl.pm,
/// `pve_verify_tokenid`): a user id with a realm, then `!` and the token name.
pub(crate) fn check_token_id(id: &str) -> Result<(), TokenIdError> {
    let (user, token) = id
        .split_once('!')
        .ok_or_else(|| TokenIdError::NoTokenName(id.to_owned()))?;
    let (name, realm) = user
        .split_once('@')
        .ok_or_else(|| TokenIdError::NoRealm(id.to_owned()))?;
    let ok = |s: &str| {
        !s.is_empty()
            && s.chars()
                .all(|c| c.is_ascii_alphanumeric() || "-_.".contains(c))
    };
    if name.is_empty() || !ok(realm) || !ok(token) {
        return Err(TokenIdError::Malformed(id.to_owned()));
    }
    Ok(())
}

/// The `Authorization` header value.
pub(crate) fn auth_header(token_id: &str, secret: &Credential) -> String {
    format!("PVEAPIToken={token_id}={}", secret.expose())
}

/// The VM config `boot` value that puts `device` first (network: the first NIC, then the
/// disk; disk: the other way round).
pub(crate) fn boot_order(device: BootDevice, net: &str, disk: &str) -> String {
    match device {
        BootDevice::Network => format!("order={net};{disk}"),
        BootDevice::Disk => format!("order={disk};{net}"),
    }
}

/// `application/x-www-form-urlencoded`, the body PVE takes for POST/PUT parameters.
pub(crate) fn form_body(params: &[(&str, String)]) -> String {
    let mut u = reqwest::Url::parse("http://x/").expect("static URL");
    u.query_pairs_mut()
        .extend_pairs(params.iter().map(|(k, v)| (*k, v.as_str())));
    u.query().unwrap_or("").to_string()
}

/// Why a PVE answer was an error: `message` and any per-parameter `errors`.
pub(crate) fn error_text(status: StatusCode, body: &str) -> String {
    let v: Value = serde_json::from_str(body).unwrap_or(Value::Null);
    let mut s = v
        .get("message")
        .and_then(Value::as_str)
        .map(|m| m.trim().to_string())
        .unwrap_or_else(|| status.canonical_reason().unwrap_or("error").to_string());
    if let Some(errs) = v.get("errors").and_then(Value::as_object) {
        let parts: Vec<String> = errs
            .iter()
            .map(|(k, e)| format!("{k}: {}", e.as_str().unwrap_or("").trim()))
            .collect();
        s.push_str(&format!(" ({})", parts.join("; ")));
    }
    s
}

/// A stopped task's exit status other than `OK`, as PVE wrote it (`VM 100 already running`).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{0}")]
pub(crate) struct TaskFailed(pub String);

impl From<&str> for TaskFailed {
    fn from(exit: &str) -> Self {
        Self(exit.to_owned())
    }
}

/// Why a task's status answer says neither running nor stopped with an exit status.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub(crate) enum TaskStatusError {
    /// `stopped` without `exitstatus`.
    #[error("a stopped task without exitstatus")]
    NoExitStatus,
    /// A `status` other than `running` or `stopped` (or none).
    #[error("unexpected task status {0:?}")]
    Unexpected(Option<String>),
}

/// A task's state from `tasks/{upid}/status`: `None` while running, else the exit status.
pub(crate) fn task_outcome(
    data: &Value,
) -> Result<Option<Result<(), TaskFailed>>, TaskStatusError> {
    match data.get("status").and_then(Value::as_str) {
        Some("running") => Ok(None),
        Some("stopped") => match data.get("exitstatus").and_then(Value::as_str) {
            Some("OK") => Ok(Some(Ok(()))),
            Some(other) => Ok(Some(Err(other.into()))),
            None => Err(TaskStatusError::NoExitStatus),
        },
        other => Err(TaskStatusError::Unexpected(other.map(str::to_owned))),
    }
}

/// A UPID, `UPID:NODE:PID:PSTART:STARTTIME:TYPE:ID:USER:`, is what async calls return.
pub(crate) fn is_upid(s: &str) -> bool {
    s.starts_with("UPID:") && s.ends_with(':') && s.split(':').count() >= 9
}

/// A Proxmox VE API client.
pub struct ProxmoxApi {
    cfg: ProxmoxApiConfig,
    base: reqwest::Url,
    client: reqwest::Client,
    /// How often a task's status is polled.
    pub poll: Duration,
    /// How long a task may run.
    pub task_limit: Duration,
}

impl std::fmt::Debug for ProxmoxApi {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ProxmoxApi")
            .field("api_url", &self.cfg.api_url)
            .field("token_id", &self.cfg.token_id)
            .finish_non_exhaustive()
    }
}

impl ProxmoxApi {
    pub fn new(cfg: ProxmoxApiConfig) -> Result<Self, PowerError> {
        let bad = |reason: String| PowerError::Protocol {
            target: cfg.api_url.clone(),
            reason,
        };
        check_token_id(&cfg.token_id).map_err(|e| bad(e.to_string()))?;
        let base = reqwest::Url::parse(&cfg.api_url).map_err(|e| {
            bad(format!(
                "the API URL is not a URL ({e}); write https://HOST:8006"
            ))
        })?;
        if !matches!(base.scheme(), "https" | "http")
            || base.host_str().is_none()
            || !base.username().is_empty()
            || base.password().is_some()
        {
            return Err(PowerError::Protocol {
                target: format!("{}://{}", base.scheme(), base.host_str().unwrap_or("")),
                reason: "the API URL must be https://HOST:8006 with no user info".into(),
            });
        }
        let client = super::http_client(
            "Proxmox",
            &cfg.api_url,
            cfg.timeout,
            cfg.ca_pem.as_deref(),
            cfg.verify_tls,
            reqwest::redirect::Policy::none(),
        )
        .map_err(|e| bad(e.to_string()))?;
        Ok(Self {
            cfg,
            base,
            client,
            poll: Duration::from_millis(500),
            task_limit: Duration::from_secs(300),
        })
    }

    fn target(&self) -> String {
        self.cfg.api_url.clone()
    }

    /// Call `/api2/json{path}` and return its `data`.
    pub async fn call(
        &self,
        method: Method,
        path: &str,
        params: &[(&str, String)],
    ) -> Result<Value, PowerError> {
        let mut url =
            self.base
                .join(&format!("/api2/json{path}"))
                .map_err(|e| PowerError::Protocol {
                    target: self.target(),
                    reason: format!("bad API path {path:?}: {e}"),
                })?;
        let mut req;
        if method == Method::GET || method == Method::DELETE {
            if !params.is_empty() {
                url.set_query(Some(&form_body(params)));
            }
            req = self.client.request(method.clone(), url);
        } else {
            req = self
                .client
                .request(method.clone(), url)
                .header(
                    reqwest::header::CONTENT_TYPE,
                    "application/x-www-form-urlencoded",
                )
                .body(form_body(params));
        }
        req = req.header(
            reqwest::header::AUTHORIZATION,
            auth_header(&self.cfg.token_id, &self.cfg.secret),
        );
        let resp = req.send().await.map_err(|e| PowerError::Unreachable {
            target: self.target(),
            reason: e.without_url().to_string(),
        })?;
        let status = resp.status();
        let body = resp.text().await.unwrap_or_default();
        tracing::debug!(api = %self.cfg.api_url, %method, path, status = status.as_u16(), "proxmox");
        if status == StatusCode::UNAUTHORIZED {
            return Err(PowerError::Unauthorized {
                target: self.target(),
            });
        }
        if !status.is_success() {
            return Err(PowerError::Protocol {
                target: self.target(),
                reason: format!("{method} {path}: {status}: {}", error_text(status, &body)),
            });
        }
        let v: Value = serde_json::from_str(&body).map_err(|e| PowerError::Protocol {
            target: self.target(),
            reason: format!("{method} {path}: not JSON ({e})"),
        })?;
        Ok(v.get("data").cloned().unwrap_or(Value::Null))
    }

    /// Call an endpoint that starts a task and wait for the task to end.
    pub async fn call_task(
        &self,
        node: &str,
        method: Method,
        path: &str,
        params: &[(&str, String)],
    ) -> Result<(), PowerError> {
        let data = self.call(method.clone(), path, params).await?;
        let upid = data
            .as_str()
            .filter(|s| is_upid(s))
            .ok_or_else(|| PowerError::Protocol {
                target: self.target(),
                reason: format!("{method} {path}: expected a task UPID, got {data}"),
            })?;
        self.wait_task(node, upid).await
    }

    /// Poll `GET /nodes/{node}/tasks/{upid}/status` until the task stops.
    pub(crate) async fn wait_task(&self, node: &str, upid: &str) -> Result<(), PowerError> {
        let start = tokio::time::Instant::now();
        let path = format!("/nodes/{node}/tasks/{}/status", encode_segment(upid));
        loop {
            let data = self.call(Method::GET, &path, &[]).await?;
            match task_outcome(&data).map_err(|e| PowerError::Protocol {
                target: self.target(),
                reason: e.to_string(),
            })? {
                Some(Ok(())) => return Ok(()),
                Some(Err(exit)) => {
                    return Err(PowerError::Protocol {
                        target: self.target(),
                        reason: format!("task {upid} failed: {exit}"),
                    });
                }
                None => {}
            }
            if start.elapsed() >= self.task_limit {
                return Err(PowerError::Timeout {
                    target: self.target(),
                    what: format!("task {upid}"),
                    waited: self.task_limit,
                });
            }
            tokio::time::sleep(self.poll).await;
        }
    }

    /// `GET /nodes/{node}/qemu`: the node's VMs.
    pub(crate) async fn list_vms(&self, node: &str) -> Result<Vec<VmSummary>, PowerError> {
        let data = self
            .call(Method::GET, &format!("/nodes/{node}/qemu"), &[])
            .await?;
        let list = data.as_array().cloned().unwrap_or_default();
        Ok(list
            .iter()
            .filter_map(|v| {
                Some(VmSummary {
                    vmid: v.get("vmid")?.as_u64()? as u32,
                    name: v
                        .get("name")
                        .and_then(Value::as_str)
                        .unwrap_or("")
                        .to_string(),
                    running: v.get("status").and_then(Value::as_str) == Some("running"),
                    tags: parse_tags(v.get("tags").and_then(Value::as_str).unwrap_or("")),
                })
            })
            .collect())
    }

    /// `GET /nodes/{node}/qemu/{vmid}/config`.
    pub(crate) async fn vm_config(&self, node: &str, vmid: u32) -> Result<Value, PowerError> {
        self.call(
            Method::GET,
            &format!("/nodes/{node}/qemu/{vmid}/config"),
            &[],
        )
        .await
    }

    /// A driver for one VM.
    pub fn vm(self: &std::sync::Arc<Self>, node: &str, vmid: u32) -> ProxmoxVm {
        ProxmoxVm {
            api: self.clone(),
            node: node.to_string(),
            vmid,
            net: "net0".into(),
            disk: "scsi0".into(),
        }
    }
}

/// A VM as `GET /nodes/{node}/qemu` lists it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct VmSummary {
    pub vmid: u32,
    pub name: String,
    pub running: bool,
    pub tags: Vec<String>,
}

/// PVE keeps tags as one string separated by `;` (also `,` or spaces on input).
pub(crate) fn parse_tags(s: &str) -> Vec<String> {
    s.split([';', ',', ' '])
        .filter(|t| !t.is_empty())
        .map(str::to_string)
        .collect()
}

fn encode_segment(s: &str) -> String {
    // UPIDs hold only [A-Za-z0-9:@!._-]; `:` and `@` are legal in a path segment, `!` too.
    s.to_string()
}

/// One VM's power and boot order: the Proxmox power driver.
#[derive(Debug, Clone)]
pub struct ProxmoxVm {
    api: std::sync::Arc<ProxmoxApi>,
    pub node: String,
    pub vmid: u32,
    /// The boot NIC and disk named in the boot order.
    pub net: String,
    pub disk: String,
}

impl ProxmoxVm {
    fn path(&self, tail: &str) -> String {
        format!("/nodes/{}/qemu/{}{tail}", self.node, self.vmid)
    }

    pub async fn power_state(&self) -> Result<PowerState, PowerError> {
        let data = self
            .api
            .call(Method::GET, &self.path("/status/current"), &[])
            .await?;
        Ok(match data.get("status").and_then(Value::as_str) {
            Some("running") => PowerState::On,
            Some("stopped") => PowerState::Off,
            _ => PowerState::Unknown,
        })
    }

    pub async fn set_power(&self, action: PowerAction) -> Result<(), PowerError> {
        let state = self.power_state().await?;
        let call = match (action, state) {
            (PowerAction::On, PowerState::On) | (PowerAction::Off, PowerState::Off) => None,
            (PowerAction::On, _) | (PowerAction::Cycle, PowerState::Off) => Some("start"),
            (PowerAction::Off, _) => Some("stop"),
            (PowerAction::Cycle, _) => Some("reset"),
        };
        let Some(call) = call else {
            return Ok(());
        };
        tracing::info!(node = %self.node, vmid = self.vmid, call, "proxmox power");
        self.api
            .call_task(
                &self.node,
                Method::POST,
                &self.path(&format!("/status/{call}")),
                &[],
            )
            .await
    }

    pub async fn set_boot_device(
        &self,
        device: BootDevice,
        persistence: BootPersistence,
    ) -> Result<(), PowerError> {
        if persistence == BootPersistence::Once {
            tracing::info!(
                vmid = self.vmid,
                "Proxmox has no one-time boot device; setting the boot order"
            );
        }
        // PUT config is the synchronous form (POST would start a task).
        self.api
            .call(
                Method::PUT,
                &self.path("/config"),
                &[("boot", boot_order(device, &self.net, &self.disk))],
            )
            .await
            .map(|_| ())
    }
}

/// A VM's Secure Boot set-up from its config (proxmox/qemu-server 9.2.6,
/// `src/PVE/QemuServer/Drive.pm`: `efidisk0` is `<volume>,efitype=2m|4m,pre-enrolled-keys=0|1`,
/// `pre-enrolled-keys` "use an EFI vars template with distribution-specific and Microsoft
/// Standard keys enrolled, if used with efitype=4m"; `src/PVE/QemuServer/OVMF.pm` picks that
/// template only for `efitype=4m` on x86_64, and on aarch64 whatever the efitype). `bios`
/// defaults to `seabios`; aarch64 VMs are always UEFI.
pub(crate) fn secure_boot_of(config: &Value) -> crate::power::secureboot::SecureBootProbe {
    let s = |k: &str| config.get(k).and_then(Value::as_str);
    let aarch64 = s("arch") == Some("aarch64");
    let efidisk = s("efidisk0");
    let opt = |name: &str| {
        efidisk.and_then(|d| {
            d.split(',')
                .filter_map(|kv| kv.split_once('='))
                .find(|(k, _)| *k == name)
                .map(|(_, v)| v)
        })
    };
    let keys = matches!(opt("pre-enrolled-keys"), Some("1" | "true" | "yes" | "on"));
    crate::power::secureboot::SecureBootProbe::Proxmox {
        ovmf: aarch64 || s("bios") == Some("ovmf"),
        efidisk: efidisk.is_some(),
        pre_enrolled_keys: keys && (aarch64 || opt("efitype") == Some("4m")),
    }
}

/// The inventory documents the API base with or without Proxmox's `/api2/json` suffix; the
/// client adds it itself.
fn proxmox_base(api_url: &str) -> &str {
    let trimmed = api_url.trim_end_matches('/');
    trimmed.strip_suffix("/api2/json").unwrap_or(trimmed)
}

/// The Proxmox API client of a resolved target (also what `talboot proxmox` uses).
pub(crate) fn proxmox_api(t: &ProxmoxTarget) -> Result<std::sync::Arc<ProxmoxApi>, PowerError> {
    let base = proxmox_base(&t.api_url);
    let mut cfg = ProxmoxApiConfig::new(base, t.token_id.clone(), t.token_secret.clone());
    cfg.verify_tls = t.verify_tls;
    cfg.ca_pem = super::read_ca(t.ca.as_deref(), base)?;
    Ok(std::sync::Arc::new(ProxmoxApi::new(cfg)?))
}

fn proxmox(t: &ProxmoxTarget) -> Result<ProxmoxVm, PowerError> {
    Ok(proxmox_api(t)?.vm(&t.node, t.vmid))
}

/// The Proxmox driver: an API client per request, on the target's VM.
impl super::Driver for ProxmoxTarget {
    fn set_power(&self, action: PowerAction) -> BoxFuture<'_, Result<(), PowerError>> {
        Box::pin(async move { proxmox(self)?.set_power(action).await })
    }

    fn power_state(&self) -> BoxFuture<'_, Result<PowerState, PowerError>> {
        Box::pin(async move { proxmox(self)?.power_state().await })
    }

    fn secure_boot(
        &self,
    ) -> BoxFuture<'_, Result<crate::power::secureboot::SecureBootProbe, PowerError>> {
        Box::pin(async move {
            let config = proxmox_api(self)?.vm_config(&self.node, self.vmid).await?;
            Ok(secure_boot_of(&config))
        })
    }

    fn set_boot_device(
        &self,
        device: BootDevice,
        persistence: BootPersistence,
    ) -> BoxFuture<'_, Result<BootSet, PowerError>> {
        Box::pin(async move {
            proxmox(self)?
                .set_boot_device(device, persistence)
                .await
                .map(|()| BootSet::default())
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn token_ids_are_user_realm_bang_token() {
        assert!(check_token_id("talboot@pve!power").is_ok());
        assert!(check_token_id("root@pam!t-1").is_ok());
        for bad in [
            "talboot@pve",
            "talboot!power",
            "@pve!x",
            "a@pve!",
            "a@p v e!x",
        ] {
            assert!(check_token_id(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn the_auth_header_is_pveapitoken() {
        let h = auth_header("u@pve!t", &Credential::new("0000-1111"));
        assert_eq!(h, "PVEAPIToken=u@pve!t=0000-1111");
    }

    #[test]
    fn boot_orders_and_forms() {
        assert_eq!(
            boot_order(BootDevice::Network, "net0", "scsi0"),
            "order=net0;scsi0"
        );
        assert_eq!(
            boot_order(BootDevice::Disk, "net0", "scsi0"),
            "order=scsi0;net0"
        );
        assert_eq!(
            form_body(&[
                ("boot", "order=net0;scsi0".into()),
                ("net0", "virtio=BC:24:11:00:00:01,bridge=vmbr0".into())
            ]),
            "boot=order%3Dnet0%3Bscsi0&net0=virtio%3DBC%3A24%3A11%3A00%3A00%3A01%2Cbridge%3Dvmbr0"
        );
    }

    #[test]
    fn errors_and_tasks_read_as_pve_writes_them() {
        let e = error_text(
            StatusCode::BAD_REQUEST,
            r#"{"data":null,"message":"Parameter verification failed.\n","errors":{"memory":"type check ('integer') failed\n"}}"#,
        );
        assert_eq!(
            e,
            "Parameter verification failed. (memory: type check ('integer') failed)"
        );
        assert_eq!(
            error_text(StatusCode::NOT_IMPLEMENTED, "garbage"),
            "Not Implemented"
        );
        assert_eq!(task_outcome(&json!({"status": "running"})), Ok(None));
        assert_eq!(
            task_outcome(&json!({"status": "stopped", "exitstatus": "OK"})),
            Ok(Some(Ok(())))
        );
        assert_eq!(
            task_outcome(&json!({"status": "stopped", "exitstatus": "VM 100 already running"})),
            Ok(Some(Err("VM 100 already running".into())))
        );
        assert!(task_outcome(&json!({})).is_err());
        assert!(is_upid(
            "UPID:pve:0001A2B3:00C0FFEE:65F00000:qmstart:100:talboot@pve!power:"
        ));
        assert!(!is_upid("OK"));
        assert_eq!(parse_tags("talboot;k8s"), vec!["talboot", "k8s"]);
    }

    #[test]
    fn secure_boot_is_read_from_bios_and_efidisk0() {
        use crate::power::secureboot::SecureBootProbe::Proxmox;
        let sb = |v: Value| secure_boot_of(&v);
        assert_eq!(
            sb(json!({"bios": "ovmf",
                      "efidisk0": "local-lvm:vm-100-disk-1,efitype=4m,pre-enrolled-keys=1,size=4M"})),
            Proxmox {
                ovmf: true,
                efidisk: true,
                pre_enrolled_keys: true
            }
        );
        // The keyed template is used only with efitype=4m on x86_64.
        assert_eq!(
            sb(
                json!({"bios": "ovmf", "efidisk0": "local:100/vm-100-disk-0.qcow2,pre-enrolled-keys=1"})
            ),
            Proxmox {
                ovmf: true,
                efidisk: true,
                pre_enrolled_keys: false
            }
        );
        assert_eq!(
            sb(json!({"arch": "aarch64", "efidisk0": "local:vm-1-disk-0,pre-enrolled-keys=1"})),
            Proxmox {
                ovmf: true,
                efidisk: true,
                pre_enrolled_keys: true
            }
        );
        assert_eq!(
            sb(json!({"boot": "order=net0"})),
            Proxmox {
                ovmf: false,
                efidisk: false,
                pre_enrolled_keys: false
            }
        );
    }

    #[test]
    fn the_proxmox_base_drops_the_api_suffix_either_way() {
        assert_eq!(
            proxmox_base("https://pve:8006/api2/json"),
            "https://pve:8006"
        );
        assert_eq!(
            proxmox_base("https://pve:8006/api2/json/"),
            "https://pve:8006"
        );
        assert_eq!(proxmox_base("https://pve:8006"), "https://pve:8006");
    }
}
