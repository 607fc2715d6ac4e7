//! Where the state store is (`--store`, `--etcd-*`): the flags every store-opening subcommand
//! shares, turned into a [`StoreSpec`] by one pure function, and the rule by which a
//! standalone command either opens the store itself or goes through a running appliance.
//!
//! On redb a command learns that `serve` runs from the file lock. etcd has no such lock (any
//! number of appliances share one prefix), so on etcd a command that only reads opens etcd
//! itself, and one that writes (a rebuild, a rollout, a power-on record) goes through the
//! appliance named by `--admin`, which owns the writers.

use std::path::{Path, PathBuf};
use std::process::ExitCode;

use crate::store::{self, EtcdConfig, Opened, StoreSpec};

use super::EXIT_USAGE;

/// The state store's backend: every subcommand that opens the store flattens it.
#[derive(Debug, Clone, Default, clap::Args)]
pub struct StoreBackend {
    /// Where the state is kept: absent, the redb file in --state-dir (the default, one
    /// appliance); `etcd://host:2379[,host:2379...]` (or `etcds://` for TLS) a shared etcd
    /// that several appliances serve one fleet from.
    #[arg(long = "store", env = "TALBOOT_STORE", value_name = "URL")]
    pub store: Option<String>,
    #[command(flatten)]
    pub etcd: EtcdFlags,
}

/// etcd's TLS files and the fleet's prefix: with `--store`, and with `store migrate --to`.
#[derive(Debug, Clone, Default, clap::Args)]
pub struct EtcdFlags {
    /// CA bundle that signed etcd's server certificates (etcdctl's `--cacert`); needs
    /// etcds://.
    #[arg(long, env = "TALBOOT_ETCD_CACERT", value_name = "FILE")]
    pub etcd_cacert: Option<PathBuf>,
    /// Client certificate etcd checks with --client-cert-auth (etcdctl's `--cert`); needs
    /// --etcd-key.
    #[arg(long, env = "TALBOOT_ETCD_CERT", value_name = "FILE")]
    pub etcd_cert: Option<PathBuf>,
    /// Private key of --etcd-cert (etcdctl's `--key`).
    #[arg(long, env = "TALBOOT_ETCD_KEY", value_name = "FILE")]
    pub etcd_key: Option<PathBuf>,
    /// Names the fleet's key prefix in etcd, `/talboot/<cluster>/` (default: the inventory's
    /// cluster.name); every appliance of one fleet must name the same.
    #[arg(long, env = "TALBOOT_ETCD_CLUSTER", value_name = "NAME")]
    pub etcd_cluster: Option<String>,
}

/// Why the store flags cannot be used; each names the flag and the fix.
#[derive(Debug, PartialEq, Eq, thiserror::Error)]
pub enum StoreFlagError {
    /// A TLS or cluster flag without an etcd store.
    #[error("{flag} is for an etcd store; add --store etcds://host:2379 or leave {flag} out")]
    EtcdOnly {
        /// The flag given.
        flag: &'static str,
    },
    /// A client certificate without its key, or the other way round.
    #[error(
        "{given} needs {missing} (etcdctl's --cert and --key go together); pass both or neither"
    )]
    Pair {
        /// The flag given.
        given: &'static str,
        /// The flag missing.
        missing: &'static str,
    },
    /// TLS files with a plain `etcd://` URL, or `etcds://` without a CA.
    #[error("{0}")]
    Scheme(String),
    /// The URL is not `etcd://host:port[,...]`.
    #[error("{0}")]
    Url(String),
}

impl StoreBackend {
    /// The store these flags name: the redb file in `state_dir`, or etcd with
    /// `inventory_cluster` as the prefix unless `--etcd-cluster` names another.
    pub(crate) fn spec(
        &self,
        state_dir: &Path,
        inventory_cluster: Option<&str>,
    ) -> Result<StoreSpec, StoreFlagError> {
        let Some(url) = self.store.as_deref() else {
            let given = [
                (self.etcd.etcd_cacert.is_some(), "--etcd-cacert"),
                (self.etcd.etcd_cert.is_some(), "--etcd-cert"),
                (self.etcd.etcd_key.is_some(), "--etcd-key"),
                (self.etcd.etcd_cluster.is_some(), "--etcd-cluster"),
            ];
            if let Some((_, flag)) = given.into_iter().find(|(g, _)| *g) {
                return Err(StoreFlagError::EtcdOnly { flag });
            }
            return Ok(StoreSpec::Redb(state_dir.to_path_buf()));
        };
        let cluster = self
            .etcd
            .etcd_cluster
            .as_deref()
            .or(inventory_cluster)
            .ok_or_else(|| {
                StoreFlagError::Url("--etcd-cluster is needed (no inventory names one)".into())
            })?;
        let mut cfg =
            EtcdConfig::from_url(url, cluster).map_err(|e| StoreFlagError::Url(e.to_string()))?;
        self.tls_files(url, &mut cfg)?;
        Ok(StoreSpec::Etcd(cfg))
    }

