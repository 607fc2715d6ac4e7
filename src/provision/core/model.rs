//! Model test of the pure core: random interleavings of observations against a simulated
//! machine, with duplicates, late and reordered replies, forged replies and bindings from a
//! hostile host, lost replies, and restarts at any point (the state re-created from what
//! the adapter persisted). Checks the invariants of issue 11 after every step.

use std::net::Ipv4Addr;
use std::time::Duration;

use proptest::prelude::*;

use super::*;

const NODE_MAC: Mac = Mac([0x02, 0, 0, 0, 0, 1]);
const HOSTILE_MAC: Mac = Mac([0x02, 0, 0, 0, 0, 0x66]);
const NODE_IP: Ipv4Addr = Ipv4Addr::new(10, 0, 0, 11);
const HOSTILE_IP: Ipv4Addr = Ipv4Addr::new(10, 0, 0, 66);

/// What the simulated machine is doing.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Mode {
    /// Powered off / rebooting: nothing answers.
    Down,
    /// Maintenance mode, no config.
    Maintenance,
    /// Config taken, installing.
    Installing,
    /// Installed, booted from disk, machine stage running.
    Running,
    /// Reset accepted, wiping.
    Resetting,
}

/// The simulated machine, and what the invariants need to know about its history.
#[derive(Clone, Debug)]
struct World {
    mode: Mode,
    /// Boot generation: a new one whenever it comes up in maintenance mode.
    boot: u64,
    /// An apply was accepted in this boot.
    accepted_this_boot: bool,
    /// The machine reached stage running in this boot.
    running_this_boot: bool,
    /// The disk check refuses this machine.
    bad_disk: bool,
    /// The install fails (the machine reboots into maintenance mode).
    install_fails: bool,
    /// It is the last voting etcd member.
    last_voter: bool,
}

/// A random step of the run.
#[derive(Clone, Debug)]
enum Act {
    /// DHCP binding: 0 the node's, 1 none (expired), 2 a hostile host's MAC.
    Binding(u8),
    BootSeen,
    Poll,
    Rebuild,
    /// Send the queued call at this index to the machine.
    Send(usize),
    /// Deliver the reply at this index (and keep a copy when `dup`).
    Deliver(usize, bool),
    /// The call at this index times out (sent or not): its reply is "no answer".
    Timeout(usize),
    /// A forged reply: wrong op or from the hostile address.
    Forge(u8, bool),
    /// The machine moves on by itself (install finishes or fails, reset lands, power).
    WorldTick,
    /// Time passes (seconds).
    Time(u8),
    /// talboot restarts: everything in flight is gone, the state is re-read.
    Restart,
}

fn act() -> impl Strategy<Value = Act> {
    prop_oneof![
        3 => Just(Act::Binding(0)),
        1 => (1u8..3).prop_map(Act::Binding),
        1 => Just(Act::BootSeen),
        6 => Just(Act::Poll),
        1 => Just(Act::Rebuild),
        5 => (0usize..4).prop_map(Act::Send),
        5 => (0usize..4, any::<bool>()).prop_map(|(i, d)| Act::Deliver(i, d)),
        1 => (0usize..4).prop_map(Act::Timeout),
        2 => (0u8..20, any::<bool>()).prop_map(|(o, h)| Act::Forge(o, h)),
        3 => Just(Act::WorldTick),
        1 => (0u8..200).prop_map(Act::Time),
        1 => Just(Act::Restart),
    ]
}

struct Run {
    ctx: NodeCtx,
    state: NodeState,
    /// What the adapter persisted (it persists before performing effects).
    persisted: (NodeRecord, Lifecycle),
    world: World,
    /// Calls decided but not sent.
    queued: Vec<Pending>,
    /// Replies on their way back.
    replies: Vec<(u64, Ipv4Addr, Outcome)>,
    now: u64,
    /// Apply calls that reached the machine per boot.
    applies: std::collections::HashMap<u64, u32>,
    /// `SetDiskBoot` effects in all, and since the last rebuild.
    disk_boots: u32,
    disk_boots_since_rebuild: u32,
}

