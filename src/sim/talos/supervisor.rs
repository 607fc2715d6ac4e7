//! The Talos double's boots: the supervisor that binds apid's listener with the TLS setup the
//! node's state calls for, serves until a reboot, halt or stop, and runs the boot hook between
//! two lives; and the accept loop with apid's connection rules.

use std::net::{IpAddr, SocketAddr};
use std::ops::ControlFlow;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::net::{TcpListener, TcpSocket, TcpStream};
use tokio::sync::{mpsc, oneshot, watch};
use tokio_rustls::TlsAcceptor;
use tokio_rustls::server::TlsStream;
use tokio_stream::wrappers::ReceiverStream;
use tonic::transport::Server;

use super::apid::NodeApi;
use super::sequences::boot_sequence;
use super::tls::{NextBoot, boot_tls};
use super::unattended;
use super::upgrade;
use super::{BootReason, Lifecycle, NodeState, Phase, Shared, lock};
use crate::sim::SimError;
use crate::talos::api::cosi::resource as cosi;
use crate::talos::api::machine::machine_service_server::MachineServiceServer;
use crate::talos::api::storage::storage_service_server::StorageServiceServer;
use crate::talos::api::talos::resource::definitions::runtime;

/// How often a worker waiting for trustd asks again.
pub(super) const TRUSTD_RETRY: Duration = Duration::from_millis(250);

/// The listener side of one boot.
pub(super) struct Boot {
    pub(super) phase: Phase,
    pub(super) tls: rustls::ServerConfig,
}

/// Parks a supervisor whose node is down for good until its owner stops it.
async fn park(shared: &Shared, stop: &mut watch::Receiver<bool>, phase: Phase) {
    shared.phase.send_replace(phase);
    let _ = stop.wait_for(|s| *s).await;
}

/// Runs boots until stopped: each boot binds `ip:port` with the TLS setup the node's state
/// calls for, serves until a reboot/halt/stop, then closes everything like a power cycle and
/// runs the boot hook before the next one. The first boot's listener is bound by `start`.
pub(super) async fn supervise(
    shared: Arc<Shared>,
    first: (Boot, TcpListener),
    mut lifecycle: mpsc::UnboundedReceiver<Lifecycle>,
    mut stop: watch::Receiver<bool>,
) {
    let mut first = Some(first);
    // A fresh boot (not just an apid restart): new event history, stage from the state.
    let mut rebooted = true;
    loop {
        let (boot, listener) = match first.take() {
            Some(first) => first,
            None => match power_up(&shared, &mut lifecycle, &mut stop, &mut rebooted).await {
                Down::Up(boot, listener) => (*boot, listener),
                Down::Retry => continue,
                Down::Gone => return,
            },
        };
        let next = serve_life(&shared, boot, listener, &mut lifecycle, &mut stop, rebooted).await;
        rebooted = false;
        if follow(&shared, &mut stop, next, &mut rebooted)
            .await
            .is_break()
        {
            return;
        }
    }
}

/// Where a node without a running apid goes next.
enum Down {
    /// A boot with its listener bound.
    Up(Box<Boot>, TcpListener),
    /// Not yet (a worker waiting for trustd): ask again.
    Retry,
    /// Down for good (halted, failed or stopped); the phase says which.
    Gone,
}

