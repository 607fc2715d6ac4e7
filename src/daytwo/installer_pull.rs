//! Turns the node's `ImageService.Pull` progress stream into the few lines an operator reads
//! while an upgrade pulls its installer: one line each time a layer changes state
//! (downloading, downloaded, extracting, extracted, already present), never one per byte
//! count. Pure: messages in, lines out.
//!
//! The states are siderolabs/talos v1.13.9 `api/machine/image.proto`
//! (`ImageServicePullLayerProgress.Status`), sent by `internal/app/images/images.go` (`Pull`)
//! for each layer while containerd fetches and unpacks it.

use std::collections::HashMap;

use crate::talos::api::machine::ImageServicePullProgress;
use crate::talos::api::machine::image_service_pull_layer_progress::Status;

/// The layers seen so far and the state each was last reported in.
#[derive(Debug, Default)]
pub(crate) struct PullReport {
    last: HashMap<String, i32>,
}

impl PullReport {
    /// The line to show for `p`, if its layer changed state.
    pub fn line(&mut self, p: &ImageServicePullProgress) -> Option<String> {
        let progress = p.progress.as_ref()?;
        if self.last.get(&p.layer_id) == Some(&progress.status) {
            return None;
        }
        self.last.insert(p.layer_id.clone(), progress.status);
        let state = match Status::try_from(progress.status) {
            Ok(Status::Downloading) => "downloading",
            Ok(Status::DownloadComplete) => "downloaded",
            Ok(Status::Extracting) => "extracting",
            Ok(Status::ExtractComplete) => "extracted",
            Ok(Status::AlreadyExists) => "already present",
            Err(_) => "in an unknown state",
        };
        let size = if progress.total > 0 {
            format!(" ({})", mib(progress.total))
        } else {
            String::new()
        };
        Some(format!("installer layer {}{size}: {state}", p.layer_id))
    }

    /// How many layers the node reported.
    pub(crate) fn layers(&self) -> usize {
        self.last.len()
    }
}

fn mib(bytes: i64) -> String {
    format!("{:.1} MiB", bytes as f64 / (1024.0 * 1024.0))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::talos::api::machine::ImageServicePullLayerProgress;

    fn msg(layer: &str, status: Status, offset: i64) -> ImageServicePullProgress {
        ImageServicePullProgress {
            layer_id: layer.into(),
            progress: Some(ImageServicePullLayerProgress {
                status: status as i32,
                elapsed: None,
                offset,
                total: 3 * 1024 * 1024,
            }),
        }
    }

    #[test]
    fn one_line_per_state_change_not_per_byte_count() {
        let mut r = PullReport::default();
        assert_eq!(
            r.line(&msg("sha256:aa", Status::Downloading, 0)).as_deref(),
            Some("installer layer sha256:aa (3.0 MiB): downloading")
        );
        assert_eq!(r.line(&msg("sha256:aa", Status::Downloading, 1024)), None);
        assert_eq!(
            r.line(&msg("sha256:bb", Status::AlreadyExists, 0))
                .as_deref(),
            Some("installer layer sha256:bb (3.0 MiB): already present")
        );
        assert_eq!(
            r.line(&msg("sha256:aa", Status::DownloadComplete, 3 * 1024 * 1024))
                .as_deref(),
            Some("installer layer sha256:aa (3.0 MiB): downloaded")
        );
        assert_eq!(r.layers(), 2);
        let empty = ImageServicePullProgress {
            layer_id: "x".into(),
            progress: None,
        };
        assert_eq!(r.line(&empty), None);
    }
}