impl Run {
    fn new(w: World, disk_boot: bool) -> Self {
        let state = NodeState::fresh("n1", 1000);
        Self {
            ctx: NodeCtx {
                macs: vec![NODE_MAC],
                control_plane: true,
                install_timeout: Duration::from_secs(1200),
                reset_timeout: Duration::from_secs(900),
                disk_boot,
            },
            persisted: (state.rec.clone(), state.life.clone()),
            state,
            world: w,
            queued: Vec::new(),
            replies: Vec::new(),
            now: 1000,
            applies: Default::default(),
            disk_boots: 0,
            disk_boots_since_rebuild: 0,
        }
    }

    fn observe(&mut self, obs: Observation) -> Result<(), TestCaseError> {
        let before = self.state.rec.phase;
        let (next, effects) = step(&self.state, obs.clone(), self.now, &self.ctx);
        self.state = next;
        self.persisted = (self.state.rec.clone(), self.state.life.clone());
        for e in &effects {
            if let Some(call) = e.call() {
                // Never a call (and so never a config) to an address DHCP did not bind to
                // this node's MAC.
                prop_assert_eq!(call.ip, NODE_IP, "call to an unbound address: {:?}", e);
                self.queued.push(call);
            }
            if let Effect::Fail { reason, .. } = e {
                prop_assert!(!reason.trim().is_empty(), "failure without a reason");
            }
            if let Effect::Reset { graceful, .. } = e {
                prop_assert_eq!(*graceful, !self.world.last_voter);
            }
            if *e == Effect::SetDiskBoot {
                // Only with a controller that sets boot devices, only as the node becomes
                // Ready (installed, booted from disk), and once per install even across
                // restarts.
                prop_assert!(self.ctx.disk_boot, "disk boot without a controller");
                prop_assert!(
                    self.state.rec.phase == NodePhase::Ready && before != NodePhase::Ready,
                    "disk boot outside the step into Ready: {:?}",
                    obs
                );
                self.disk_boots += 1;
                self.disk_boots_since_rebuild += 1;
                prop_assert!(
                    self.disk_boots_since_rebuild <= 1,
                    "disk boot set twice for one install"
                );
            }
        }
        let s = &self.state;
        if s.rec.phase == NodePhase::Failed {
            prop_assert!(
                s.life
                    .failure
                    .as_deref()
                    .is_some_and(|f| !f.trim().is_empty()),
                "Failed without a reason after {:?}",
                obs
            );
        }
        if s.rec.phase == NodePhase::Ready && before != NodePhase::Ready {
            // Never Ready without install evidence from this boot.
            prop_assert!(
                self.world.running_this_boot,
                "Ready without install evidence: {:?} world {:?}",
                obs,
                self.world
            );
        }
        Ok(())
    }

