//! UEFI Secure Boot over Redfish: reading a ComputerSystem's `SecureBoot` resource and its
//! `SecureBootDatabases`, enrolling a certificate into a database's `Certificates`, turning
//! `SecureBootEnable` on, and the `ResetKeys` request body. The decisions (what the resources
//! say, which database, the request bodies, what a refused POST means) are pure functions;
//! the [`Redfish`] methods at the end put them on the wire.
//!
//! Behaviour relied on (DMTF DSP8010 2025.4, DMTF/Redfish-Publications at tag 2025.4; rows in
//! docs/conformance.md, "Secure Boot key enrolment over Redfish"):
//! - `SecureBoot.v1_1_x` (`json-schema/SecureBoot.v1_1_2.json`, `csdl/SecureBoot_v1.xml`):
//!   a ComputerSystem links it as `SecureBoot`; `SecureBootEnable` (read-write, "takes effect
//!   on next boot"), `SecureBootCurrentBoot` (`Enabled`/`Disabled`), `SecureBootMode`
//!   (`SetupMode`, `UserMode`, `AuditMode`, `DeployedMode`), the `SecureBootDatabases` link
//!   (added in v1_1_0, release 2020.1) and the `#SecureBoot.ResetKeys` action whose
//!   `ResetKeysType` is `ResetAllKeysToDefault`, `DeleteAllKeys` or `DeletePK`;
//! - `SecureBootDatabase.v1_0_x` (`json-schema/SecureBootDatabase.v1_0_3.json`): `DatabaseId`
//!   (`PK`, `KEK`, `db`, `dbx`, ... and their `*Default`s, equal to `Id`), a `Certificates`
//!   link (a `CertificateCollection`) and its own `#SecureBootDatabase.ResetKeys`
//!   (`ResetAllKeysToDefault`, `DeleteAllKeys`);
//! - `Certificate.v1_x` (`json-schema/Certificate.v1_9_2.json`, `csdl/Certificate_v1.xml`):
//!   `CertificateString` and `CertificateType` are `Redfish.RequiredOnCreate`; `PEM` is "a
//!   single certificate"; `Subject` is an `Identifier` (`CommonName`, ...), `Fingerprint`
//!   with `FingerprintHashAlgorithm` since v1_3_0; `CertificateCollection` is `Insertable`
//!   ("certificates can be installed through a POST to the certificate collection"), and
//!   `@Redfish.SupportedCertificates` lists the types a collection takes;
//! - DMTF DSP0266 1.15 (Redfish Specification): "POST (create)" answers 201 with the new
//!   resource's URI in `Location`; 405 Method Not Allowed where the URI does not take the
//!   method and 501 Not Implemented where the service does not support it; "PATCH (update)"
//!   with `If-Match` where the resource has an ETag (412 when stale).

use reqwest::{Method, StatusCode};
use serde_json::{Value, json};

use super::etag::{ETAG_READS, if_match_forms};
use super::{Redfish, error_message, string_list};
use crate::power::PowerError;
use crate::power::secureboot::{EnrolCertificate, SecureBootProbe, sha256_fingerprint};

/// Where the operator is sent when Redfish cannot enrol the key.
const MANUAL: &str = "enrol the certificate in the firmware setup UI, or boot the Talos Secure \
                      Boot ISO once in setup mode (docs/operations.md, \"Secure Boot key enrolment\")";

/// A `ResetKeys` action: where to POST, and the `ResetKeysType`s it lists (`None`: not said).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct KeysAction {
    pub target: String,
    pub allowed: Option<Vec<String>>,
}

fn keys_action(v: &Value, name: &str) -> Option<KeysAction> {
    let a = v.get("Actions")?.get(name)?;
    Some(KeysAction {
        target: a.get("target")?.as_str()?.to_string(),
        allowed: string_list(a.get("ResetKeysType@Redfish.AllowableValues")),
    })
}

fn link(v: &Value, name: &str) -> Option<String> {
    v.get(name)?.get("@odata.id")?.as_str().map(str::to_string)
}

/// The `SecureBoot` resource as talboot reads it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SecureBootView {
    pub path: String,
    pub enable: Option<bool>,
    pub current_boot: Option<String>,
    pub mode: Option<String>,
    /// The `SecureBootDatabases` collection (none before SecureBoot v1_1_0).
    pub databases: Option<String>,
    pub reset_keys: Option<KeysAction>,
}

impl SecureBootView {
    /// The driver-neutral reading `check --probe` judges.
    pub fn probe(&self) -> SecureBootProbe {
        SecureBootProbe::Redfish {
            enable: self.enable,
            current_boot: self.current_boot.clone(),
            mode: self.mode.clone(),
        }
    }
}

