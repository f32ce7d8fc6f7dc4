//! What a process (or the whole machine) holds, read from /proc: the
//! numbers leak checks compare before and after a workload.
//!
//! Rings are sealed memfds named "ringsock" (the ring crate's shm transport;
//! "ringsock-verbs" for RDMA ring memory), so a ring shows up as a
//! `/memfd:ringsock` link under /proc/PID/fd while a descriptor is open and
//! as a `/memfd:ringsock` line in /proc/PID/maps while it is mapped. The
//! daemon's offer table ("ringsock-offers", mapped once per process for its
//! life) is not a ring.

use std::fs;
use std::path::Path;

/// The names ring memory's memfds carry.
const RING_MEMFDS: [&str; 2] = ["/memfd:ringsock", "/memfd:ringsock-verbs"];

/// Whether an fd link's target or a /proc/PID/maps line is ring memory.
pub fn is_ring(path: &str) -> bool {
    let path = path.trim_end();
    let path = path.strip_suffix(" (deleted)").unwrap_or(path);
    RING_MEMFDS.iter().any(|n| path.ends_with(n))
}

/// One process's holdings.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Holdings {
    /// Open descriptors of any kind.
    pub fds: usize,
    /// Open descriptors that are sockets (the shim's duplicates of ring
    /// connections' kernel sockets among them).
    pub sockets: usize,
    /// Open descriptors that are ring memfds.
    pub ring_fds: usize,
    /// Mappings of ring memfds (a ring maps once per process).
    pub ring_maps: usize,
    /// Resident set size in KiB.
    pub rss_kib: u64,
}

/// Reads what `pid` holds; `None` once the process is gone.
pub fn holdings(pid: u32) -> Option<Holdings> {
    let proc_dir = format!("/proc/{pid}");
    let (fds, sockets, ring_fds) = count_fds(Path::new(&proc_dir).join("fd").as_path())?;
    let maps = fs::read_to_string(format!("{proc_dir}/maps")).ok()?;
    let ring_maps = maps.lines().filter(|l| is_ring(l)).count();
    let status = fs::read_to_string(format!("{proc_dir}/status")).ok()?;
    let rss_kib = status
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.split_whitespace().next())
        .and_then(|v| v.parse().ok())
        .unwrap_or(0);
    Some(Holdings {
        fds,
        sockets,
        ring_fds,
        ring_maps,
        rss_kib,
    })
}

/// (all, sockets, ring memfds) among the descriptors listed in `dir`.
fn count_fds(dir: &Path) -> Option<(usize, usize, usize)> {
    let mut all = 0;
    let mut sockets = 0;
    let mut rings = 0;
    for entry in fs::read_dir(dir).ok()?.flatten() {
        all += 1;
        if let Ok(target) = fs::read_link(entry.path()) {
            let t = target.to_string_lossy();
            if is_ring(&t) {
                rings += 1;
            } else if t.starts_with("socket:") {
                sockets += 1;
            }
        }
    }
    Some((all, sockets, rings))
}

/// The kernel page size (KiB) of each ring mapping of `pid`, from
/// /proc/PID/smaps: 4 on ordinary pages, 2048 on huge pages.
pub fn ring_page_sizes(pid: u32) -> Vec<u64> {
    let Ok(smaps) = fs::read_to_string(format!("/proc/{pid}/smaps")) else {
        return Vec::new();
    };
    let mut out = Vec::new();
    let mut in_ring = false;
    for line in smaps.lines() {
        // Mapping headers start with the address range; fields with a name.
        if line
            .split_whitespace()
            .next()
            .is_some_and(|w| w.contains('-'))
        {
            in_ring = is_ring(line);
        } else if let Some(v) = line.strip_prefix("KernelPageSize:") {
            if in_ring {
                out.extend(
                    v.split_whitespace()
                        .next()
                        .and_then(|n| n.parse::<u64>().ok()),
                );
            }
        }
    }
    out
}

/// The pids of `pid`'s child processes.
pub fn children(pid: u32) -> Vec<u32> {
    let Ok(tasks) = fs::read_dir(format!("/proc/{pid}/task")) else {
        return Vec::new();
    };
    let mut out = Vec::new();
    for t in tasks.flatten() {
        if let Ok(list) = fs::read_to_string(t.path().join("children")) {
            out.extend(
                list.split_whitespace()
                    .filter_map(|p| p.parse::<u32>().ok()),
            );
        }
    }
    out
}

/// Ring memfds open or mapped anywhere on the machine (every process this
/// user may inspect): (descriptors, mappings). A leak check takes this
/// before a workload and after all its processes are gone.
pub fn rings_on_machine() -> (usize, usize) {
    let mut fds = 0;
    let mut maps = 0;
    let Ok(dir) = fs::read_dir("/proc") else {
        return (0, 0);
    };
    for entry in dir.flatten() {
        let Some(pid) = entry
            .file_name()
            .to_str()
            .and_then(|s| s.parse::<u32>().ok())
        else {
            continue;
        };
        if let Some(h) = holdings(pid) {
            fds += h.ring_fds;
            maps += h.ring_maps;
        }
    }
    (fds, maps)
}

/// Entries in /dev/shm (POSIX shared memory). ringsock creates none; a
/// test asserts the count is unchanged around a workload.
pub fn dev_shm_entries() -> usize {
    fs::read_dir("/dev/shm").map(|d| d.count()).unwrap_or(0)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_own_process() {
        let me = holdings(std::process::id()).expect("own /proc entry");
        assert!(me.fds >= 3, "stdin/out/err at least: {me:?}");
        assert!(me.rss_kib > 0, "{me:?}");
    }

    #[test]
    fn gone_process_is_none() {
        let mut child = std::process::Command::new("true").spawn().unwrap();
        let pid = child.id();
        child.wait().unwrap();
        assert_eq!(holdings(pid), None);
    }
}