    /// The machine answers call `p` (its side effects happen now).
    fn answer(&mut self, p: Pending) -> Result<Outcome, TestCaseError> {
        use Outcome as O;
        let w = &mut self.world;
        let version = || "v1.13.9".to_owned();
        Ok(match (p.kind, w.mode) {
            (_, Mode::Down) => match p.kind {
                CallKind::Apply => O::ApplyLost { why: "down".into() },
                _ => O::NoAnswer { why: "down".into() },
            },
            (CallKind::Probe, Mode::Maintenance) => O::Maintenance { version: version() },
            (CallKind::Probe, Mode::Installing | Mode::Resetting) => O::ConfiguredUnusable {
                why: "apid restarting".into(),
            },
            (CallKind::Probe, Mode::Running) => O::Configured { version: version() },
            (CallKind::ReadFacts, Mode::Maintenance) if w.bad_disk => O::DiskRefused {
                why: "no disk matches".into(),
            },
            (CallKind::ReadFacts, Mode::Maintenance) => O::FactsOk {
                install_disk: "/dev/sda".into(),
            },
            (CallKind::ReadFacts, _) => O::LeftMaintenance,
            (CallKind::Apply, Mode::Maintenance) => {
                *self.applies.entry(w.boot).or_default() += 1;
                // At most one apply per boot: a second one in a boot that took a config
                // could only come from a core that forgot it applied.
                prop_assert!(!w.accepted_this_boot, "second apply in boot {}", w.boot);
                w.accepted_this_boot = true;
                w.mode = Mode::Installing;
                O::ApplyAccepted
            }
            (CallKind::Apply, _) => {
                *self.applies.entry(w.boot).or_default() += 1;
                prop_assert!(false, "apply to a machine not in maintenance mode: {:?}", w);
                unreachable!()
            }
            (CallKind::ResolveApply, Mode::Maintenance) => O::Maintenance { version: version() },
            (CallKind::ResolveApply, _) => O::LeftMaintenance,
            (CallKind::WatchInstall, Mode::Running) => O::StageRunning { version: version() },
            (CallKind::WatchInstall, Mode::Installing) => O::Stage {
                name: "installing".into(),
            },
            (CallKind::WatchInstall, Mode::Maintenance) => O::BackInMaintenance,
            (CallKind::WatchInstall, Mode::Resetting) => O::Stage {
                name: "resetting".into(),
            },
            (CallKind::PrepareReset, Mode::Maintenance) => O::Maintenance { version: version() },
            (CallKind::PrepareReset, _) => O::ResetTarget {
                last_voter: w.last_voter,
            },
            (CallKind::Reset, Mode::Running | Mode::Installing) => {
                w.mode = Mode::Resetting;
                O::ResetAccepted
            }
            (CallKind::Reset, Mode::Resetting) => O::ResetAccepted,
            (CallKind::Reset, Mode::Maintenance) => O::ResetRefused {
                why: "maintenance mode has no Reset".into(),
            },
            (CallKind::WatchReset, Mode::Maintenance) => O::Maintenance { version: version() },
            (CallKind::WatchReset, _) => O::StillConfigured,
        })
    }

    fn new_boot(&mut self) {
        self.world.mode = Mode::Maintenance;
        self.world.boot += 1;
        self.world.accepted_this_boot = false;
        self.world.running_this_boot = false;
    }

    fn world_tick(&mut self) {
        match self.world.mode {
            Mode::Installing if self.world.install_fails => self.new_boot(),
            Mode::Installing => {
                self.world.mode = Mode::Running;
                self.world.running_this_boot = true;
            }
            Mode::Resetting => self.new_boot(),
            Mode::Down => self.new_boot(),
            Mode::Maintenance | Mode::Running => {}
        }
    }

    fn apply(&mut self, a: Act) -> Result<(), TestCaseError> {
        match a {
            Act::Binding(0) => self.observe(Observation::Binding(Some(Binding {
                mac: NODE_MAC,
                ip: NODE_IP,
            })))?,
            Act::Binding(1) => self.observe(Observation::Binding(None))?,
            Act::Binding(_) => self.observe(Observation::Binding(Some(Binding {
                mac: HOSTILE_MAC,
                ip: HOSTILE_IP,
            })))?,
            Act::BootSeen => self.observe(Observation::BootSeen)?,
            Act::Poll => self.observe(Observation::Poll)?,
            Act::Rebuild => {
                self.disk_boots_since_rebuild = 0;
                self.observe(Observation::RebuildRequested)?;
            }
            Act::Send(i) if !self.queued.is_empty() => {
                let p = self.queued.remove(i % self.queued.len());
                let o = self.answer(p)?;
                self.replies.push((p.op, p.ip, o));
            }
            Act::Deliver(i, dup) if !self.replies.is_empty() => {
                let idx = i % self.replies.len();
                let (op, at, outcome) = if dup {
                    self.replies[idx].clone()
                } else {
                    self.replies.remove(idx)
                };
                self.observe(Observation::Result { op, at, outcome })?;
            }
            Act::Timeout(i) if !self.queued.is_empty() || !self.replies.is_empty() => {
                let total = self.queued.len() + self.replies.len();
                let idx = i % total;
                let (op, at, kind) = if idx < self.queued.len() {
                    let p = self.queued.remove(idx);
                    (p.op, p.ip, p.kind)
                } else {
                    let (op, at, o) = self.replies.remove(idx - self.queued.len());
                    let kind = if matches!(o, Outcome::ApplyAccepted) {
                        CallKind::Apply
                    } else {
                        CallKind::Probe
                    };
                    (op, at, kind)
                };
                let outcome = match kind {
                    CallKind::Apply => Outcome::ApplyLost {
                        why: "deadline exceeded".into(),
                    },
                    _ => Outcome::NoAnswer {
                        why: "deadline exceeded".into(),
                    },
                };
                self.observe(Observation::Result { op, at, outcome })?;
            }
            Act::Forge(op, hostile) => {
                let at = if hostile { HOSTILE_IP } else { NODE_IP };
                let op = if hostile {
                    self.state.pending.map(|p| p.op).unwrap_or(op as u64)
                } else {
                    op as u64 + 1000
                };
                // The answer that would move the node furthest, whatever it waits for.
                let outcome = match self.state.pending.map(|p| p.kind) {
                    Some(CallKind::Probe | CallKind::ResolveApply | CallKind::WatchReset) => {
                        Outcome::Maintenance {
                            version: "forged".into(),
                        }
                    }
                    Some(CallKind::ReadFacts) => Outcome::FactsOk {
                        install_disk: "/dev/forged".into(),
                    },
                    Some(CallKind::Apply) => Outcome::ApplyAccepted,
                    _ => Outcome::StageRunning {
                        version: "forged".into(),
                    },
                };
                self.observe(Observation::Result { op, at, outcome })?;
            }
            Act::WorldTick => self.world_tick(),
            Act::Time(s) => self.now += s as u64 * 10,
            Act::Restart => {
                self.queued.clear();
                self.replies.clear();
                let (rec, life) = self.persisted.clone();
                self.state = NodeState::from_persisted(rec, life);
            }
            Act::Send(_) | Act::Deliver(..) | Act::Timeout(_) => {}
        }
        Ok(())
    }