/// The ComputerSystem's link to its `SecureBoot` resource, if it has one.
pub fn secure_boot_link(system: &Value) -> Option<String> {
    link(system, "SecureBoot")
}

/// Read a `SecureBoot` resource fetched from `path`.
pub fn secure_boot_view(v: &Value, path: &str) -> SecureBootView {
    let s = |k: &str| v.get(k).and_then(Value::as_str).map(str::to_string);
    SecureBootView {
        path: path.to_string(),
        enable: v.get("SecureBootEnable").and_then(Value::as_bool),
        current_boot: s("SecureBootCurrentBoot"),
        mode: s("SecureBootMode"),
        databases: link(v, "SecureBootDatabases"),
        reset_keys: keys_action(v, "#SecureBoot.ResetKeys"),
    }
}

/// One `SecureBootDatabase`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DatabaseView {
    /// `DatabaseId`, else `Id`, else the last path segment.
    pub id: String,
    pub path: String,
    pub certificates: Option<String>,
    pub reset_keys: Option<KeysAction>,
}

/// Read a `SecureBootDatabase` fetched from `path`.
pub fn database_view(v: &Value, path: &str) -> DatabaseView {
    let id = ["DatabaseId", "Id"]
        .iter()
        .find_map(|k| v.get(*k).and_then(Value::as_str))
        .map(str::to_string)
        .unwrap_or_else(|| {
            path.trim_end_matches('/')
                .rsplit('/')
                .next()
                .unwrap_or_default()
                .to_string()
        });
    DatabaseView {
        id,
        path: path.to_string(),
        certificates: link(v, "Certificates"),
        reset_keys: keys_action(v, "#SecureBootDatabase.ResetKeys"),
    }
}

/// The `@odata.id` of each member of a collection.
pub(crate) fn members(collection: &Value) -> Vec<String> {
    collection
        .get("Members")
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
        .filter_map(|m| m.get("@odata.id").and_then(Value::as_str))
        .map(str::to_string)
        .collect()
}

/// One certificate in a database, as far as the BMC exposes it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CertificateView {
    pub path: String,
    /// `Subject` as `CN=..., O=...` (the `Identifier` fields the BMC gives).
    pub subject: Option<String>,
    /// `FingerprintHashAlgorithm` and `Fingerprint` as the BMC gives them.
    pub fingerprint: Option<(String, String)>,
    /// SHA-256 over the DER of `CertificateString`, computed here (Talos's format), when
    /// the BMC returns the certificate itself.
    pub sha256: Option<String>,
}

/// Read a `Certificate` fetched from `path`.
pub fn certificate_view(v: &Value, path: &str) -> CertificateView {
    let subject = v.get("Subject").and_then(|s| {
        let parts: Vec<String> = [
            ("CommonName", "CN"),
            ("OrganizationalUnit", "OU"),
            ("Organization", "O"),
            ("City", "L"),
            ("State", "ST"),
            ("Country", "C"),
        ]
        .iter()
        .filter_map(|(k, short)| {
            s.get(*k)
                .and_then(Value::as_str)
                .map(|x| format!("{short}={x}"))
        })
        .collect();
        (!parts.is_empty()).then(|| parts.join(", "))
    });
    let fingerprint = v.get("Fingerprint").and_then(Value::as_str).map(|f| {
        let alg = v
            .get("FingerprintHashAlgorithm")
            .and_then(Value::as_str)
            .unwrap_or("unknown hash");
        (alg.to_string(), f.to_string())
    });
    let sha256 = v
        .get("CertificateString")
        .and_then(Value::as_str)
        .and_then(|s| pem::parse(s).ok())
        .filter(|p| p.tag() == "CERTIFICATE")
        .map(|p| sha256_fingerprint(p.contents()));
    CertificateView {
        path: path.to_string(),
        subject,
        fingerprint,
        sha256,
    }
}

/// The body POSTed to a database's `Certificates`: the two properties the Certificate schema
/// requires on create.
pub fn enroll_body(cert: &EnrolCertificate) -> Value {
    json!({"CertificateString": cert.pem, "CertificateType": "PEM"})
}

/// The PATCH that turns Secure Boot on for the next boot.
pub fn enable_patch() -> Value {
    json!({"SecureBootEnable": true})
}