    fn tls_files(&self, url: &str, cfg: &mut EtcdConfig) -> Result<(), StoreFlagError> {
        match (&self.etcd.etcd_cert, &self.etcd.etcd_key) {
            (Some(_), None) => {
                return Err(StoreFlagError::Pair {
                    given: "--etcd-cert",
                    missing: "--etcd-key",
                });
            }
            (None, Some(_)) => {
                return Err(StoreFlagError::Pair {
                    given: "--etcd-key",
                    missing: "--etcd-cert",
                });
            }
            _ => {}
        }
        let tls_url = url.starts_with("etcds://");
        let any_file = self.etcd.etcd_cacert.is_some() || self.etcd.etcd_cert.is_some();
        if any_file && !tls_url {
            return Err(StoreFlagError::Scheme(format!(
                "--store {url} is plain HTTP, but TLS files are given; write etcds://{}",
                url.trim_start_matches("etcd://")
            )));
        }
        if tls_url && self.etcd.etcd_cacert.is_none() {
            return Err(StoreFlagError::Scheme(format!(
                "--store {url} needs --etcd-cacert, the CA that signed etcd's server \
                 certificates (etcd's --trusted-ca-file; etcdctl's --cacert)"
            )));
        }
        cfg.cacert = self.etcd.etcd_cacert.clone();
        cfg.cert = self.etcd.etcd_cert.clone();
        cfg.key = self.etcd.etcd_key.clone();
        Ok(())
    }
}

/// How a standalone command reaches the state.
pub(crate) enum Reach {
    /// It opened the store itself and owns its writers while it runs.
    Local(Box<Opened>),
    /// A running appliance holds the writers: go through its admin API.
    Serve,
}

/// Open the store `access` names for a command that writes, or say to go through serve:
/// on redb when serve holds the file lock; on etcd always, since an appliance may be
/// running anywhere and it owns the writers (the command names `--admin`).
pub(crate) fn open_to_write(
    access: &super::args::StoreAccess,
    inventory_cluster: &str,
    command: &str,
) -> Result<Reach, ExitCode> {
    let spec = spec_or_exit(access, inventory_cluster)?;
    if let StoreSpec::Etcd(cfg) = &spec {
        eprintln!(
            "talboot {command}: the state is in etcd ({}), where the appliances own the \
             writers; going through the appliance at --admin {}",
            cfg.endpoints.join(","),
            access.admin
        );
        return Ok(Reach::Serve);
    }
    open_spec(&spec)
}

/// Open the store `access` names for reading, or say to go through serve (redb held by a
/// running serve). On etcd the command reads etcd itself, whatever appliances run.
pub(crate) fn open_to_read(
    access: &super::args::StoreAccess,
    inventory_cluster: &str,
) -> Result<Reach, ExitCode> {
    let spec = spec_or_exit(access, inventory_cluster)?;
    open_spec(&spec)
}

/// Open `spec`: the store, or "go through serve" when a running serve holds the redb file,
/// or the error printed and exit 2.
fn open_spec(spec: &StoreSpec) -> Result<Reach, ExitCode> {
    match spec.open() {
        Ok(opened) => Ok(Reach::Local(Box::new(opened))),
        Err(store::StoreError::Locked { .. }) => Ok(Reach::Serve),
        Err(e) => {
            eprintln!("talboot: {e}");
            Err(ExitCode::from(EXIT_USAGE))
        }
    }
}

/// The spec of `access`, or the flag error printed and exit 2.
pub(crate) fn spec_or_exit(
    access: &super::args::StoreAccess,
    inventory_cluster: &str,
) -> Result<StoreSpec, ExitCode> {
    access
        .backend
        .spec(&access.state_dir, Some(inventory_cluster))
        .map_err(|e| {
            eprintln!("talboot: {e}");
            ExitCode::from(EXIT_USAGE)
        })
}