    /// A fair end: the binding is known, every call is answered, the machine moves on.
    fn drain(&mut self) -> Result<(), TestCaseError> {
        self.observe(Observation::Binding(Some(Binding {
            mac: NODE_MAC,
            ip: NODE_IP,
        })))?;
        for _ in 0..200 {
            self.now += 30;
            self.world_tick();
            while !self.replies.is_empty() {
                self.apply(Act::Deliver(0, false))?;
            }
            while !self.queued.is_empty() {
                self.apply(Act::Send(0))?;
                self.apply(Act::Deliver(0, false))?;
            }
            if matches!(self.state.rec.phase, NodePhase::Ready | NodePhase::Failed)
                && self.state.pending.is_none()
            {
                break;
            }
            self.observe(Observation::Poll)?;
        }
        Ok(())
    }
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 512, ..ProptestConfig::default() })]

    #[test]
    fn node_machine_keeps_its_invariants(
        acts in proptest::collection::vec(act(), 0..120),
        bad_disk in proptest::bool::weighted(0.1),
        install_fails in proptest::bool::weighted(0.15),
        last_voter in any::<bool>(),
        starts_down in any::<bool>(),
        disk_boot in any::<bool>(),
    ) {
        let mut run = Run::new(World {
            mode: if starts_down { Mode::Down } else { Mode::Maintenance },
            boot: 0,
            accepted_this_boot: false,
            running_this_boot: false,
            bad_disk,
            install_fails,
            last_voter,
        }, disk_boot);
        for a in acts {
            run.apply(a)?;
        }
        run.drain()?;
        for (boot, n) in &run.applies {
            prop_assert!(*n <= 1, "{n} applies in boot {boot}");
        }
        // Settled, with evidence: Ready only on a running machine, Failed with a reason.
        let phase = run.state.rec.phase;
        prop_assert!(
            matches!(phase, NodePhase::Ready | NodePhase::Failed | NodePhase::Maintenance),
            "not settled: {:?} / {:?}", run.state, run.world
        );
        if phase == NodePhase::Ready {
            prop_assert_eq!(run.world.mode, Mode::Running);
            // An installed node with a boot-device controller was asked to boot its disk.
            prop_assert_eq!(run.disk_boots_since_rebuild, u32::from(disk_boot));
        }
        if !disk_boot {
            prop_assert_eq!(run.disk_boots, 0);
        }
        if phase == NodePhase::Maintenance {
            // Only a node whose window closed waits in maintenance (a config is never pushed
            // to it without a rebuild).
            prop_assert!(!run.state.rec.provisioning_window_open);
        }
        if !bad_disk && !install_fails && phase == NodePhase::Failed {
            // Without an injected fault only the install/reset deadlines can fail it.
            let f = run.state.life.failure.clone().unwrap_or_default();
            prop_assert!(f.contains("within"), "unexpected failure: {f}");
        }
    }
}

