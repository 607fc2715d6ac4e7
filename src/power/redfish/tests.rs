//! The Redfish driver's pure decisions and client checks, without a BMC.

use super::*;
use serde_json::json;

fn allowed(v: &[&str]) -> Vec<String> {
    v.iter().map(|s| s.to_string()).collect()
}

#[test]
fn one_member_is_the_system_and_several_need_a_choice() {
    let one = json!({"Members": [{"@odata.id": "/redfish/v1/Systems/abc"}]});
    assert_eq!(member_path(&one).unwrap(), "/redfish/v1/Systems/abc");
    let two = json!({"Members": [{"@odata.id": "/a"}, {"@odata.id": "/b"}]});
    let e = member_path(&two).unwrap_err().to_string();
    assert!(e.contains("/a, /b") && e.contains("system:"), "{e}");
    assert!(member_path(&json!({"Members": []})).is_err());
    assert!(member_path(&json!({})).is_err());
}

#[test]
fn system_view_reads_state_target_and_allowables() {
    let sys = json!({
        "PowerState": "PoweringOn",
        "Boot": {"BootSourceOverrideTarget@Redfish.AllowableValues": ["Pxe", "Hdd"]},
        "Actions": {"#ComputerSystem.Reset": {
            "target": "/redfish/v1/Systems/x/Actions/ComputerSystem.Reset",
            "ResetType@Redfish.AllowableValues": ["On", "ForceOff"]
        }}
    });
    let v = system_view(&sys, "/redfish/v1/Systems/x");
    assert_eq!(v.power_state, PowerState::Off);
    assert_eq!(
        v.reset_target,
        "/redfish/v1/Systems/x/Actions/ComputerSystem.Reset"
    );
    assert_eq!(v.allowed_resets, Some(allowed(&["On", "ForceOff"])));
    assert_eq!(v.allowed_boot_targets, Some(allowed(&["Pxe", "Hdd"])));
    let bare = system_view(&json!({"PowerState": "On"}), "/redfish/v1/Systems/y/");
    assert_eq!(bare.power_state, PowerState::On);
    assert_eq!(
        bare.reset_target,
        "/redfish/v1/Systems/y/Actions/ComputerSystem.Reset"
    );
    assert_eq!(bare.allowed_resets, None);
    assert_eq!(
        system_view(&json!({}), "/s").power_state,
        PowerState::Unknown
    );
}

#[test]
fn reset_types_are_read_from_the_action_info_where_not_inline() {
    let sys = json!({
        "PowerState": "On",
        "Actions": {"#ComputerSystem.Reset": {
            "target": "/redfish/v1/Systems/System.Embedded.1/Actions/ComputerSystem.Reset",
            "@Redfish.ActionInfo": "/redfish/v1/Systems/System.Embedded.1/ResetActionInfo"
        }}
    });
    let v = system_view(&sys, "/redfish/v1/Systems/System.Embedded.1");
    assert_eq!(v.allowed_resets, None);
    assert_eq!(
        v.reset_action_info.as_deref(),
        Some("/redfish/v1/Systems/System.Embedded.1/ResetActionInfo")
    );
    let info = json!({
        "@odata.type": "#ActionInfo.v1_1_2.ActionInfo",
        "Parameters": [{
            "Name": "ResetType", "Required": true, "DataType": "String",
            "AllowableValues": ["On", "ForceOff", "GracefulRestart", "PushPowerButton", "Nmi"]
        }]
    });
    let resets = action_info_resets(&info).unwrap();
    assert_eq!(
        resets,
        allowed(&[
            "On",
            "ForceOff",
            "GracefulRestart",
            "PushPowerButton",
            "Nmi"
        ])
    );
    // No PowerCycle and no ForceRestart: a cycle is ForceOff, then On.
    assert_eq!(
        reset_plan(PowerAction::Cycle, PowerState::On, Some(&resets)),
        Ok(ResetPlan::OffThenOn("On"))
    );
    assert_eq!(action_info_resets(&json!({"Parameters": []})), None);
}