/// This machine's host name, the default appliance name (`serve --name`).
pub(crate) fn host_name() -> String {
    std::fs::read_to_string("/proc/sys/kernel/hostname")
        .ok()
        .map(|s| s.trim().to_owned())
        .filter(|s| !s.is_empty())
        .unwrap_or_else(|| "talboot".into())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn flags(store: Option<&str>) -> StoreBackend {
        StoreBackend {
            store: store.map(str::to_owned),
            ..StoreBackend::default()
        }
    }

    #[test]
    fn no_store_is_the_redb_file_and_refuses_etcd_flags() {
        let dir = Path::new("/var/lib/x");
        assert_eq!(
            flags(None).spec(dir, Some("c")),
            Ok(StoreSpec::Redb(dir.into()))
        );
        let mut f = flags(None);
        f.etcd.etcd_key = Some("k".into());
        assert_eq!(
            f.spec(dir, Some("c")),
            Err(StoreFlagError::EtcdOnly { flag: "--etcd-key" })
        );
    }

    #[test]
    fn etcd_url_names_endpoints_and_the_inventory_cluster_unless_overridden() {
        let dir = Path::new("/s");
        let Ok(StoreSpec::Etcd(cfg)) = flags(Some("etcd://a:2379,b:2379")).spec(dir, Some("lab"))
        else {
            panic!("not etcd");
        };
        assert_eq!(cfg.endpoints, ["http://a:2379", "http://b:2379"]);
        assert_eq!(cfg.cluster, "lab");
        let mut f = flags(Some("etcd://a:2379"));
        f.etcd.etcd_cluster = Some("other".into());
        let Ok(StoreSpec::Etcd(cfg)) = f.spec(dir, Some("lab")) else {
            panic!("not etcd");
        };
        assert_eq!(cfg.cluster, "other");
        assert!(matches!(
            flags(Some("redis://a:1")).spec(dir, Some("lab")),
            Err(StoreFlagError::Url(m)) if m.contains("--store redis://a:1")
        ));
    }

    #[test]
    fn tls_flags_are_checked_in_pairs_and_against_the_scheme() {
        let dir = Path::new("/s");
        let mut f = flags(Some("etcds://a:2379"));
        f.etcd.etcd_cacert = Some("ca.pem".into());
        f.etcd.etcd_cert = Some("c.pem".into());
        assert_eq!(
            f.spec(dir, Some("l")),
            Err(StoreFlagError::Pair {
                given: "--etcd-cert",
                missing: "--etcd-key"
            })
        );
        f.etcd.etcd_cert = None;
        f.etcd.etcd_key = Some("k.pem".into());
        assert_eq!(
            f.spec(dir, Some("l")),
            Err(StoreFlagError::Pair {
                given: "--etcd-key",
                missing: "--etcd-cert"
            })
        );
        f.etcd.etcd_cert = Some("c.pem".into());
        let Ok(StoreSpec::Etcd(cfg)) = f.spec(dir, Some("l")) else {
            panic!("not etcd");
        };
        assert_eq!(cfg.endpoints, ["https://a:2379"]);
        assert_eq!(cfg.cert.as_deref(), Some(Path::new("c.pem")));
        f.store = Some("etcd://a:2379".into());
        let e = f.spec(dir, Some("l")).unwrap_err();
        assert!(e.to_string().contains("write etcds://a:2379"), "{e}");
        let mut g = flags(Some("etcds://a:2379"));
        let e = g.spec(dir, Some("l")).unwrap_err();
        assert!(e.to_string().contains("needs --etcd-cacert"), "{e}");
        g.etcd.etcd_cacert = Some("ca.pem".into());
        assert!(g.spec(dir, Some("l")).is_ok());
    }

    /// The flags as an operator types them, against a real etcd with `--client-cert-auth`.
    #[test]
    fn tls_flags_reach_a_real_etcd_and_a_wrong_ca_names_the_flag() {
        let Some(server) = crate::store::etcd_testing::EtcdServer::start_tls() else {
            return;
        };
        let tls = server.tls().expect("TLS files").clone();
        let host = server.url().replace("https://", "");
        let mut f = flags(Some(&format!("etcds://{host}")));
        f.etcd.etcd_cacert = Some(tls.ca.clone());
        f.etcd.etcd_cert = Some(tls.client_cert.clone());
        f.etcd.etcd_key = Some(tls.client_key.clone());
        let spec = f.spec(Path::new("/unused"), Some("lab")).unwrap();
        let opened = spec.open().expect("open over TLS");
        assert!(opened.etcd.is_some());
        assert_eq!(opened.store.nodes().unwrap(), vec![]);
        drop(opened);
        f.etcd.etcd_cacert = Some(tls.other_ca.clone());
        let e = f.spec(Path::new("/unused"), Some("lab")).unwrap().open();
        let e = e.err().expect("a wrong CA is refused").to_string();
        assert!(e.contains("--etcd-cacert") && e.contains(&host), "{e}");
    }
}
