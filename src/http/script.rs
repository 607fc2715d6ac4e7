//! iPXE scripts: what a machine boots, decided from the inventory and the node's provisioning
//! state, and rendered from the templates in `ipxe/`.
//!
//! Pure: [`plan`] turns (inventory, MAC, node state, what iPXE reported) into a [`BootPlan`];
//! [`render`] turns a plan into script text. The HTTP handler only gathers the inputs.

use minijinja::{Environment, context};

use crate::artifacts::{SetId, cmdline};
use crate::inventory::{Arch, Delivery, Inventory, LocalBoot, Mac, UnknownPolicy};

/// What iPXE told us about itself in the query string.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub(crate) struct ClientFacts {
    /// `${buildarch}`: `x86_64`, `i386`, `arm64`…
    pub(crate) buildarch: Option<String>,
    /// `${platform}`: `pcbios` or `efi`.
    pub platform: Option<String>,
}

impl ClientFacts {
    /// The Talos architecture this iPXE build can boot.
    pub fn arch(&self) -> Option<Arch> {
        match self.buildarch.as_deref()? {
            "x86_64" | "i386" => Some(Arch::Amd64),
            "arm64" | "aarch64" => Some(Arch::Arm64),
            _ => None,
        }
    }
}

/// Where a node is in its life, as far as booting is concerned.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum NodeState {
    /// New, or marked for rebuild: it must boot Talos from the network.
    Provisioning,
    /// Installed: booting the network image again would only waste time; boot the disk.
    Installed,
}

/// The decision for one request.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum BootPlan {
    /// Boot Talos over the network.
    Talos {
        /// The inventory node, or `None` for a discovered machine.
        node: Option<String>,
        /// Which boot set.
        set: SetId,
        /// The whole kernel command line.
        cmdline: Vec<String>,
    },
    /// Boot from the local disk, the node's way.
    LocalDisk {
        /// The node.
        node: String,
        /// How: `exit`, `sanboot` of the first disk, or a 404.
        method: LocalBoot,
    },
    /// Do not boot this machine.
    Refuse {
        /// Why (shown on the machine's console).
        reason: String,
    },
}

impl BootPlan {
    /// The plan is answered with HTTP 404 (the `http404` local-boot method) instead of a script.
    pub(crate) fn is_not_found(&self) -> bool {
        matches!(
            self,
            BootPlan::LocalDisk {
                method: LocalBoot::Http404,
                ..
            }
        )
    }
}

/// Everything [`plan`] needs besides the inventory.
#[derive(Debug, Clone)]
pub(crate) struct PlanInput<'a> {
    /// The booting NIC.
    pub mac: Mac,
    /// The node's state, when the MAC belongs to an inventory node.
    pub state: NodeState,
    /// What iPXE reported.
    pub facts: &'a ClientFacts,
    /// The factory command line of the boot set, if stored with the artifacts.
    pub(crate) factory_cmdline: Option<Vec<String>>,
    /// `talos.config=` URL for pull delivery (with its one-time token), if issued.
    pub config_url: Option<String>,
}

/// Decide what the machine with `input.mac` boots.
pub(crate) fn plan(inv: &Inventory, input: &PlanInput<'_>) -> BootPlan {
    let talos = &inv.cluster.talos_version.value;
    let schematic = inv.cluster.installer.schematic_id();
    let Some(node) = inv.node_by_mac(input.mac) else {
        return match inv.boot.unknown_machines {
            UnknownPolicy::Ignore => BootPlan::Refuse {
                reason: format!("{} is not in the inventory", input.mac),
            },
            UnknownPolicy::Discover => {
                let arch = input.facts.arch().unwrap_or(inv.boot.default_arch);
                let base = input
                    .factory_cmdline
                    .clone()
                    .unwrap_or_else(|| cmdline::default_cmdline(talos, arch));
                // No talos.config: Talos waits in maintenance mode to be discovered.
                let cmdline = finish_cmdline(base, &inv.boot.kernel_args, None, None);
                match cmdline {
                    Ok(cmdline) => BootPlan::Talos {
                        node: None,
                        set: SetId::new(talos, schematic, arch),
                        cmdline,
                    },
                    Err(e) => BootPlan::Refuse {
                        reason: e.to_string(),
                    },
                }
            }
        };
    };
    if input.state == NodeState::Installed {
        return BootPlan::LocalDisk {
            node: node.name.value.clone(),
            method: inv.local_boot_of(node),
        };
    }
    let arch = inv.arch_of(node);
    if let Some(reported) = input.facts.arch()
        && reported != arch
    {
        return BootPlan::Refuse {
            reason: format!(
                "{} is {} in the inventory but this iPXE is {}; fix the node's arch",
                node.name.as_str(),
                arch,
                input.facts.buildarch.as_deref().unwrap_or("?")
            ),
        };
    }
    let base = input
        .factory_cmdline
        .clone()
        .unwrap_or_else(|| cmdline::default_cmdline(talos, arch));
    let config_url = match inv.boot.delivery {
        Delivery::Pull => input.config_url.as_deref(),
        Delivery::Push => None,
    };
    match finish_cmdline(
        base,
        &inv.boot.kernel_args,
        Some((node.name.as_str(), node.kernel_args.as_slice())),
        config_url,
    ) {
        Ok(cmdline) => BootPlan::Talos {
            node: Some(node.name.value.clone()),
            set: SetId::new(talos, schematic, arch),
            cmdline,
        },
        Err(e) => BootPlan::Refuse {
            reason: e.to_string(),
        },
    }
}

