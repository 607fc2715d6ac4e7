//! Where a demo run's CPU time goes: talboot or the simulation. Both share one process, so
//! the simulation (machines, their Talos API doubles, the Kubernetes API double) runs on its
//! own runtime, whose threads are named [`SIM_THREAD`] and are kept alive for the run; the
//! process's total (which counts threads that already ended) minus those threads' is
//! talboot's.

use std::time::Duration;

/// The name of every thread of the simulation's runtime (15 bytes at most: Linux truncates a
/// thread's `comm` there).
pub(crate) const SIM_THREAD: &str = "talboot-sim";

/// CPU time (user and system) of one run, split.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CpuSplit {
    /// Everything but the simulation's threads: talboot's servers, provisioner and store.
    pub talboot: Duration,
    /// The simulation's threads.
    pub sim: Duration,
}

/// The runtime the simulation runs on: its threads named [`SIM_THREAD`] and never retired
/// during a run (an ended thread's time would be counted as talboot's).
pub(crate) fn runtime() -> std::io::Result<SimRuntime> {
    tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .thread_name(SIM_THREAD)
        .thread_keep_alive(Duration::from_secs(24 * 3600))
        .build()
        .map(|rt| SimRuntime(Some(rt)))
}

/// The simulation's runtime, shut down in the background when dropped: it is dropped from
/// inside talboot's runtime (a demo that ends, or fails to start), where a plain runtime's
/// drop would block and panics instead.
pub(crate) struct SimRuntime(Option<tokio::runtime::Runtime>);

impl std::ops::Deref for SimRuntime {
    type Target = tokio::runtime::Runtime;
    fn deref(&self) -> &Self::Target {
        self.0.as_ref().expect("present until dropped")
    }
}

impl Drop for SimRuntime {
    fn drop(&mut self) {
        if let Some(rt) = self.0.take() {
            rt.shutdown_background();
        }
    }
}

/// The split now, or `None` where `/proc` cannot tell it.
pub fn now() -> Option<CpuSplit> {
    let total = process_total()?;
    let mut sim = Duration::ZERO;
    for task in std::fs::read_dir("/proc/self/task").ok()?.flatten() {
        let Ok(stat) = std::fs::read_to_string(task.path().join("stat")) else {
            // The thread ended between the listing and the read.
            continue;
        };
        if let Some((SIM_THREAD, ticks)) = parse_stat(&stat) {
            sim += ticks_to_duration(ticks);
        }
    }
    Some(CpuSplit {
        talboot: total.saturating_sub(sim),
        sim,
    })
}

/// The whole process's user and system time, ended threads included.
fn process_total() -> Option<Duration> {
    let u = nix::sys::resource::getrusage(nix::sys::resource::UsageWho::RUSAGE_SELF).ok()?;
    let tv = |t: nix::sys::time::TimeVal| {
        Duration::from_secs(u64::try_from(t.tv_sec()).unwrap_or(0))
            + Duration::from_micros(u64::try_from(t.tv_usec()).unwrap_or(0))
    };
    Some(tv(u.user_time()) + tv(u.system_time()))
}

/// `/proc/<pid>/task/<tid>/stat`'s thread name and its utime + stime in clock ticks
/// (`proc(5)`: fields 14 and 15, counted after the parenthesised name, which may hold spaces).
fn parse_stat(stat: &str) -> Option<(&str, u64)> {
    let open = stat.find('(')?;
    let close = stat.rfind(')')?;
    let comm = stat.get(open + 1..close)?;
    let mut rest = stat.get(close + 1..)?.split_whitespace();
    // After the name: state is field 3, so utime (14) is the 12th.
    let utime: u64 = rest.nth(11)?.parse().ok()?;
    let stime: u64 = rest.next()?.parse().ok()?;
    Some((comm, utime + stime))
}

/// `/proc` counts in USER_HZ ticks, which the Linux ABI fixes at 100 a second (`proc(5)`,
/// `sysconf(_SC_CLK_TCK)`).
fn ticks_to_duration(ticks: u64) -> Duration {
    Duration::from_millis(ticks * 10)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A demo that fails to start drops the runtime inside talboot's: no panic.
    #[tokio::test]
    async fn dropping_it_inside_another_runtime_is_fine() {
        let rt = runtime().unwrap();
        rt.spawn(async { tokio::time::sleep(Duration::from_secs(60)).await });
        drop(rt);
    }

    #[test]
    fn a_stat_line_with_spaces_and_parentheses_in_the_name_parses() {
        let line = "4242 (a (b) c) S 1 4242 4242 0 -1 4194560 100 0 0 0 731 42 0 0 20 0 3 0 9";
        assert_eq!(parse_stat(line), Some(("a (b) c", 773)));
    }

    #[test]
    fn work_on_the_sim_runtime_is_counted_as_the_simulation_s() {
        let rt = runtime().unwrap();
        let before = now().unwrap();
        rt.block_on(async {
            tokio::spawn(async {
                let until = std::time::Instant::now() + Duration::from_millis(300);
                let mut x = 0u64;
                while std::time::Instant::now() < until {
                    x = std::hint::black_box(x.wrapping_add(1));
                }
            })
            .await
            .unwrap();
        });
        let after = now().unwrap();
        drop(rt);
        // 300 ms of spinning on a sim thread: at least most of it shows there (the tick is
        // 10 ms), and no more than the process spent.
        let sim = after.sim - before.sim;
        assert!(sim >= Duration::from_millis(200), "{before:?} -> {after:?}");
        assert!(
            sim <= (after.sim + after.talboot) - (before.sim + before.talboot)
                + Duration::from_millis(20)
        );
    }
}