/// The cluster side: etcd as the world sees it.
#[derive(Clone, Debug, Default)]
struct Etcd {
    /// Which node holds the cluster's etcd, and how many times an etcd cluster was created.
    on: Option<String>,
    created: u32,
}

#[derive(Clone, Debug)]
enum CAct {
    /// Control plane i changes phase (0 Ready, 1 Failed, 2 Installing).
    Phase(usize, u8),
    /// A cluster step: choose, then bootstrap; `lose` drops the call's reply.
    Step { lose: bool },
    /// talboot restarts between the intent and the call.
    CrashBeforeCall,
}

fn cact() -> impl Strategy<Value = CAct> {
    prop_oneof![
        3 => (0usize..3, 0u8..3).prop_map(|(i, p)| CAct::Phase(i, p)),
        5 => any::<bool>().prop_map(|lose| CAct::Step { lose }),
        1 => Just(CAct::CrashBeforeCall),
    ]
}

/// One cluster step the way [`super::super::cluster`] performs it; returns whether the
/// bootstrap is done. Persisting is the returned state.
fn cluster_step(
    s: &mut ClusterState,
    cps: &[(String, NodePhase)],
    etcd: &mut Etcd,
    lose: bool,
    crash_before_call: bool,
) {
    // A `Ready` phase here stands for "ready for Bootstrap" (a probe found the node booted
    // from disk with etcd started), which is what the choice needs.
    let view: Vec<(String, ForBootstrap)> = cps
        .iter()
        .map(|(n, p)| (n.clone(), ForBootstrap::of_phase(*p)))
        .collect();
    let Some(choice) = choose_bootstrap_node(s, &view) else {
        return;
    };
    let name = match choice {
        Choice::Keep(n) => n,
        Choice::Persist { name, .. } => {
            s.bootstrap_node = Some(name.clone());
            name
        }
    };
    if s.bootstrap == BootstrapMark::Done {
        return;
    }
    let ready = s.bootstrap_node.as_deref() == Some(name.as_str())
        && cps
            .iter()
            .any(|(n, p)| *n == name && *p == NodePhase::Ready);
    let (next, e) = bootstrap_step(
        s,
        BootstrapObs::Poll {
            node: name.clone(),
            ready,
        },
    );
    *s = next;
    if e != BootstrapEffect::CheckEtcd {
        return;
    }
    if crash_before_call {
        return;
    }
    let members = usize::from(etcd.on.as_deref() == Some(name.as_str()));
    let (next, e) = bootstrap_step(s, BootstrapObs::EtcdMembers(members));
    *s = next;
    if e != BootstrapEffect::Bootstrap {
        return;
    }
    // The call lands whatever happens to its reply.
    let obs = match &etcd.on {
        Some(on) if *on == name => BootstrapObs::Bootstrapped,
        _ => {
            etcd.on = Some(name.clone());
            etcd.created += 1;
            BootstrapObs::Bootstrapped
        }
    };
    if lose {
        return;
    }
    *s = bootstrap_step(s, obs).0;
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 512, ..ProptestConfig::default() })]

    #[test]
    fn exactly_one_bootstrap_per_cluster(acts in proptest::collection::vec(cact(), 0..60)) {
        let mut s = ClusterState {
            bootstrap_node: None,
            bootstrap: BootstrapMark::None,
            kubeconfig_done: false,
            step: None,
        };
        let mut cps: Vec<(String, NodePhase)> = (1..=3)
            .map(|i| (format!("cp-{i}"), NodePhase::Installing))
            .collect();
        let mut etcd = Etcd::default();
        for a in acts {
            match a {
                CAct::Phase(i, p) => {
                    cps[i].1 = [NodePhase::Ready, NodePhase::Failed, NodePhase::Installing][p as usize];
                }
                CAct::Step { lose } => cluster_step(&mut s, &cps, &mut etcd, lose, false),
                CAct::CrashBeforeCall => cluster_step(&mut s, &cps, &mut etcd, false, true),
            }
            prop_assert!(etcd.created <= 1, "a second etcd cluster: {:?} {:?}", s, etcd);
        }
        // Fairly: the chosen node (or, before any intent, every control plane) recovers.
        for cp in cps.iter_mut() {
            cp.1 = NodePhase::Ready;
        }
        for _ in 0..5 {
            cluster_step(&mut s, &cps, &mut etcd, false, false);
        }
        prop_assert_eq!(etcd.created, 1, "{:?}", s);
        prop_assert_eq!(s.bootstrap, BootstrapMark::Done);
        prop_assert!(s.bootstrap_node == etcd.on);
    }
}

