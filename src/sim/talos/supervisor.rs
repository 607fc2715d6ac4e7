//! The Talos double's boots: the supervisor that binds apid's listener with the TLS setup the
//! node's state calls for, serves until a reboot, halt or stop, and runs the boot hook between
//! two lives; and the accept loop with apid's connection rules.

use std::net::{IpAddr, SocketAddr};
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
            None => {
                let boot = match boot_tls(&shared) {
                    Ok(NextBoot::Up(boot)) => *boot,
                    Ok(NextBoot::AwaitingTrustd) => {
                        tracing::debug!(node = %shared.cfg.ip, "waiting for a control plane to issue the apid certificate");
                        // The machine runs on meanwhile (an install goes on): take its
                        // lifecycle commands too.
                        let cmd = tokio::select! {
                            _ = stop.wait_for(|s| *s) => {
                                shared.phase.send_replace(Phase::Stopped);
                                return;
                            }
                            _ = tokio::time::sleep(TRUSTD_RETRY) => continue,
                            cmd = lifecycle.recv() => cmd,
                        };
                        match cmd {
                            Some(Lifecycle::RestartApi) => continue,
                            Some(Lifecycle::Reboot(reason)) => {
                                rebooted = true;
                                if !run_boot_hook(&shared, &mut stop, reason).await {
                                    return;
                                }
                                continue;
                            }
                            Some(Lifecycle::Halt) => {
                                park(&shared, &mut stop, Phase::Halted).await;
                                shared.phase.send_replace(Phase::Stopped);
                                return;
                            }
                            None => {
                                shared.phase.send_replace(Phase::Stopped);
                                return;
                            }
                        }
                    }
                    Ok(NextBoot::Halted) => {
                        park(&shared, &mut stop, Phase::Halted).await;
                        shared.phase.send_replace(Phase::Stopped);
                        return;
                    }
                    Err(e) => {
                        tracing::warn!(node = %shared.cfg.ip, error = %e, "simulated node failed to boot");
                        park(&shared, &mut stop, Phase::Failed(e.to_string())).await;
                        return;
                    }
                };
                let addr = shared.cfg.addr();
                match bind(addr).await {
                    Ok(l) => (boot, l),
                    Err(source) => {
                        let e = SimError::Bind { addr, source };
                        tracing::warn!(node = %shared.cfg.ip, error = %e, "simulated node failed to boot");
                        park(&shared, &mut stop, Phase::Failed(e.to_string())).await;
                        return;
                    }
                }
            }
        };

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
                    MachineServiceServer::new(api.clone())
                        .max_decoding_message_size(32 * 1024 * 1024),
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
        if std::mem::take(&mut rebooted) {
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

        match next {
            Some(Lifecycle::RestartApi) => {}
            Some(Lifecycle::Reboot(reason)) => {
                rebooted = true;
                if !run_boot_hook(&shared, &mut stop, reason).await {
                    return;
                }
            }
            Some(Lifecycle::Halt) => {
                park(&shared, &mut stop, Phase::Halted).await;
                shared.phase.send_replace(Phase::Stopped);
                return;
            }
            None => {
                shared.phase.send_replace(Phase::Stopped);
                return;
            }
        };
    }
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