/// Brings apid up for the next life: the TLS setup the node's state calls for and the
/// listener. A worker without its certificate waits for trustd and meanwhile takes lifecycle
/// commands, as the machine runs on (an install goes on).
async fn power_up(
    shared: &Shared,
    lifecycle: &mut mpsc::UnboundedReceiver<Lifecycle>,
    stop: &mut watch::Receiver<bool>,
    rebooted: &mut bool,
) -> Down {
    let boot = match boot_tls(shared) {
        Ok(NextBoot::Up(boot)) => boot,
        Ok(NextBoot::AwaitingTrustd) => {
            tracing::debug!(node = %shared.cfg.ip, "waiting for a control plane to issue the apid certificate");
            let cmd = tokio::select! {
                _ = stop.wait_for(|s| *s) => {
                    shared.phase.send_replace(Phase::Stopped);
                    return Down::Gone;
                }
                _ = tokio::time::sleep(TRUSTD_RETRY) => return Down::Retry,
                cmd = lifecycle.recv() => cmd,
            };
            return match follow(shared, stop, cmd, rebooted).await {
                ControlFlow::Continue(()) => Down::Retry,
                ControlFlow::Break(()) => Down::Gone,
            };
        }
        Ok(NextBoot::Halted) => {
            park(shared, stop, Phase::Halted).await;
            shared.phase.send_replace(Phase::Stopped);
            return Down::Gone;
        }
        Err(e) => {
            tracing::warn!(node = %shared.cfg.ip, error = %e, "simulated node failed to boot");
            park(shared, stop, Phase::Failed(e.to_string())).await;
            return Down::Gone;
        }
    };
    let addr = shared.cfg.addr();
    match bind(addr).await {
        Ok(l) => Down::Up(boot, l),
        Err(source) => {
            let e = SimError::Bind { addr, source };
            tracing::warn!(node = %shared.cfg.ip, error = %e, "simulated node failed to boot");
            park(shared, stop, Phase::Failed(e.to_string())).await;
            Down::Gone
        }
    }
}

/// Acts on a lifecycle command (`None`: stopped, or the owner is gone): an apid restart and
/// a reboot (through the boot hook) lead to a next life; a halt parks the node.
async fn follow(
    shared: &Shared,
    stop: &mut watch::Receiver<bool>,
    cmd: Option<Lifecycle>,
    rebooted: &mut bool,
) -> ControlFlow<()> {
    match cmd {
        Some(Lifecycle::RestartApi) => ControlFlow::Continue(()),
        Some(Lifecycle::Reboot(reason)) => {
            *rebooted = true;
            if run_boot_hook(shared, stop, reason).await {
                ControlFlow::Continue(())
            } else {
                ControlFlow::Break(())
            }
        }
        Some(Lifecycle::Halt) => {
            park(shared, stop, Phase::Halted).await;
            shared.phase.send_replace(Phase::Stopped);
            ControlFlow::Break(())
        }
        None => {
            shared.phase.send_replace(Phase::Stopped);
            ControlFlow::Break(())
        }
    }
}

/// One life of apid: serves on `listener` until a lifecycle command or stop, then power
/// cycles (stop accepting, let replies in flight go out, cut the rest). Returns the command.
async fn serve_life(
    shared: &Arc<Shared>,
    boot: Boot,
    listener: TcpListener,
    lifecycle: &mut mpsc::UnboundedReceiver<Lifecycle>,
    stop: &mut watch::Receiver<bool>,
    rebooted: bool,
) -> Option<Lifecycle> {
    let (conn_tx, conn_rx) = mpsc::channel::<Result<TlsStream<TcpStream>, std::io::Error>>(16);
    let accept = tokio::spawn(accept_loop(
        listener,
        TlsAcceptor::from(Arc::new(boot.tls)),
        conn_tx,
        shared.firewall.clone(),
    ));
    let api = NodeApi {
        shared: shared.clone(),
    };
    let (down_tx, down_rx) = oneshot::channel::<()>();
    let mut server = tokio::spawn(
        Server::builder()
            .add_service(
                MachineServiceServer::new(api.clone()).max_decoding_message_size(32 * 1024 * 1024),
            )
            .add_service(StorageServiceServer::new(api.clone()))
            .add_service(upgrade::service(api.clone()))
            .add_service(upgrade::image_service(api.clone()))
            .add_service(cosi::state_server::StateServer::new(api))
            .serve_with_incoming_shutdown(ReceiverStream::new(conn_rx), async {
                let _ = down_rx.await;
            }),
    );
    tracing::debug!(node = %shared.cfg.ip, phase = ?boot.phase, "simulated node up");
    if rebooted {
        fresh_boot(shared);
    }
    shared.phase.send_replace(boot.phase);

    let next = tokio::select! {
        cmd = lifecycle.recv() => cmd,
        _ = stop.wait_for(|s| *s) => None,
    };

    // Power cycle: stop accepting (the listener closes), let replies in flight go out,
    // then cut whatever is left.
    accept.abort();
    let _ = accept.await;
    let _ = down_tx.send(());
    if tokio::time::timeout(Duration::from_secs(5), &mut server)
        .await
        .is_err()
    {
        server.abort();
    }
    next
}