/// Why a node's kernel command line cannot be made: an inventory argument conflicts with one
/// Talos requires. Shown on the machine's console (a refuse script) and names the field.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub(crate) enum CmdlineRefusal {
    /// The argument is in the cluster-wide `boot.kernelArgs`.
    #[error("{source}; remove it from the inventory's boot.kernelArgs")]
    Cluster {
        /// The conflict.
        source: cmdline::CmdlineError,
    },
    /// The argument is in the node's own `kernelArgs`.
    #[error("{source}; remove it from the kernelArgs of node {node}")]
    Node {
        /// The node.
        node: String,
        /// The conflict.
        source: cmdline::CmdlineError,
    },
}

/// `base` with the cluster's, then the node's (`node`: its name and arguments), then
/// talboot's own arguments merged in.
fn finish_cmdline(
    base: Vec<String>,
    cluster_args: &[String],
    node: Option<(&str, &[String])>,
    config_url: Option<&str>,
) -> Result<Vec<String>, CmdlineRefusal> {
    let line =
        cmdline::merge(&base, cluster_args).map_err(|source| CmdlineRefusal::Cluster { source })?;
    let line = match node {
        Some((name, args)) => {
            cmdline::merge(&line, args).map_err(|source| CmdlineRefusal::Node {
                node: name.to_owned(),
                source,
            })?
        }
        None => line,
    };
    let mut ours = Vec::new();
    if let Some(url) = config_url {
        ours.push(format!("talos.config={url}"));
    }
    // UEFI iPXE hands the initrd to the kernel's EFI stub only when the command line names it;
    // the argument is harmless on BIOS.
    ours.push("initrd=initramfs.xz".into());
    Ok(cmdline::merge(&line, &ours).expect("talboot's own arguments are not Talos-required keys"))
}

const CHAIN: &str = include_str!("../../ipxe/chain.ipxe");
const TALOS: &str = include_str!("../../ipxe/talos.ipxe");
const LOCAL: &str = include_str!("../../ipxe/local.ipxe");
const REFUSE: &str = include_str!("../../ipxe/refuse.ipxe");

/// The script renderer: the templates from `ipxe/`, compiled in.
pub struct Scripts {
    env: Environment<'static>,
}

impl Default for Scripts {
    fn default() -> Self {
        Self::new()
    }
}

impl Scripts {
    /// Load the built-in templates.
    pub fn new() -> Self {
        let mut env = Environment::new();
        // Scripts are plain text: nothing may be HTML-escaped.
        env.set_auto_escape_callback(|_| minijinja::AutoEscape::None);
        env.set_syntax(
            minijinja::syntax::SyntaxConfig::builder()
                .keep_trailing_newline(true)
                .build()
                .expect("default syntax with trailing newlines"),
        );
        for (name, src) in [
            ("chain", CHAIN),
            ("talos", TALOS),
            ("local", LOCAL),
            ("refuse", REFUSE),
        ] {
            env.add_template(name, src)
                .expect("built-in template parses");
        }
        Self { env }
    }

    /// The generic entry script, which makes iPXE ask for its own per-MAC script.
    pub fn chain(&self, base: &str) -> String {
        self.render("chain", context! { base })
    }

    /// Render `plan`; `base` is talboot's HTTP base URL (`http://10.0.40.5:8080`).
    pub fn render(&self, name: &str, ctx: minijinja::Value) -> String {
        self.env
            .get_template(name)
            .and_then(|t| t.render(ctx))
            .expect("built-in templates render with their context")
    }

