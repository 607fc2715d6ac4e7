//! The front's Secure Boot resources (issue 27 item 4): the tree's `SecureBoot` with
//! `SecureBootEnable` kept by the front and an ETag (PATCH takes it as `If-Match`, 428
//! without one when the front requires it, 412 when stale: RFC 6585 section 3, RFC 7232
//! section 3.1), and the certificates of the tree's Secure Boot databases: a POST to a
//! `Certificates` collection must carry `CertificateString` and `CertificateType` (DMTF
//! `Certificate.v1_x`, both `Redfish.RequiredOnCreate`; 400 `PropertyMissing` otherwise, DMTF
//! Base registry), `PEM` only where the collection's `@Redfish.SupportedCertificates` says so;
//! it answers 201 with the new member's `Location` (DSP0266 1.15 "POST (create)") and the
//! member is listed and readable after. [`FrontOptions::cert_post_status`] 405/501 refuses it
//! instead, with `Allow: GET` on a 405 (RFC 9110 section 15.5.6). `#SecureBoot.ResetKeys`
//! takes only the tree's `ResetKeysType@Redfish.AllowableValues` (400
//! `ActionParameterNotSupported` otherwise); `DeleteAllKeys` and `DeletePK` put the firmware
//! in `SetupMode` ("This puts the system in Setup Mode", `SecureBoot.v1_1_2.json`
//! `ResetKeysType`), `DeleteAllKeys` also empties the databases, `ResetAllKeysToDefault`
//! reads `UserMode`.

use axum::http::{Method, StatusCode, header};
use axum::response::{IntoResponse, Response};
use serde_json::{Value, json};

use super::{FrontOptions, Inner, error, opaque, upstream_json};

fn sb_etag(o: &FrontOptions, v: u64) -> String {
    if o.weak_etags {
        format!("W/\"sb{v}\"")
    } else {
        format!("\"sb{v}\"")
    }
}

/// Answers the Secure Boot requests; `None` for everything else.
pub(super) async fn route(
    inner: &Inner,
    method: &Method,
    path: &str,
    if_match: Option<&str>,
    body: Option<&Value>,
) -> Option<Response> {
    let p = path.trim_end_matches('/');
    if !p.contains("/SecureBoot") {
        return None;
    }
    if p.ends_with("/SecureBoot") {
        return match *method {
            Method::GET => Some(secure_boot(inner, path).await),
            Method::PATCH => Some(patch(inner, if_match, body)),
            _ => None,
        };
    }
    if p.ends_with("/SecureBoot.ResetKeys") && *method == Method::POST {
        return Some(reset_keys(inner, p, body).await);
    }
    if p.ends_with("/Certificates") {
        return match *method {
            Method::POST => Some(post(inner, p, body).await),
            Method::GET => Some(collection(inner, path, p).await),
            _ => None,
        };
    }
    if *method == Method::GET {
        let st = inner.state.lock().unwrap();
        let stored = st
            .certs
            .values()
            .flatten()
            .find(|c| c["@odata.id"] == p)
            .cloned();
        return stored.map(|c| axum::Json(c).into_response());
    }
    None
}

async fn secure_boot(inner: &Inner, path: &str) -> Response {
    let Some(mut v) = upstream_json(inner, path).await else {
        return error(StatusCode::NOT_FOUND, "Base.1.8.ResourceMissingAtURI", path);
    };
    let st = inner.state.lock().unwrap();
    if let Some(e) = st.sb_enable {
        v["SecureBootEnable"] = json!(e);
    }
    if let Some(m) = &st.sb_mode {
        v["SecureBootMode"] = json!(m);
    }
    let tag = sb_etag(&inner.opts, st.sb_version);
    ([(header::ETAG, tag)], axum::Json(v)).into_response()
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
        Some(t) if opaque(t) != opaque(&sb_etag(o, st.sb_version)) => {
            return error(
                StatusCode::PRECONDITION_FAILED,
                "Base.1.8.PreconditionFailed",
                "the ETag does not match the resource",
            );
        }
        _ => {}
    }
    let Some(e) = body
        .and_then(|b| b.get("SecureBootEnable"))
        .and_then(Value::as_bool)
    else {
        return error(
            StatusCode::BAD_REQUEST,
            "Base.1.8.PropertyUnknown",
            "only SecureBootEnable can be changed",
        );
    };
    st.sb_enable = Some(e);
    st.sb_version += 1;
    StatusCode::NO_CONTENT.into_response()
}