/// Why a Secure Boot request is not made: what the BMC lacks, and the way round it.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum SecureBootRefusal {
    /// The ComputerSystem links no `SecureBoot`, or it is not there.
    #[error("the BMC has no SecureBoot resource for {system}; {MANUAL}")]
    NoSecureBoot { system: String },
    /// `SecureBoot` without `SecureBootDatabases` (before SecureBoot v1_1_0).
    #[error(
        "the BMC's SecureBoot resource ({path}) has no SecureBootDatabases (added in DMTF \
         SecureBoot v1_1_0), so keys cannot be enrolled over Redfish; {MANUAL}"
    )]
    NoDatabases { path: String },
    /// No database of that name.
    #[error(
        "the BMC has no Secure Boot database {want:?} (it has {have:?}); pass --database with one of them"
    )]
    NoDatabase { want: String, have: Vec<String> },
    /// The database has no `Certificates` collection.
    #[error("Secure Boot database {db} ({path}) has no Certificates collection; {MANUAL}")]
    NoCertificates { db: String, path: String },
    /// The collection lists the certificate types it takes, and PEM is not one.
    #[error("{path} takes only {supported:?} certificates, not PEM; {MANUAL}")]
    NoPem {
        path: String,
        supported: Vec<String>,
    },
    /// The collection refused the POST as a method it does not take.
    #[error(
        "the BMC does not take certificates into Secure Boot database {db}: POST {path} \
         answered {status}{message}; it is read-only over Redfish: {MANUAL}"
    )]
    ReadOnly {
        db: String,
        path: String,
        status: u16,
        message: String,
    },
    /// The SecureBoot resource has no `#SecureBoot.ResetKeys` action.
    #[error("{path} has no #SecureBoot.ResetKeys action; reset the keys in the firmware setup UI")]
    NoResetKeys { path: String },
    /// A `ResetKeysType` the action does not list.
    #[error("{target} does not allow ResetKeysType {want} (allows {allowed:?})")]
    ResetKeysType {
        target: String,
        want: String,
        allowed: Vec<String>,
    },
}

/// Why a Secure Boot request failed: the BMC could not be asked, or talboot refused.
#[derive(Debug, thiserror::Error)]
pub enum SecureBootError {
    #[error(transparent)]
    Power(#[from] PowerError),
    #[error("{target}: {refusal}")]
    Refused {
        target: String,
        refusal: SecureBootRefusal,
    },
}

/// The database named `want` (`DatabaseId`, exactly: UEFI names are case-sensitive, and `db`
/// is not `dbDefault`).
pub fn pick_database<'a>(
    dbs: &'a [DatabaseView],
    want: &str,
) -> Result<&'a DatabaseView, SecureBootRefusal> {
    dbs.iter()
        .find(|d| d.id == want)
        .ok_or_else(|| SecureBootRefusal::NoDatabase {
            want: want.to_string(),
            have: dbs.iter().map(|d| d.id.clone()).collect(),
        })
}

/// What a non-success answer to the certificate POST means: 405 and 501 say the collection
/// takes no POST (DSP0266 status codes), anything else is the BMC's own error.
pub fn post_refusal(db: &str, path: &str, status: u16, body: &str) -> Option<SecureBootRefusal> {
    matches!(status, 405 | 501).then(|| SecureBootRefusal::ReadOnly {
        db: db.to_string(),
        path: path.to_string(),
        status,
        message: error_message(body)
            .map(|m| format!(" ({m})"))
            .unwrap_or_default(),
    })
}

/// The `ResetKeys` body for `want`, refused when the action lists other values only.
pub fn reset_keys_body(action: &KeysAction, want: &str) -> Result<Value, SecureBootRefusal> {
    if let Some(allowed) = &action.allowed
        && !allowed.iter().any(|a| a == want)
    {
        return Err(SecureBootRefusal::ResetKeysType {
            target: action.target.clone(),
            want: want.to_string(),
            allowed: allowed.clone(),
        });
    }
    Ok(json!({"ResetKeysType": want}))
}

/// Why a database's certificates could not be listed.
#[derive(Debug, thiserror::Error)]
pub enum CertificatesUnreadable {
    /// The database links no `Certificates` collection.
    #[error("no Certificates collection")]
    NoCollection,
    /// The collection or a member could not be read.
    #[error(transparent)]
    Read(#[from] PowerError),
}

/// One database and what its certificates read (or why they could not be read).
#[derive(Debug)]
pub struct DatabaseStatus {
    pub view: DatabaseView,
    pub certificates: Result<Vec<CertificateView>, CertificatesUnreadable>,
}

/// `node secureboot status`: the SecureBoot resource and, where the BMC has them, its
/// databases.
#[derive(Debug)]
pub struct SecureBootStatus {
    pub view: SecureBootView,
    pub databases: Vec<DatabaseStatus>,
}

/// What an enrolment did.
#[derive(Debug, Clone)]
pub struct Enrolled {
    pub database: String,
    /// The created certificate's URI (its `Location`), when the BMC said.
    pub location: Option<String>,
    /// The certificate as the BMC reads it back, when it could be found.
    pub stored: Option<CertificateView>,
    /// `SecureBootEnable` was PATCHed to true.
    pub enabled: bool,
}

impl Redfish {
    fn refuse(&self, refusal: SecureBootRefusal) -> SecureBootError {
        SecureBootError::Refused {
            target: self.target(),
            refusal,
        }
    }

