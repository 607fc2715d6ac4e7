//! etcd's health as an operator needs to see it (issue 28 item 4): each configured endpoint
//! asked on its own connection (is it up, which member, does it lead, its raft term, database
//! size and errors), the cluster's alarms, and whether a linearizable read completes, which is
//! what "has quorum" means to a writer. The verdict ([`EtcdHealth::verdict`]) is pure, from
//! those facts.
//!
//! This is how `etcdctl endpoint health` and `endpoint status` read it (etcd-io/etcd v3.4.23
//! `etcdctl/ctlv3/command/ep_command.go`): health is one client per endpoint doing a
//! linearizable `Get` (a response, even "no such key", means the read went through the
//! leader's read index, i.e. quorum); status is the Maintenance `Status` RPC of each endpoint.
//! etcdctl 3.4 does not look at alarms there (3.5 does); talboot lists them with
//! `AlarmList`, since a NOSPACE alarm refuses every write while reads still succeed.

use std::time::Duration;

use etcd_client::{AlarmAction, AlarmType, Client, ConnectOptions, GetOptions};

use super::EtcdConfig;
use crate::store::{Result, StoreError};

/// One endpoint as it answered.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct EndpointHealth {
    /// The client URL asked.
    pub url: String,
    /// What it said, or why it could not be asked.
    pub status: std::result::Result<MemberStatus, String>,
}

/// A member's own status (the Maintenance `Status` RPC).
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct MemberStatus {
    /// The member's ID, hex as etcdctl prints it.
    pub member_id: String,
    /// The etcd version it runs.
    pub version: String,
    /// Whether it is the raft leader.
    pub is_leader: bool,
    /// Whether it knows of any leader (false: no quorum as this member sees it).
    pub has_leader: bool,
    /// Raft term.
    pub raft_term: u64,
    /// Raft index.
    pub raft_index: u64,
    /// Backend database size in bytes.
    pub db_size: i64,
    /// Errors the member reports (a raised alarm shows here too).
    pub errors: Vec<String>,
}

/// etcd as a whole, from one probe.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct EtcdHealth {
    /// Every configured endpoint.
    pub endpoints: Vec<EndpointHealth>,
    /// Raised alarms, as `<member id>: NOSPACE|CORRUPT`.
    pub alarms: Vec<String>,
    /// Whether a linearizable read completed (a write would too, quorum permitting).
    pub quorum: bool,
}

/// The one-word state of etcd, worst first.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Verdict {
    /// No linearizable read completes: no lease can be made durable, so none is handed out.
    NoQuorum,
    /// An alarm is raised (NOSPACE: every write fails until compaction, defrag, disarm).
    Alarm,
    /// Quorum holds but an endpoint is down or leaderless: one more failure may lose it.
    Degraded,
    /// Every endpoint answers, one leader, no alarm.
    Healthy,
}

impl EtcdHealth {
    /// The verdict from the facts.
    pub fn verdict(&self) -> Verdict {
        if !self.quorum {
            return Verdict::NoQuorum;
        }
        if !self.alarms.is_empty() {
            return Verdict::Alarm;
        }
        let all_up = self
            .endpoints
            .iter()
            .all(|e| matches!(&e.status, Ok(s) if s.has_leader));
        if all_up {
            Verdict::Healthy
        } else {
            Verdict::Degraded
        }
    }

    /// One line for logs and `status`: the verdict, endpoints up of configured, the leader.
    pub fn summary(&self) -> String {
        let up = self.endpoints.iter().filter(|e| e.status.is_ok()).count();
        let leader = self.endpoints.iter().find_map(|e| match &e.status {
            Ok(s) if s.is_leader => Some(e.url.as_str()),
            _ => None,
        });
        let verdict = match self.verdict() {
            Verdict::NoQuorum => "NO QUORUM: no new lease can be made durable",
            Verdict::Alarm => "ALARM raised: writes refused until it is cleared",
            Verdict::Degraded => "degraded: quorum holds, but not every endpoint answers",
            Verdict::Healthy => "healthy",
        };
        let mut line = format!(
            "etcd {verdict}; {up} of {} endpoint(s) up",
            self.endpoints.len()
        );
        if let Some(l) = leader {
            line.push_str(&format!("; leader {l}"));
        }
        for a in &self.alarms {
            line.push_str(&format!("; alarm {a}"));
        }
        line
    }
}