async fn collection(inner: &Inner, path: &str, p: &str) -> Response {
    let Some(mut v) = upstream_json(inner, path).await else {
        return error(StatusCode::NOT_FOUND, "Base.1.8.ResourceMissingAtURI", path);
    };
    let st = inner.state.lock().unwrap();
    let mut members = v["Members"].as_array().cloned().unwrap_or_default();
    for c in st.certs.get(p).into_iter().flatten() {
        members.push(json!({"@odata.id": c["@odata.id"]}));
    }
    v["Members@odata.count"] = json!(members.len());
    v["Members"] = json!(members);
    axum::Json(v).into_response()
}

async fn post(inner: &Inner, p: &str, body: Option<&Value>) -> Response {
    let status = inner.opts.cert_post_status;
    if status != 201 {
        let code = StatusCode::from_u16(status).unwrap();
        let mut r = error(
            code,
            "Base.1.8.OperationNotAllowed",
            "The HTTP method is not allowed on this resource.",
        );
        if status == 405 {
            r.headers_mut()
                .insert(header::ALLOW, "GET".parse().unwrap());
        }
        return r;
    }
    let b = body.cloned().unwrap_or(Value::Null);
    for k in ["CertificateString", "CertificateType"] {
        if b.get(k).and_then(Value::as_str).is_none() {
            return error(
                StatusCode::BAD_REQUEST,
                "Base.1.8.PropertyMissing",
                &format!(
                    "The property {k} is a required property and must be included in the request."
                ),
            );
        }
    }
    let listing = upstream_json(inner, p).await.unwrap_or(Value::Null);
    let supported = listing["@Redfish.SupportedCertificates"].as_array();
    if supported.is_some_and(|l| !l.iter().any(|t| *t == b["CertificateType"])) {
        return error(
            StatusCode::BAD_REQUEST,
            "Base.1.8.PropertyValueNotInList",
            "CertificateType is not supported here",
        );
    }
    let mut st = inner.state.lock().unwrap();
    let list = st.certs.entry(p.to_string()).or_default();
    let id = format!("{}", 100 + list.len());
    let uri = format!("{p}/{id}");
    let member = json!({"@odata.id": uri, "@odata.type": "#Certificate.v1_3_0.Certificate",
        "Id": id, "Name": "Enrolled certificate",
        "CertificateString": b["CertificateString"], "CertificateType": b["CertificateType"]});
    list.push(member.clone());
    (
        StatusCode::CREATED,
        [(header::LOCATION, uri)],
        axum::Json(member),
    )
        .into_response()
}

async fn reset_keys(inner: &Inner, p: &str, body: Option<&Value>) -> Response {
    let sb_path = p.split("/Actions/").next().unwrap_or_default();
    let Some(sb) = upstream_json(inner, sb_path).await else {
        return error(StatusCode::NOT_FOUND, "Base.1.8.ResourceMissingAtURI", p);
    };
    let action = &sb["Actions"]["#SecureBoot.ResetKeys"];
    let t = body.and_then(|b| b["ResetKeysType"].as_str()).unwrap_or("");
    let allowed = action["ResetKeysType@Redfish.AllowableValues"]
        .as_array()
        .is_none_or(|l| l.iter().any(|a| a == t));
    if !allowed || t.is_empty() {
        return error(
            StatusCode::BAD_REQUEST,
            "Base.1.8.ActionParameterNotSupported",
            &format!("the parameter ResetKeysType value {t} is not supported"),
        );
    }
    let mut st = inner.state.lock().unwrap();
    match t {
        "DeleteAllKeys" => {
            st.sb_mode = Some("SetupMode".into());
            st.certs.clear();
        }
        "DeletePK" => st.sb_mode = Some("SetupMode".into()),
        _ => st.sb_mode = Some("UserMode".into()),
    }
    st.sb_version += 1;
    StatusCode::NO_CONTENT.into_response()
}
