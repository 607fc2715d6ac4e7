//! Writing rendered machine configs out: `<node>.yaml` per node and the admin client configs
//! (`talosconfig`, `kubeconfig`), each written atomically with mode 0600 (configs carry CA
//! keys) into a directory created 0700, and which node configs on disk differ from a
//! rendering. The file side of [`super::rendered::render_all`], kept apart from rendering so
//! `gen`, `up` and anything else that writes configs write them the same way.

use std::path::Path;

use time::OffsetDateTime;

use super::clients::{self, DEFAULT_CLIENT_CERT_TTL};
use super::secrets::SecretsBundle;
use crate::inventory::Inventory;

/// Why rendered configs could not be written.
#[derive(Debug, thiserror::Error)]
pub(crate) enum WriteError {
    /// The output directory could not be created.
    #[error("cannot create {}: {source}", .dir.display())]
    CreateDir {
        /// The directory.
        dir: std::path::PathBuf,
        /// Why.
        source: std::io::Error,
    },
    /// A file could not be written (the error names it).
    #[error("{0}")]
    Write(#[from] crate::fsutil::AtomicWriteError),
    /// A talosconfig or kubeconfig could not be made.
    #[error("{0}")]
    Client(#[from] clients::ClientConfigError),
}

/// Writes node configs and the admin client configs into `dir` (created 0700 if missing).
pub(crate) fn write_all(
    dir: &Path,
    inv: &Inventory,
    secrets: &SecretsBundle,
    rendered: &[(String, String)],
    now: OffsetDateTime,
) -> Result<(), WriteError> {
    create_private_dir(dir)?;
    write_node_configs(dir, rendered)?;
    write_client_configs(dir, inv, secrets, now)
}

/// Creates `dir` 0700 if it is missing: what it will hold carries the cluster's keys.
fn create_private_dir(dir: &Path) -> Result<(), WriteError> {
    use std::os::unix::fs::DirBuilderExt;
    if !dir.exists() {
        std::fs::DirBuilder::new()
            .recursive(true)
            .mode(0o700)
            .create(dir)
            .map_err(|source| WriteError::CreateDir {
                dir: dir.to_owned(),
                source,
            })?;
    }
    Ok(())
}

/// Writes `<dir>/<node>.yaml` for each of `rendered` (0600; `dir` created 0700 if missing).
pub(crate) fn write_node_configs(
    dir: &Path,
    rendered: &[(String, String)],
) -> Result<(), WriteError> {
    create_private_dir(dir)?;
    for (name, text) in rendered {
        crate::fsutil::write_atomic(&dir.join(format!("{name}.yaml")), text.as_bytes(), 0o600)?;
    }
    Ok(())
}

/// Writes the admin `talosconfig` and `kubeconfig` (fresh client certificates) into `dir`.
pub(crate) fn write_client_configs(
    dir: &Path,
    inv: &Inventory,
    secrets: &SecretsBundle,
    now: OffsetDateTime,
) -> Result<(), WriteError> {
    // Talos API calls go to node addresses, never the VIP (it only exists after bootstrap).
    let endpoints: Vec<String> = inv
        .control_planes()
        .map(|n| n.address.value.addr().to_string())
        .collect();
    let cluster = &inv.cluster.name.value;
    let talosconfig = clients::talosconfig(
        cluster,
        &endpoints,
        &[],
        secrets,
        DEFAULT_CLIENT_CERT_TTL,
        now,
    )?;
    crate::fsutil::write_atomic(&dir.join("talosconfig"), talosconfig.as_bytes(), 0o600)?;
    let endpoint = &inv.cluster.endpoint.value;
    let host = match &endpoint.host {
        crate::inventory::EndpointHost::Ip(ip) => ip.to_string(),
        crate::inventory::EndpointHost::Name(n) => n.clone(),
    };
    let server = format!("https://{host}:{}", endpoint.port);
    let kubeconfig = clients::kubeconfig(cluster, &server, secrets, DEFAULT_CLIENT_CERT_TTL, now)?;
    crate::fsutil::write_atomic(&dir.join("kubeconfig"), kubeconfig.as_bytes(), 0o600)?;
    Ok(())
}

/// The rendered node configs (`(node, text)`) that `dir` lacks or holds in another text: what
/// a write would change.
pub(crate) fn differing<'a>(
    dir: &Path,
    rendered: &'a [(String, String)],
) -> Vec<&'a (String, String)> {
    rendered
        .iter()
        .filter(|(name, text)| {
            std::fs::read_to_string(dir.join(format!("{name}.yaml")))
                .ok()
                .as_deref()
                != Some(text.as_str())
        })
        .collect()
}