    /// Render a plan.
    pub(crate) fn plan(&self, plan: &BootPlan, base: &str) -> String {
        match plan {
            BootPlan::Talos { node, set, cmdline } => {
                let dir = format!("{base}/assets/{}/{}/{}", set.talos, set.schematic, set.arch);
                let (purpose, title) = match node {
                    Some(n) => (
                        format!("install Talos on {n}"),
                        format!("booting Talos {} {} for {n}", set.talos, set.arch),
                    ),
                    None => (
                        "boot an unknown machine into maintenance mode for discovery".into(),
                        format!(
                            "booting Talos {} {} in maintenance mode",
                            set.talos, set.arch
                        ),
                    ),
                };
                self.render(
                    "talos",
                    context! {
                        base,
                        purpose,
                        title,
                        kernel_url => format!("{dir}/kernel"),
                        initramfs_url => format!("{dir}/initramfs.xz"),
                        cmdline => cmdline.join(" "),
                    },
                )
            }
            BootPlan::LocalDisk { node, method } => self.render(
                "local",
                context! { node, method => method.as_str(), reason => "its provisioning window is closed" },
            ),
            BootPlan::Refuse { reason } => self.render("refuse", context! { reason }),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::BTreeMap;
    use std::path::Path;

    fn inv(file: &str) -> Inventory {
        let p = Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("config")
            .join(file);
        crate::inventory::load_with_env(&p, &BTreeMap::new())
            .unwrap()
            .inventory
    }

    fn facts(arch: &str) -> ClientFacts {
        ClientFacts {
            buildarch: Some(arch.into()),
            platform: Some("efi".into()),
        }
    }

    #[test]
    fn known_node_boots_talos_with_its_arguments() {
        let mut inv = inv("rack.yaml");
        inv.boot.delivery = Delivery::Pull;
        let f = facts("x86_64");
        let p = plan(
            &inv,
            &PlanInput {
                mac: "3c:ec:ef:20:00:02".parse().unwrap(),
                state: NodeState::Provisioning,
                facts: &f,
                factory_cmdline: None,
                config_url: Some("http://10.20.0.2:8080/config/tok".into()),
            },
        );
        let BootPlan::Talos { node, set, cmdline } = &p else {
            panic!("{p:?}")
        };
        assert_eq!(node.as_deref(), Some("rack1-wk-02"));
        assert_eq!(set.arch, "amd64");
        let line = cmdline.join(" ");
        assert!(
            line.starts_with("talos.platform=metal console=tty0 "),
            "{line}"
        );
        assert!(line.ends_with("console=ttyS1,115200n8 talos.config=http://10.20.0.2:8080/config/tok initrd=initramfs.xz"), "{line}");
        let script = Scripts::new().plan(&p, "http://10.20.0.2:8080");
        assert!(script.starts_with("#!ipxe\n"));
        assert!(script.contains(&format!(
            "kernel http://10.20.0.2:8080/assets/v1.13.9/{}/amd64/kernel talos.platform=metal",
            set.schematic
        )));
        assert!(
            script.contains("initrd --name initramfs.xz http://10.20.0.2:8080/assets/v1.13.9/")
        );
    }

    #[test]
    fn push_delivery_never_puts_a_config_url_on_the_command_line() {
        let inv = inv("lab.yaml");
        let f = facts("x86_64");
        let p = plan(
            &inv,
            &PlanInput {
                mac: "bc:24:11:40:00:01".parse().unwrap(),
                state: NodeState::Provisioning,
                facts: &f,
                factory_cmdline: Some(cmdline::parse("talos.platform=metal slab_nomerge pti=on")),
                config_url: Some("http://x/config/tok".into()),
            },
        );
        let BootPlan::Talos { cmdline, .. } = p else {
            panic!()
        };
        assert_eq!(
            cmdline.join(" "),
            "talos.platform=metal slab_nomerge pti=on initrd=initramfs.xz"
        );
    }

    #[test]
    fn installed_nodes_boot_their_disk() {
        let inv = inv("lab.yaml");
        let f = facts("x86_64");
        let p = plan(
            &inv,
            &PlanInput {
                mac: "bc:24:11:40:00:02".parse().unwrap(),
                state: NodeState::Installed,
                facts: &f,
                factory_cmdline: None,
                config_url: None,
            },
        );
        assert_eq!(
            p,
            BootPlan::LocalDisk {
                node: "k8s-ctrl-02".into(),
                method: LocalBoot::Exit,
            }
        );
        let s = Scripts::new().plan(&p, "http://x");
        assert!(s.contains("\nexit\n"), "{s}");
        assert!(!s.contains("sanboot"), "{s}");
    }

    /// Each local-boot method, from the boot section's default and a node's own setting.
    #[test]
    fn installed_nodes_boot_their_disk_the_configured_way() {
        let mut inv = inv("lab.yaml");
        let f = facts("x86_64");
        let mac: Mac = "bc:24:11:40:00:02".parse().unwrap();
        let installed = |inv: &Inventory| {
            plan(
                inv,
                &PlanInput {
                    mac,
                    state: NodeState::Installed,
                    facts: &f,
                    factory_cmdline: None,
                    config_url: None,
                },
            )
        };
        inv.boot.local_boot = LocalBoot::Sanboot;
        let p = installed(&inv);
        assert!(
            matches!(
                p,
                BootPlan::LocalDisk {
                    method: LocalBoot::Sanboot,
                    ..
                }
            ),
            "{p:?}"
        );
        let s = Scripts::new().plan(&p, "http://x");
        assert!(
            s.contains("\nsanboot --no-describe --drive 0x80 || exit\n"),
            "{s}"
        );
        // A node's own setting wins over the boot section's.
        let i = inv
            .nodes
            .iter()
            .position(|n| n.name.as_str() == "k8s-ctrl-02")
            .unwrap();
        inv.nodes[i].local_boot = Some(LocalBoot::Http404);
        let p = installed(&inv);
        assert!(p.is_not_found(), "{p:?}");
        let s = Scripts::new().plan(&p, "http://x");
        assert!(!s.starts_with("#!ipxe"), "a 404 body is no script: {s}");
        inv.nodes[i].local_boot = Some(LocalBoot::Exit);
        assert!(!installed(&inv).is_not_found());
    }

    #[test]
    fn unknown_machines_follow_the_policy() {
        let lab = inv("lab.yaml"); // discover
        let rack = inv("rack.yaml"); // ignore
        let f = facts("arm64");
        let input = PlanInput {
            mac: "02:00:00:00:00:99".parse().unwrap(),
            state: NodeState::Provisioning,
            facts: &f,
            factory_cmdline: None,
            config_url: Some("http://x/config/tok".into()),
        };
        let BootPlan::Talos { node, set, cmdline } = plan(&lab, &input) else {
            panic!()
        };
        assert_eq!(node, None);
        assert_eq!(set.arch, "arm64");
        assert!(!cmdline.iter().any(|a| a.starts_with("talos.config=")));
        assert!(matches!(plan(&rack, &input), BootPlan::Refuse { .. }));
    }

    #[test]
    fn arch_mismatch_is_refused_with_a_reason() {
        let inv = inv("lab.yaml");
        let f = facts("arm64");
        let p = plan(
            &inv,
            &PlanInput {
                mac: "bc:24:11:40:00:01".parse().unwrap(),
                state: NodeState::Provisioning,
                facts: &f,
                factory_cmdline: None,
                config_url: None,
            },
        );
        let BootPlan::Refuse { reason } = p else {
            panic!()
        };
        assert!(
            reason.contains("amd64 in the inventory but this iPXE is arm64"),
            "{reason}"
        );
    }

    #[test]
    fn a_kernel_argument_against_talos_is_refused_naming_the_field() {
        let mut inv = inv("lab.yaml");
        let f = facts("x86_64");
        let input = PlanInput {
            mac: "bc:24:11:40:00:01".parse().unwrap(),
            state: NodeState::Provisioning,
            facts: &f,
            factory_cmdline: None,
            config_url: None,
        };
        inv.nodes[0].kernel_args = vec!["pti=off".into()];
        let BootPlan::Refuse { reason } = plan(&inv, &input) else {
            panic!()
        };
        assert_eq!(
            reason,
            "kernel argument `pti=off` conflicts with `pti=on`, which Talos requires; \
             remove it from the kernelArgs of node k8s-ctrl-01"
        );
        inv.nodes[0].kernel_args.clear();
        inv.boot.kernel_args = vec!["slab_nomerge=0".into()];
        let BootPlan::Refuse { reason } = plan(&inv, &input) else {
            panic!()
        };
        assert!(
            reason
                .ends_with("which Talos requires; remove it from the inventory's boot.kernelArgs"),
            "{reason}"
        );
    }

    #[test]
    fn chain_script_uses_ipxe_variables() {
        let s = Scripts::new().chain("http://10.0.40.5:8080");
        assert!(s.contains("chain --replace --autofree http://10.0.40.5:8080/boot.ipxe?mac=${netX/mac:hexhyp}&arch=${buildarch}&platform=${platform}"), "{s}");
    }

    /// The fallback retries the per-MAC script, then exits: a bare `/boot.ipxe` would answer
    /// this chain script again, and a 404 (`http404` local boot) would loop forever.
    #[test]
    fn chain_script_gives_up_to_the_firmware_after_one_retry() {
        let s = Scripts::new().chain("http://h:1");
        let chains: Vec<&str> = s.lines().filter(|l| l.starts_with("chain ")).collect();
        assert_eq!(chains.len(), 2, "{s}");
        assert!(chains.iter().all(|l| l.contains("/boot.ipxe?mac=")), "{s}");
        assert!(chains[1].ends_with("|| exit"), "{s}");
    }
}
