//! The PodSecurity `restricted` warnings the API server returns as `Warning` headers when a
//! namespace's label asks for them.

use serde_json::Value;

/// The PodSecurity `restricted` checks a warn (or enforce) label makes the server report on
/// a workload, as pod-security-admission words them (kubernetes/kubernetes v1.36.2
/// staging/src/k8s.io/pod-security-admission/policy/check_allowPrivilegeEscalation.go,
/// check_capabilities_restricted.go, check_runAsNonRoot.go, check_seccompProfile_restricted.go;
/// admission/admission.go joins them after `would violate PodSecurity "restricted:latest": `).
pub(crate) fn pod_security_warning(namespace: &Value, obj: &Value) -> Option<String> {
    let labels = &namespace["metadata"]["labels"];
    let level = labels["pod-security.kubernetes.io/warn"]
        .as_str()
        .or(labels["pod-security.kubernetes.io/enforce"].as_str())?;
    if level != "restricted" {
        return None;
    }
    let version = labels["pod-security.kubernetes.io/warn-version"]
        .as_str()
        .unwrap_or("latest");
    let pod = pod_spec(obj)?;
    let containers = Containers::of(pod);
    let out: Vec<String> = [
        containers.allow_privilege_escalation(),
        containers.capabilities(),
        containers.run_as_non_root(pod),
        containers.seccomp_profile(pod),
    ]
    .into_iter()
    .flatten()
    .collect();
    if out.is_empty() {
        return None;
    }
    Some(format!(
        "would violate PodSecurity \"restricted:{version}\": {}",
        out.join(", ")
    ))
}

/// The pod spec of a workload kind pod-security-admission checks; `None` for other kinds.
fn pod_spec(obj: &Value) -> Option<&Value> {
    Some(match obj["kind"].as_str()? {
        "Pod" => &obj["spec"],
        "Deployment" | "DaemonSet" | "StatefulSet" | "ReplicaSet" | "Job" => {
            &obj["spec"]["template"]["spec"]
        }
        "CronJob" => &obj["spec"]["jobTemplate"]["spec"]["template"]["spec"],
        _ => return None,
    })
}

/// A pod's init containers then containers, the order the checks name them in; each check
/// gives its phrase for the containers that fail it, or `None` when all pass.
struct Containers<'a>(Vec<&'a Value>);

impl<'a> Containers<'a> {
    fn of(pod: &'a Value) -> Self {
        Containers(
            ["initContainers", "containers"]
                .iter()
                .flat_map(|f| pod[*f].as_array().into_iter().flatten())
                .collect(),
        )
    }

    /// `container "a"` or `containers "a", "b"`: the quoted names of those failing `pred`,
    /// `None` when none does.
    fn failing(&self, pred: impl Fn(&Value) -> bool) -> Option<String> {
        let n: Vec<String> = self
            .0
            .iter()
            .filter(|c| pred(c))
            .map(|c| format!("{:?}", c["name"].as_str().unwrap_or_default()))
            .collect();
        match n.len() {
            0 => None,
            1 => Some(format!("container {}", n[0])),
            _ => Some(format!("containers {}", n.join(", "))),
        }
    }

    /// check_allowPrivilegeEscalation.go.
    fn allow_privilege_escalation(&self) -> Option<String> {
        let which = self.failing(|c| c["securityContext"]["allowPrivilegeEscalation"] != false)?;
        Some(format!(
            "allowPrivilegeEscalation != false ({which} must set securityContext.allowPrivilegeEscalation=false)"
        ))
    }

    /// check_capabilities_restricted.go.
    fn capabilities(&self) -> Option<String> {
        let which = self.failing(|c| {
            !c["securityContext"]["capabilities"]["drop"]
                .as_array()
                .is_some_and(|d| d.iter().any(|x| x == "ALL"))
        })?;
        Some(format!(
            "unrestricted capabilities ({which} must set securityContext.capabilities.drop=[\"ALL\"])"
        ))
    }

    /// check_runAsNonRoot.go: a container's own setting wins over the pod's.
    fn run_as_non_root(&self, pod: &Value) -> Option<String> {
        let pod_nonroot = pod["securityContext"]["runAsNonRoot"] == true;
        let which = self.failing(|c| match &c["securityContext"]["runAsNonRoot"] {
            Value::Bool(b) => !b,
            _ => !pod_nonroot,
        })?;
        Some(format!(
            "runAsNonRoot != true (pod or {which} must set securityContext.runAsNonRoot=true)"
        ))
    }

    /// check_seccompProfile_restricted.go: a container's own profile wins over the pod's.
    fn seccomp_profile(&self, pod: &Value) -> Option<String> {
        let ok_profile =
            |p: &Value| matches!(p["type"].as_str(), Some("RuntimeDefault" | "Localhost"));
        let pod_seccomp = ok_profile(&pod["securityContext"]["seccompProfile"]);
        let which = self.failing(|c| {
            let p = &c["securityContext"]["seccompProfile"];
            if p.is_null() {
                !pod_seccomp
            } else {
                !ok_profile(p)
            }
        })?;
        Some(format!(
            "seccompProfile (pod or {which} must set securityContext.seccompProfile.type to \"RuntimeDefault\" or \"Localhost\")"
        ))
    }
}