    /// GET `path` as JSON; `None` when the BMC answers 404 (the resource is not there).
    async fn get_optional(
        &self,
        path: &str,
    ) -> Result<Option<(Value, Option<String>)>, PowerError> {
        let a = self.send(Method::GET, path, None, None).await?;
        if a.status == StatusCode::NOT_FOUND {
            return Ok(None);
        }
        if !a.status.is_success() {
            return Err(self.refused(&Method::GET, path, &a));
        }
        let v: Value = serde_json::from_str(&a.text).map_err(|e| PowerError::Protocol {
            target: self.target(),
            reason: format!("GET {path}: not JSON ({e})"),
        })?;
        let etag = a.etag.or_else(|| {
            v.get("@odata.etag")
                .and_then(Value::as_str)
                .map(str::to_string)
        });
        Ok(Some((v, etag)))
    }

    /// The `SecureBoot` resource with its ETag, or the refusal saying the BMC has none.
    async fn secure_boot_tagged(
        &self,
    ) -> Result<(SecureBootView, Option<String>), SecureBootError> {
        let system = self.system_path().await?.to_string();
        let (_, sys) = self.get_json(&system).await?;
        let none = || {
            self.refuse(SecureBootRefusal::NoSecureBoot {
                system: system.clone(),
            })
        };
        let path = secure_boot_link(&sys).ok_or_else(none)?;
        let (v, etag) = self.get_optional(&path).await?.ok_or_else(none)?;
        Ok((secure_boot_view(&v, &path), etag))
    }

    /// Read the `SecureBoot` resource.
    pub async fn secure_boot(&self) -> Result<SecureBootView, SecureBootError> {
        Ok(self.secure_boot_tagged().await?.0)
    }

    /// The databases of a `SecureBootDatabases` collection.
    async fn databases(&self, collection: &str) -> Result<Vec<DatabaseView>, PowerError> {
        let (_, coll) = self.get_json(collection).await?;
        let mut out = Vec::new();
        for m in members(&coll) {
            let (_, v) = self.get_json(&m).await?;
            out.push(database_view(&v, &m));
        }
        Ok(out)
    }

    /// The certificates of one `Certificates` collection.
    async fn certificates(&self, collection: &str) -> Result<Vec<CertificateView>, PowerError> {
        let (_, coll) = self.get_json(collection).await?;
        let mut out = Vec::new();
        for m in members(&coll) {
            let (_, v) = self.get_json(&m).await?;
            out.push(certificate_view(&v, &m));
        }
        Ok(out)
    }

    /// `node secureboot status`: the SecureBoot resource, each database and its certificates.
    pub async fn secure_boot_status(&self) -> Result<SecureBootStatus, SecureBootError> {
        let view = self.secure_boot().await?;
        let mut databases = Vec::new();
        if let Some(coll) = &view.databases {
            for db in self.databases(coll).await? {
                let certificates = match &db.certificates {
                    Some(c) => self.certificates(c).await.map_err(Into::into),
                    None => Err(CertificatesUnreadable::NoCollection),
                };
                databases.push(DatabaseStatus {
                    view: db,
                    certificates,
                });
            }
        }
        Ok(SecureBootStatus { view, databases })
    }