#[test]
fn reset_plans_follow_the_allowable_values() {
    use PowerAction::*;
    use PowerState::{Off as S0, On as S1};
    // Nothing to do when already there.
    assert_eq!(reset_plan(On, S1, None), Ok(ResetPlan::Nothing));
    assert_eq!(reset_plan(Off, S0, None), Ok(ResetPlan::Nothing));
    // Defaults when the service says nothing.
    assert_eq!(reset_plan(On, S0, None), Ok(ResetPlan::Reset("On")));
    assert_eq!(reset_plan(Off, S1, None), Ok(ResetPlan::Reset("ForceOff")));
    assert_eq!(
        reset_plan(Cycle, S1, None),
        Ok(ResetPlan::Reset("ForceRestart"))
    );
    // A cycle of a machine that is off is a power-on.
    assert_eq!(reset_plan(Cycle, S0, None), Ok(ResetPlan::Reset("On")));
    // PowerCycle preferred where offered.
    let all = allowed(&["On", "ForceOff", "ForceRestart", "PowerCycle"]);
    assert_eq!(
        reset_plan(Cycle, S1, Some(&all)),
        Ok(ResetPlan::Reset("PowerCycle"))
    );
    // Only ForceOn / PushPowerButton for power-on.
    let push = allowed(&["PushPowerButton", "ForceOff"]);
    assert_eq!(
        reset_plan(On, S0, Some(&push)),
        Ok(ResetPlan::Reset("PushPowerButton"))
    );
    assert_eq!(
        reset_plan(Cycle, S1, Some(&push)),
        Ok(ResetPlan::OffThenOn("PushPowerButton"))
    );
    // Unknown state is treated as "not in the wanted state".
    assert_eq!(
        reset_plan(On, PowerState::Unknown, None),
        Ok(ResetPlan::Reset("On"))
    );
    // Impossible requests are refused, naming what the system allows.
    let e = reset_plan(Off, S1, Some(&allowed(&["On"])))
        .unwrap_err()
        .to_string();
    assert!(e.contains("ForceOff") && e.contains("\"On\""), "{e}");
    assert!(reset_plan(Cycle, S1, Some(&allowed(&["On"]))).is_err());
    assert!(reset_plan(On, S0, Some(&allowed(&["ForceOff"]))).is_err());
}

#[test]
fn boot_patch_bodies() {
    assert_eq!(
        boot_patch(BootDevice::Network, BootPersistence::Once, None),
        json!({"Boot": {"BootSourceOverrideTarget": "Pxe", "BootSourceOverrideEnabled": "Once"}})
    );
    assert_eq!(
        boot_patch(BootDevice::Disk, BootPersistence::Persistent, None),
        json!({"Boot": {"BootSourceOverrideTarget": "Hdd", "BootSourceOverrideEnabled": "Continuous"}})
    );
    assert_eq!(
        boot_patch(BootDevice::Network, BootPersistence::Once, Some("UEFI")),
        json!({"Boot": {"BootSourceOverrideTarget": "Pxe", "BootSourceOverrideEnabled": "Once",
                        "BootSourceOverrideMode": "UEFI"}})
    );
}

#[test]
fn if_match_forms_follow_the_etag_the_bmc_sent() {
    assert_eq!(if_match_forms("\"abc\""), ["\"abc\""]);
    assert_eq!(if_match_forms(" W/\"7\" "), ["W/\"7\"", "\"7\""]);
    // Not a well-formed weak tag: sent as it came.
    assert_eq!(if_match_forms("W/7"), ["W/7"]);
}

fn view(mode: Option<&str>, allowed: Option<&[&str]>) -> SystemView {
    let mut boot = json!({});
    if let Some(m) = mode {
        boot["BootSourceOverrideMode"] = json!(m);
    }
    if let Some(a) = allowed {
        boot["BootSourceOverrideMode@Redfish.AllowableValues"] = json!(a);
    }
    system_view(
        &json!({"PowerState": "Off", "Boot": boot}),
        "/redfish/v1/Systems/1",
    )
}