/// Ask every endpoint of `cfg`, each on its own connection, within the configured timeouts.
pub async fn probe(cfg: &EtcdConfig) -> Result<EtcdHealth> {
    let tls = cfg.tls()?;
    let urls = cfg.urls(tls.is_some());
    let opts = || {
        let mut o = ConnectOptions::new()
            .with_connect_timeout(cfg.connect_timeout)
            .with_timeout(cfg.request_timeout);
        if let Some(t) = tls.clone() {
            o = o.with_tls(t);
        }
        o
    };
    // Each endpoint on its own connection, all at once: a balanced client would send a
    // check to a dead member and call the cluster down while two others hold quorum, and
    // one after another a probe of three dead members would take three timeouts.
    let asked = futures_util::future::join_all(urls.iter().map(|url| ask(url, opts(), cfg))).await;
    let (mut endpoints, mut quorum, mut alarms) = (Vec::with_capacity(urls.len()), false, None);
    for (url, asked) in urls.iter().zip(asked) {
        let status = asked.map(|(status, reads, raised)| {
            quorum |= reads;
            if alarms.is_none() {
                alarms = raised;
            }
            status
        });
        endpoints.push(EndpointHealth {
            url: url.clone(),
            status,
        });
    }
    Ok(EtcdHealth {
        endpoints,
        alarms: alarms.unwrap_or_default(),
        quorum,
    })
}

/// One endpoint's status, whether a linearizable read completes through it, and the alarms
/// it lists (None when it could not say).
async fn ask(
    url: &str,
    opts: ConnectOptions,
    cfg: &EtcdConfig,
) -> std::result::Result<(MemberStatus, bool, Option<Vec<String>>), String> {
    let limit = cfg.request_timeout;
    let mut client = within(limit, Client::connect([url], Some(opts))).await?;
    let status = member_status(&mut client, limit).await?;
    let (reads, alarms) = cluster_checks(client, &cfg.cluster, limit).await;
    Ok((status, reads, alarms))
}

/// [`probe`] for callers without a runtime (the CLI): a short-lived one of its own.
pub fn probe_blocking(cfg: &EtcdConfig) -> Result<EtcdHealth> {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .map_err(|e| StoreError::EtcdConfig {
            cause: format!("cannot start a runtime to probe etcd: {e}"),
        })?;
    rt.block_on(probe(cfg))
}

async fn within<T>(
    limit: Duration,
    fut: impl std::future::Future<Output = std::result::Result<T, etcd_client::Error>>,
) -> std::result::Result<T, String> {
    match tokio::time::timeout(limit, fut).await {
        Ok(Ok(v)) => Ok(v),
        Ok(Err(e)) => Err(e.to_string()),
        Err(_) => Err(format!("no answer within {limit:?}")),
    }
}

async fn member_status(
    client: &mut Client,
    limit: Duration,
) -> std::result::Result<MemberStatus, String> {
    let s = within(limit, client.status()).await?;
    let id = s.header().map(|h| h.member_id()).unwrap_or(0);
    Ok(MemberStatus {
        member_id: format!("{id:x}"),
        version: s.version().to_owned(),
        is_leader: id != 0 && s.leader() == id,
        has_leader: s.leader() != 0,
        raft_term: s.raft_term(),
        raft_index: s.raft_index(),
        db_size: s.db_size(),
        errors: s.errors().to_vec(),
    })
}