    /// Enrol `cert` into the database named `database` (POST to its `Certificates`), then,
    /// if `enable`, turn `SecureBootEnable` on. Refuses, before anything is sent, a BMC
    /// without the resources for it.
    pub async fn enroll(
        &self,
        database: &str,
        cert: &EnrolCertificate,
        enable: bool,
    ) -> Result<Enrolled, SecureBootError> {
        let view = self.secure_boot().await?;
        let Some(coll) = &view.databases else {
            return Err(self.refuse(SecureBootRefusal::NoDatabases { path: view.path }));
        };
        let dbs = self.databases(coll).await?;
        let db = pick_database(&dbs, database).map_err(|r| self.refuse(r))?;
        let Some(certs) = &db.certificates else {
            return Err(self.refuse(SecureBootRefusal::NoCertificates {
                db: db.id.clone(),
                path: db.path.clone(),
            }));
        };
        let (_, listing) = self.get_json(certs).await?;
        if let Some(types) = string_list(listing.get("@Redfish.SupportedCertificates"))
            && !types.iter().any(|t| t == "PEM")
        {
            return Err(self.refuse(SecureBootRefusal::NoPem {
                path: certs.clone(),
                supported: types,
            }));
        }
        tracing::info!(endpoint = %self.cfg.endpoint, database = %db.id, subject = %cert.subject, "redfish: enrolling a Secure Boot certificate");
        let a = self
            .send(Method::POST, certs, Some(&enroll_body(cert)), None)
            .await?;
        if !a.status.is_success() {
            return Err(
                match post_refusal(&db.id, certs, a.status.as_u16(), &a.text) {
                    Some(r) => self.refuse(r),
                    None => self.refused(&Method::POST, certs, &a).into(),
                },
            );
        }
        let location = a.location.as_deref().map(|l| match reqwest::Url::parse(l) {
            Ok(u) => u.path().to_string(),
            Err(_) => l.to_string(),
        });
        let stored = self.find_stored(certs, location.as_deref(), cert).await?;
        if enable {
            self.enable_secure_boot().await?;
        }
        Ok(Enrolled {
            database: db.id.clone(),
            location,
            stored,
            enabled: enable,
        })
    }

    /// The enrolled certificate as the BMC reads it back: at its `Location`, else the member
    /// of the collection whose certificate is ours.
    async fn find_stored(
        &self,
        collection: &str,
        location: Option<&str>,
        cert: &EnrolCertificate,
    ) -> Result<Option<CertificateView>, PowerError> {
        if let Some(l) = location
            && let Some((v, _)) = self.get_optional(l).await?
        {
            return Ok(Some(certificate_view(&v, l)));
        }
        Ok(self
            .certificates(collection)
            .await?
            .into_iter()
            .find(|c| c.sha256.as_deref() == Some(cert.sha256.as_str())))
    }

    /// PATCH `SecureBootEnable: true`, with the resource's ETag as `If-Match` where it has
    /// one (each form of it, re-read after a stale one, as for the boot override).
    pub async fn enable_secure_boot(&self) -> Result<(), SecureBootError> {
        for _ in 0..ETAG_READS {
            let (view, etag) = self.secure_boot_tagged().await?;
            let forms: Vec<Option<String>> = match etag.as_deref().map(str::trim) {
                Some(t) if !t.is_empty() => if_match_forms(t).into_iter().map(Some).collect(),
                _ => vec![None],
            };
            for tag in &forms {
                let a = self
                    .send(
                        Method::PATCH,
                        &view.path,
                        Some(&enable_patch()),
                        tag.as_deref(),
                    )
                    .await?;
                if a.status.is_success() {
                    return Ok(());
                }
                if a.status == StatusCode::PRECONDITION_FAILED && tag.is_some() {
                    continue;
                }
                return Err(self.refused(&Method::PATCH, &view.path, &a).into());
            }
        }
        Err(PowerError::Protocol {
            target: self.target(),
            reason: format!(
                "the SecureBoot resource's ETag went stale {ETAG_READS} times in a row (412 to every If-Match); something else keeps changing it: try again"
            ),
        }
        .into())
    }

    /// POST `#SecureBoot.ResetKeys` with `want` (`ResetAllKeysToDefault`, `DeleteAllKeys`,
    /// `DeletePK`), refused when the BMC has no such action or does not list the value.
    pub async fn reset_keys(&self, want: &str) -> Result<(), SecureBootError> {
        let view = self.secure_boot().await?;
        let Some(action) = &view.reset_keys else {
            return Err(self.refuse(SecureBootRefusal::NoResetKeys { path: view.path }));
        };
        let body = reset_keys_body(action, want).map_err(|r| self.refuse(r))?;
        self.call(Method::POST, &action.target, Some(&body)).await?;
        Ok(())
    }

    /// The driver-neutral reading for `check --probe`: unknown when the BMC has no
    /// SecureBoot resource.
    pub async fn secure_boot_probe(&self) -> Result<SecureBootProbe, PowerError> {
        match self.secure_boot().await {
            Ok(v) => Ok(v.probe()),
            Err(SecureBootError::Refused { refusal, .. }) => {
                Ok(SecureBootProbe::Unknown(refusal.to_string()))
            }
            Err(SecureBootError::Power(e)) => Err(e),
        }
    }
}