/// What a machine that booted (not an apid restart) starts with: a new event history, the
/// boot's view of the configs, the stage its state implies (an installed system runs its
/// boot sequence) and the in-memory resources its controllers make again.
fn fresh_boot(shared: &Arc<Shared>) {
    lock(&shared.events).clear();
    lock(&shared.configs).on_boot(matches!(&*lock(&shared.state), NodeState::Maintenance));
    match &*lock(&shared.state) {
        NodeState::Maintenance => {
            shared.set_stage(runtime::RuntimeMachineStage::MachineStageMaintenance)
        }
        NodeState::Installed(inst) if inst.on_disk => {
            shared.set_stage(runtime::RuntimeMachineStage::MachineStageBooting);
            tokio::spawn(boot_sequence(shared.clone()));
        }
        _ => {}
    }
    unattended::on_boot(shared);
}

/// The machine is down between two lives: runs the boot hook (the simulated network boot).
/// False when the node was stopped meanwhile.
async fn run_boot_hook(
    shared: &Shared,
    stop: &mut watch::Receiver<bool>,
    reason: BootReason,
) -> bool {
    shared.phase.send_replace(Phase::Booting);
    shared.set_stage(runtime::RuntimeMachineStage::MachineStageBooting);
    upgrade::on_reboot(shared, reason);
    if let Some(hook) = shared.cfg.boot_hook.clone() {
        tracing::debug!(node = %shared.cfg.ip, ?reason, "simulated network boot");
        tokio::select! {
            () = hook(reason) => {}
            _ = stop.wait_for(|s| *s) => {
                shared.phase.send_replace(Phase::Stopped);
                return false;
            }
        }
    }
    true
}

/// Binds `addr` with SO_REUSEADDR so a reboot can rebind while old connections sit in
/// TIME_WAIT.
pub(super) async fn bind(addr: SocketAddr) -> std::io::Result<TcpListener> {
    let socket = match addr {
        SocketAddr::V4(_) => TcpSocket::new_v4()?,
        SocketAddr::V6(_) => TcpSocket::new_v6()?,
    };
    socket.set_reuseaddr(true)?;
    socket.bind(addr)?;
    socket.listen(64)
}

async fn accept_loop(
    listener: TcpListener,
    acceptor: TlsAcceptor,
    conns: mpsc::Sender<Result<TlsStream<TcpStream>, std::io::Error>>,
    firewall: Arc<Mutex<Option<IpAddr>>>,
) {
    loop {
        let (tcp, peer) = match crate::sim::accept_like_go(&listener).await {
            Ok(conn) => conn,
            Err(e) => {
                // E.g. out of file descriptors: back off instead of spinning.
                tracing::debug!(error = %e, "simulated server: accept failed");
                tokio::time::sleep(Duration::from_millis(50)).await;
                continue;
            }
        };
        let only_from = *lock(&firewall);
        if only_from.is_some_and(|allowed| allowed != peer.ip()) {
            // A firewall that rejects: reset the connection at once.
            let _ = tcp.set_zero_linger();
            drop(tcp);
            continue;
        }
        let acceptor = acceptor.clone();
        let conns = conns.clone();
        tokio::spawn(async move {
            let Ok(tls) = acceptor.accept(tcp).await else {
                return;
            };
            // grpc-go (hence apid) refuses clients that do not negotiate ALPN h2 (grpc-go
            // `credentials/tls.go` enforces ALPN since v1.67; Talos v1.13.9 builds with a
            // newer grpc-go, see its go.mod).
            if tls.get_ref().1.alpn_protocol() != Some(b"h2") {
                return;
            }
            let _ = conns.send(Ok(tls)).await;
        });
    }
}