#[test]
fn the_override_mode_follows_the_node_where_the_bmc_allows_it() {
    use BootMode::{Legacy, Uefi};
    let both: &[&str] = &["Legacy", "UEFI"];
    // The issue's case: a Legacy default, a UEFI node: UEFI is sent.
    assert_eq!(
        mode_plan(Some(Uefi), &view(Some("Legacy"), Some(both))),
        ModePlan::Set("UEFI")
    );
    // The property present without a list is taken as writable (read-write in the schema).
    assert_eq!(
        mode_plan(Some(Uefi), &view(Some("Legacy"), None)),
        ModePlan::Set("UEFI")
    );
    assert_eq!(
        mode_plan(Some(Legacy), &view(Some("UEFI"), Some(both))),
        ModePlan::Set("Legacy")
    );
    // Already there: nothing sent.
    assert_eq!(
        mode_plan(Some(Uefi), &view(Some("UEFI"), Some(both))),
        ModePlan::Keep
    );
    // Not allowed, or no such property: said, not sent.
    let ModePlan::Warn(w) = mode_plan(Some(Uefi), &view(Some("Legacy"), Some(&["Legacy"]))) else {
        panic!("a mode outside the list is not sent")
    };
    assert!(
        w.contains("does not allow boot override mode UEFI") && w.contains("Legacy mode"),
        "{w}"
    );
    let ModePlan::Warn(w) = mode_plan(Some(Legacy), &view(None, None)) else {
        panic!("no property, nothing to send")
    };
    assert!(w.contains("no BootSourceOverrideMode"), "{w}");
    // A node without `firmware:`: the BMC's mode stays; a Legacy one is pointed out.
    assert_eq!(mode_plan(None, &view(Some("UEFI"), None)), ModePlan::Keep);
    assert_eq!(mode_plan(None, &view(None, None)), ModePlan::Keep);
    assert!(
        matches!(mode_plan(None, &view(Some("Legacy"), None)), ModePlan::Warn(w) if w.contains("firmware: uefi"))
    );
}

#[test]
fn sessions_are_found_from_the_service_root() {
    let dmtf = json!({"Links": {"Sessions": {"@odata.id": "/redfish/v1/SessionService/Sessions"}},
                      "SessionService": {"@odata.id": "/redfish/v1/SessionService"}});
    assert_eq!(
        sessions_path(&dmtf).as_deref(),
        Some("/redfish/v1/SessionService/Sessions")
    );
    let idrac = json!({"Links": {"Sessions": {"@odata.id": "/redfish/v1/Sessions"}}});
    assert_eq!(
        sessions_path(&idrac).as_deref(),
        Some("/redfish/v1/Sessions")
    );
    let no_link = json!({"SessionService": {"@odata.id": "/redfish/v1/SessionService"}});
    assert_eq!(
        sessions_path(&no_link).as_deref(),
        Some("/redfish/v1/SessionService/Sessions")
    );
    assert_eq!(sessions_path(&json!({"Systems": {}})), None);
    assert_eq!(sessions_path(&Value::Null), None);
    // The session's URI: Location (absolute or a path), else the body's @odata.id.
    let body = json!({"@odata.id": "/redfish/v1/SessionService/Sessions/b"});
    assert_eq!(
        session_uri(
            Some("https://10.0.0.1/redfish/v1/SessionService/Sessions/a"),
            &body
        )
        .as_deref(),
        Some("/redfish/v1/SessionService/Sessions/a")
    );
    assert_eq!(
        session_uri(Some("/redfish/v1/Sessions/7"), &body).as_deref(),
        Some("/redfish/v1/Sessions/7")
    );
    assert_eq!(
        session_uri(None, &body).as_deref(),
        Some("/redfish/v1/SessionService/Sessions/b")
    );
    assert_eq!(session_uri(None, &json!({})), None);
}

