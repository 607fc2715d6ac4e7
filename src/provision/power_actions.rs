//! What the provisioner asks of a node's power controller, off the writer loop: the disk as
//! persistent boot device once installed, and a network boot for a rebuild whose Talos API
//! does not answer. Outcomes are `power.action` events, never the node's phase.

use std::net::{IpAddr, SocketAddr};
use std::time::Duration;

use super::Provisioner;
use crate::events::EventKind;

impl Provisioner {
    /// [`Effect::SetDiskBoot`](super::core::Effect::SetDiskBoot): the persistent boot device
    /// of an installed node becomes its disk. Off the writer loop (a BMC may take seconds);
    /// the outcome is a `power.action` event, and a failure is only that: the node is
    /// installed either way.
    pub(super) fn set_disk_boot(&self, name: &str) {
        let Some(driver) = self.settings().power.get(name).cloned() else {
            return;
        };
        let (bus, name) = (self.inner.bus.clone(), name.to_owned());
        tokio::spawn(async move {
            let detail = match driver
                .set_boot_device(
                    crate::power::BootDevice::Disk,
                    crate::power::BootPersistence::Persistent,
                )
                .await
            {
                Ok(set) => format!(
                    "installed: persistent boot device set to disk through {}{set}",
                    driver.target()
                ),
                Err(e) => {
                    tracing::warn!(node = %name, "setting the disk boot device failed: {e}");
                    format!("installed; setting the persistent disk boot device failed: {e}")
                }
            };
            bus.publish(&name, EventKind::Power, detail);
        });
    }

    /// A rebuilt node whose Talos API does not answer cannot be reset over it: with a power
    /// controller, a one-time network boot and a power cycle send it to talboot, and the
    /// reopened window provisions it again (the core's normal rebuild path then sees it in
    /// maintenance mode). Off the writer loop: the check waits for a TCP answer.
    pub(super) fn rebuild_by_power(&self, name: &str) {
        let (Some(driver), Ok(node)) = (
            self.settings().power.get(name).cloned(),
            self.node_def(name),
        ) else {
            return;
        };
        let addr = SocketAddr::new(
            IpAddr::V4(node.address.value.addr()),
            self.settings().apid_port,
        );
        let (bus, name) = (self.inner.bus.clone(), name.to_owned());
        tokio::spawn(async move {
            if crate::power::dispatch::tcp_answers(addr, Duration::from_secs(3)).await {
                return;
            }
            let detail = match driver.reboot_into_network().await {
                Ok(set) => format!(
                    "Talos API at {addr} did not answer: one-time network boot and power cycle through {}{set}",
                    driver.target()
                ),
                Err(e) => format!("Talos API at {addr} did not answer; power control failed: {e}"),
            };
            bus.publish(&name, EventKind::Power, detail);
        });
    }
}