#[test]
fn rebuilding_the_last_etcd_member_bootstraps_again_on_the_same_node() {
    let s = ClusterState {
        bootstrap_node: Some("cp-1".into()),
        bootstrap: BootstrapMark::Done,
        kubeconfig_done: true,
        step: None,
    };
    let s = forget_bootstrap(&s, "cp-1", 5);
    assert!(!s.kubeconfig_written());
    let cps = vec![
        ("cp-2".to_owned(), ForBootstrap::Ready),
        ("cp-1".to_owned(), ForBootstrap::NotReady),
    ];
    // Rebuilt and not Failed: the same node is kept, and bootstrapped once it is Ready.
    assert_eq!(
        choose_bootstrap_node(&s, &cps),
        Some(Choice::Keep("cp-1".into()))
    );
    let (s, e) = bootstrap_step(
        &s,
        BootstrapObs::Poll {
            node: "cp-1".into(),
            ready: true,
        },
    );
    assert_eq!(e, BootstrapEffect::CheckEtcd);
    assert_eq!(s.bootstrap, BootstrapMark::Intent);
}

/// Issue 24 item 0: a control plane of a new cluster never reaches stage running before
/// Bootstrap, so readiness for Bootstrap is stage booting (or running) with etcd started,
/// never stage running alone, and never the brief booting before the install.
#[test]
fn ready_for_bootstrap_is_booted_from_disk_with_etcd_started() {
    let probe = |stage: &str, etcd: Option<&str>| BootstrapProbe {
        stage: stage.into(),
        etcd: etcd.map(str::to_owned),
    };
    // Waiting to join (etcd `Preparing`) in stage booting: the node upstream bootstraps.
    assert_eq!(
        bootstrap_readiness(&probe("booting", Some("Preparing"))),
        Ok(())
    );
    assert_eq!(
        bootstrap_readiness(&probe("running", Some("Running"))),
        Ok(())
    );
    // Booting before the install (no etcd loaded yet), installing, rebooting: not yet.
    let early = bootstrap_readiness(&probe("booting", None))
        .unwrap_err()
        .to_string();
    assert!(early.contains("not booted from disk"), "{early}");
    for stage in ["installing", "rebooting", "maintenance", "resetting"] {
        let why = bootstrap_readiness(&probe(stage, Some("Preparing")))
            .unwrap_err()
            .to_string();
        assert!(why.contains(stage), "{why}");
    }
    // The choice persists the first ready control plane, probed or Ready.
    let s = ClusterState {
        bootstrap_node: None,
        bootstrap: BootstrapMark::None,
        kubeconfig_done: false,
        step: None,
    };
    let cps = vec![
        ("cp-1".to_owned(), ForBootstrap::Failed),
        ("cp-2".to_owned(), ForBootstrap::NotReady),
        ("cp-3".to_owned(), ForBootstrap::Ready),
    ];
    assert_eq!(
        choose_bootstrap_node(&s, &cps),
        Some(Choice::Persist {
            name: "cp-3".into(),
            replaces: None
        })
    );
    assert_eq!(
        ForBootstrap::of_phase(NodePhase::Installing),
        ForBootstrap::NotReady
    );
}