#[test]
fn a_stale_etag_is_called_stale_with_the_count() {
    let r = stale_etag_reason(4, "W/\"9\"", StatusCode::PRECONDITION_REQUIRED);
    assert!(
        r.contains("went stale 4 times") && r.contains("re-read") && r.contains("W/\"9\""),
        "{r}"
    );
    assert!(r.contains("428") && !r.contains("sent no ETag"), "{r}");
    let r = stale_etag_reason(4, "\"9\"", StatusCode::CONFLICT);
    assert!(r.contains("409"), "{r}");
}

#[test]
fn error_bodies_give_their_message() {
    let ext = r#"{"error":{"code":"Base.1.0.GeneralError","message":"outer","@Message.ExtendedInfo":[{"Message":"inner"}]}}"#;
    assert_eq!(error_message(ext).as_deref(), Some("inner"));
    assert_eq!(
        error_message(r#"{"error":{"message":"m"}}"#).as_deref(),
        Some("m")
    );
    assert_eq!(error_message("<html>"), None);
}

#[test]
fn an_endpoint_with_user_info_is_refused_without_echoing_it() {
    let cfg = RedfishConfig::new(
        "https://root:s3cret-pw@bmc.example",
        "root",
        Credential::new("x"),
    );
    let e = Redfish::new(cfg).unwrap_err().to_string();
    assert!(!e.contains("s3cret-pw"), "{e}");
    assert!(e.contains("user info"), "{e}");
    let cfg = RedfishConfig::new("bmc.example", "root", Credential::new("x"));
    assert!(Redfish::new(cfg).is_err());
}

proptest::proptest! {
    /// Whatever ETag a BMC sends: its own value first, then for a weak tag its strong
    /// form, and nothing else.
    #[test]
    fn if_match_forms_start_with_the_tag(
        weak in proptest::bool::ANY, opaque in "[A-Za-z0-9]{0,12}"
    ) {
        let tag = format!("{}\"{opaque}\"", if weak { "W/" } else { "" });
        let a = if_match_forms(&tag);
        proptest::prop_assert_eq!(a.first().cloned(), Some(tag.clone()));
        proptest::prop_assert_eq!(a.len(), if weak { 2 } else { 1 });
        if weak {
            proptest::prop_assert_eq!(a[1].clone(), format!("\"{opaque}\""));
        }
    }

    /// Whatever a service allows, a plan only ever uses values it allows.
    #[test]
    fn plans_use_only_allowed_values(
        mask in 0u8..64, action in 0u8..3, on in proptest::bool::ANY
    ) {
        const ALL: [&str; 6] = ["On", "ForceOn", "PushPowerButton", "ForceOff", "ForceRestart", "PowerCycle"];
        let list: Vec<String> = ALL.iter().enumerate()
            .filter(|(i, _)| mask & (1 << i) != 0).map(|(_, s)| s.to_string()).collect();
        let action = [PowerAction::On, PowerAction::Off, PowerAction::Cycle][action as usize];
        let state = if on { PowerState::On } else { PowerState::Off };
        match reset_plan(action, state, Some(&list)) {
            Ok(ResetPlan::Reset(t)) => proptest::prop_assert!(list.iter().any(|a| a == t)),
            Ok(ResetPlan::OffThenOn(t)) => proptest::prop_assert!(
                list.iter().any(|a| a == t) && list.iter().any(|a| a == "ForceOff")),
            Ok(ResetPlan::Nothing) | Err(_) => {}
        }
    }
}

#[test]
fn an_unreadable_ca_is_named_and_no_secret_is_shown() {
    let t = RedfishTarget {
        endpoint: "https://10.0.50.11".into(),
        system_id: None,
        verify_tls: true,
        ca: Some("/nonexistent/bmc-ca.pem".into()),
        user: "admin".into(),
        password: Credential::new("s3cret-bmc"),
        auth: Default::default(),
        boot_mode: None,
    };
    let Err(err) = redfish(&t).map(|_| ()) else {
        panic!("a missing CA is an error")
    };
    let err = err.to_string();
    assert!(err.contains("/nonexistent/bmc-ca.pem"), "{err}");
    assert!(!err.contains("s3cret-bmc"), "{err}");
}