/// The linearizable read (quorum) and the alarm list, through one endpoint.
async fn cluster_checks(
    mut client: Client,
    cluster: &str,
    limit: Duration,
) -> (bool, Option<Vec<String>>) {
    // A linearizable (the default, not serializable) read of one key under the fleet's
    // prefix: it completes only through the leader's read index, i.e. with a quorum.
    let key = format!("/talboot/{cluster}/schema_version");
    let quorum = within(
        limit,
        client.get(key, Some(GetOptions::new().with_count_only())),
    )
    .await
    .is_ok();
    let alarms = match within(limit, client.alarm(AlarmAction::Get, AlarmType::None, None)).await {
        Ok(resp) => Some(
            resp.alarms()
                .iter()
                .map(|a| {
                    let kind = match a.alarm() {
                        AlarmType::Nospace => "NOSPACE",
                        AlarmType::Corrupt => "CORRUPT",
                        AlarmType::None => "NONE",
                    };
                    format!("{:x}: {kind}", a.member_id())
                })
                .collect(),
        ),
        Err(_) => None,
    };
    (quorum, alarms)
}

#[cfg(test)]
mod tests {
    use super::super::testing::EtcdServer;
    use super::*;

    fn up(leader: bool) -> std::result::Result<MemberStatus, String> {
        Ok(MemberStatus {
            member_id: "1".into(),
            version: "3.4.23".into(),
            is_leader: leader,
            has_leader: true,
            raft_term: 2,
            raft_index: 9,
            db_size: 20480,
            errors: vec![],
        })
    }

    fn health(
        statuses: Vec<std::result::Result<MemberStatus, String>>,
        quorum: bool,
    ) -> EtcdHealth {
        EtcdHealth {
            endpoints: statuses
                .into_iter()
                .enumerate()
                .map(|(i, status)| EndpointHealth {
                    url: format!("http://m{i}:2379"),
                    status,
                })
                .collect(),
            alarms: vec![],
            quorum,
        }
    }

    #[test]
    fn the_verdict_is_the_worst_fact() {
        let all = health(vec![up(true), up(false), up(false)], true);
        assert_eq!(all.verdict(), Verdict::Healthy);
        assert!(all.summary().contains("leader http://m0:2379"));
        let one_down = health(vec![up(true), up(false), Err("refused".into())], true);
        assert_eq!(one_down.verdict(), Verdict::Degraded);
        let mut alarm = one_down.clone();
        alarm.alarms.push("8e9e05c52164694d: NOSPACE".into());
        assert_eq!(alarm.verdict(), Verdict::Alarm);
        let lost = health(
            vec![up(false), Err("refused".into()), Err("refused".into())],
            false,
        );
        assert_eq!(lost.verdict(), Verdict::NoQuorum);
        assert!(lost.summary().contains("NO QUORUM"), "{}", lost.summary());
    }

    /// Probe until the verdict is `want`, within a bound; the last probe.
    fn until_verdict(cfg: &EtcdConfig, want: Verdict) -> EtcdHealth {
        let deadline = std::time::Instant::now() + Duration::from_secs(30);
        loop {
            let h = probe_blocking(cfg).unwrap();
            if h.verdict() == want {
                return h;
            }
            assert!(
                std::time::Instant::now() < deadline,
                "not {want:?} within 30 s: {h:?}"
            );
            std::thread::sleep(Duration::from_millis(200));
        }
    }

    /// A real 3-member cluster: healthy, then degraded with one member killed, then without
    /// quorum with two.
    #[test]
    fn a_real_cluster_loses_a_member_then_its_quorum() {
        let Some(mut etcd) = EtcdServer::start_cluster(3) else {
            return;
        };
        let cfg = etcd.config("health");
        let h = probe_blocking(&cfg).unwrap();
        assert_eq!(h.verdict(), Verdict::Healthy, "{h:?}");
        assert_eq!(
            h.endpoints
                .iter()
                .filter(|e| matches!(&e.status, Ok(s) if s.is_leader))
                .count(),
            1,
            "exactly one leader: {h:?}"
        );
        // Killing a member may kill the raft leader: until the others elect a new one
        // (about a second), no read completes and "no quorum" is the truth. Wait it out.
        etcd.kill_member(2);
        let h = until_verdict(&cfg, Verdict::Degraded);
        assert!(h.endpoints[2].status.is_err());
        etcd.kill_member(1);
        until_verdict(&cfg, Verdict::NoQuorum);
    }
}