/// An installed node: `SetDiskBoot` comes once, with the step into Ready, only with a
/// controller that sets boot devices; the node restarted Ready does not ask again, and a
/// rebuild's reinstall asks again.
#[test]
fn disk_boot_is_set_once_when_the_node_is_installed() {
    let bound = Some(Binding {
        mac: NODE_MAC,
        ip: NODE_IP,
    });
    let installed = |disk_boot: bool, start: &NodeState| {
        let ctx = NodeCtx {
            macs: vec![NODE_MAC],
            control_plane: false,
            install_timeout: Duration::from_secs(1200),
            reset_timeout: Duration::from_secs(900),
            disk_boot,
        };
        let mut s = start.clone();
        s.rec.phase = NodePhase::Installing;
        s.bound = bound;
        let (s, e) = step(&s, Observation::Poll, 1010, &ctx);
        let Some(Effect::WatchInstall { op, ip }) = e.first().cloned() else {
            panic!("{e:?}")
        };
        let obs = Observation::Result {
            op,
            at: ip,
            outcome: Outcome::StageRunning {
                version: "v1.13.9".into(),
            },
        };
        let (s, e) = step(&s, obs, 1020, &ctx);
        assert_eq!(s.rec.phase, NodePhase::Ready);
        (s, e, ctx)
    };
    let count = |e: &[Effect]| e.iter().filter(|e| **e == Effect::SetDiskBoot).count();

    let (s, e, ctx) = installed(true, &NodeState::fresh("n1", 1000));
    assert_eq!(count(&e), 1, "{e:?}");
    // Restarted: the persisted part only, Ready; polls and bindings ask nothing again.
    let mut again = NodeState::from_persisted(s.rec.clone(), s.life.clone());
    for obs in [
        Observation::Binding(bound),
        Observation::Poll,
        Observation::Poll,
    ] {
        let (next, e) = step(&again, obs, 1030, &ctx);
        assert_eq!(count(&e), 0, "{e:?}");
        again = next;
    }
    // A rebuild reinstalls: disk boot is set again after it.
    let (rebuilt, _) = step(&again, Observation::RebuildRequested, 1040, &ctx);
    let (_, e, _) = installed(true, &rebuilt);
    assert_eq!(count(&e), 1, "{e:?}");
    // Wake-on-LAN or no controller: never.
    let (_, e, _) = installed(false, &NodeState::fresh("n1", 1000));
    assert_eq!(count(&e), 0, "{e:?}");
}

/// Issue 24 item 4: a node that holds no config from talboot has nothing to reset.
#[test]
fn a_rebuild_of_a_node_without_a_config_is_refused_with_what_happens_instead() {
    use super::{RebuildRefused, check_rebuild};
    let fresh = NodeRecord::unseen("wk-9", 0);
    assert_eq!(
        check_rebuild(&fresh),
        Err(RebuildRefused::NeverSeen {
            node: "wk-9".into()
        })
    );
    let msg = check_rebuild(&fresh).unwrap_err().to_string();
    assert!(msg.contains("never provisioned"), "{msg}");
    assert!(msg.contains("first network boot"), "{msg}");
    let at = |phase, open| NodeRecord {
        phase,
        provisioning_window_open: open,
        ..NodeRecord::unseen("wk-9", 0)
    };
    assert!(matches!(
        check_rebuild(&at(NodePhase::Booting, true)),
        Err(RebuildRefused::Booting { .. })
    ));
    assert!(matches!(
        check_rebuild(&at(NodePhase::Maintenance, true)),
        Err(RebuildRefused::AwaitingConfig { .. })
    ));
    // Anything that holds (or may hold) talboot's config, a failed node, and a node whose
    // window closed (its config applied) may be rebuilt.
    for phase in [
        NodePhase::Configuring,
        NodePhase::Installing,
        NodePhase::Ready,
        NodePhase::Rebuilding,
        NodePhase::Failed,
    ] {
        assert_eq!(check_rebuild(&at(phase, true)), Ok(()), "{phase}");
    }
    for phase in [
        NodePhase::Unknown,
        NodePhase::Booting,
        NodePhase::Maintenance,
    ] {
        assert_eq!(check_rebuild(&at(phase, false)), Ok(()), "{phase}");
    }
}
