//! The long streamed calls: pulling the installer image (with its progress) and the
//! lifecycle upgrade, whose installer output arrives in raw chunks and is handed on as lines.

use std::time::Duration;

use tonic::Response;

use super::call::*;
use super::*;
use crate::talos::MAX_MESSAGE_SIZE;
use crate::talos::api::common;
use crate::talos::api::machine::{
    ImageServicePullProgress, ImageServicePullRequest, InstallArtifactsSource,
    LifecycleServiceUpgradeRequest, image_service_client, lifecycle_service_client,
};
use crate::talos::error::{Rpc, TalosError};

/// How long one `LifecycleService.Upgrade` stream may run (the installer writes a whole
/// system image). Generous on purpose: talosctl sets no deadline, and a stream cancelled
/// mid-install can leave the node's upgrade lock held until it reboots (siderolabs/talos
/// v1.13.9 `internal/app/lifecycle/container.go`, `streamOutput` stops reading the
/// installer's output when sending fails, so the installer can block on a full pipe and
/// `lifecycle.go`'s lock is never released): every later Upgrade is then refused with
/// "another installation/upgrade is already in progress".
const UPGRADE_DEADLINE: Duration = Duration::from_secs(3600);

/// How long one `ImageService.Pull` stream may run (an installer image is a few hundred MB;
/// the node itself retries a pull for up to 20 minutes, `internal/pkg/containers/image/
/// image.go`).
const PULL_DEADLINE: Duration = Duration::from_secs(1800);

/// The installer's output as lines. Upstream streams it in raw chunks of up to 512 bytes,
/// cut anywhere (siderolabs/talos v1.13.9 `internal/app/lifecycle/container.go`,
/// `streamOutput`), so a chunk may end mid-line or hold several lines.
#[derive(Default)]
pub(super) struct LineBuffer {
    partial: String,
}

impl LineBuffer {
    pub(super) fn push(&mut self, chunk: &str, out: &mut impl FnMut(&str)) {
        self.partial.push_str(chunk);
        while let Some(i) = self.partial.find('\n') {
            let line: String = self.partial.drain(..=i).collect();
            out(line.trim_end_matches(['\n', '\r']));
        }
    }

    pub(super) fn finish(&mut self, out: &mut impl FnMut(&str)) {
        if !self.partial.is_empty() {
            out(std::mem::take(&mut self.partial).trim_end_matches('\r'));
        }
    }
}

/// The containerd instance the installer is pulled into and run from: talosctl's default
/// (`--namespace system`: the CRI containerd, namespace `system`; siderolabs/talos v1.13.9
/// `cmd/talosctl/cmd/talos/image.go`, `containerdInstance`). Pull and Upgrade must name the
/// same instance: Upgrade looks the image up only there (`internal/app/lifecycle/
/// container.go`, `installer image %q not found in containerd store`).
pub fn installer_containerd() -> common::ContainerdInstance {
    common::ContainerdInstance {
        driver: common::ContainerDriver::Cri as i32,
        namespace: common::ContainerdNamespace::NsSystem as i32,
    }
}

impl TalosClient {
    /// `ImageService.Pull`: the node pulls `image` into the installer's containerd instance
    /// ([`installer_containerd`]) and answers with the pulled name pinned to its digest
    /// (siderolabs/talos v1.13.9 `internal/app/images/images.go`, `Pull`; talosctl does this
    /// before every upgrade, `cmd/talosctl/cmd/talos/upgrade.go`). Each layer progress message
    /// is handed to `on_progress` as it arrives. An image the registry does not have is
    /// NotFound at once (no retries). Made once per call: an image already pulled is not
    /// fetched again by the node (`WithSkipIfAlreadyPulled`), so the caller may call again.
    pub(crate) async fn image_pull(
        &self,
        image: &str,
        mut on_progress: impl FnMut(&ImageServicePullProgress) + Send,
    ) -> Result<String, TalosError> {
        use crate::talos::api::machine::image_service_pull_response::Response as P;
        let rpc = Rpc::ImagePull;
        let d = PULL_DEADLINE;
        let req = ImageServicePullRequest {
            containerd: Some(installer_containerd()),
            image_ref: image.to_owned(),
        };
        let mut client = image_service_client::ImageServiceClient::new(self.channel.clone())
            .max_decoding_message_size(MAX_MESSAGE_SIZE);
        let request = self.request(req, d);
        let read = async {
            let mut stream = client.pull(request).await?.into_inner();
            let mut name = None;
            while let Some(msg) = stream.message().await? {
                match msg.response {
                    Some(P::PullProgress(p)) => on_progress(&p),
                    Some(P::Name(n)) => name = Some(n),
                    None => {}
                }
            }
            Ok(Response::new(name))
        };
        let name = self.once(rpc, d, read).await?;
        name.ok_or_else(|| {
            malformed(
                &self.ctx(rpc, d),
                "the stream ended without the pulled image's name",
            )
        })
    }

    /// `LifecycleService.Upgrade`: the node runs `image`'s installer against its system disk;
    /// the new version runs from the next boot (the caller reboots, as talosctl does:
    /// siderolabs/talos v1.13.9 `cmd/talosctl/cmd/talos/upgrade.go`). Reads the progress
    /// stream to its end; each message is handed to `on_message` as it arrives. A non-zero
    /// exit code is no gRPC error upstream, so it is returned, not mapped. Made exactly once.
    pub(crate) async fn lifecycle_upgrade(
        &self,
        image: &str,
        mut on_message: impl FnMut(&str) + Send,
    ) -> Result<i32, TalosError> {
        use crate::talos::api::machine::lifecycle_service_install_progress::Response as P;
        let rpc = Rpc::Upgrade;
        let d = UPGRADE_DEADLINE;
        let req = LifecycleServiceUpgradeRequest {
            containerd: Some(installer_containerd()),
            source: Some(InstallArtifactsSource {
                image_name: image.to_owned(),
            }),
        };
        let mut client =
            lifecycle_service_client::LifecycleServiceClient::new(self.channel.clone())
                .max_decoding_message_size(MAX_MESSAGE_SIZE);
        let request = self.request(req, d);
        let read = async {
            let mut stream = client.upgrade(request).await?.into_inner();
            let mut exit = None;
            let mut lines = LineBuffer::default();
            while let Some(msg) = stream.message().await? {
                match msg.progress.and_then(|p| p.response) {
                    Some(P::Message(m)) => lines.push(&m, &mut on_message),
                    Some(P::ExitCode(code)) => exit = Some(code),
                    None => {}
                }
            }
            lines.finish(&mut on_message);
            Ok(Response::new(exit))
        };
        let exit = self.once(rpc, d, read).await?;
        exit.ok_or_else(|| malformed(&self.ctx(rpc, d), "the stream ended without an exit code"))
    }
}
