//! How much memory this process may use, for cache budgets given as a fraction: the
//! machine's `MemTotal`, capped by the memory limit of the cgroup it runs in (a pod's or
//! container's limit), so `budget = "25%"` means a quarter of what the process can
//! actually get, not of the host.

use std::path::{Path, PathBuf};

const CGROUP_ROOT: &str = "/sys/fs/cgroup";

/// Memory available to this process: `MemTotal` capped by its cgroup's limit (Linux).
pub fn total_ram_bytes() -> Option<u64> {
    let machine = meminfo_total(&std::fs::read_to_string("/proc/meminfo").ok()?)?;
    let limit = std::fs::read_to_string("/proc/self/cgroup")
        .ok()
        .and_then(|groups| cgroup_limit(&groups, |path| std::fs::read_to_string(path).ok()));
    Some(limit.map_or(machine, |l| l.min(machine)))
}

/// `MemTotal` of a `/proc/meminfo`, in bytes.
fn meminfo_total(meminfo: &str) -> Option<u64> {
    let line = meminfo.lines().find(|l| l.starts_with("MemTotal:"))?;
    let kb: u64 = line.split_whitespace().nth(1)?.parse().ok()?;
    kb.checked_mul(1024)
}

/// The tightest memory limit on the cgroup named in `proc_self_cgroup` (the contents of
/// `/proc/self/cgroup`) and its ancestors, reading limit files through `read`; `None`
/// when nothing limits it. cgroup v2 (`0::/path`, `memory.max`, `max` = no limit) and
/// v1 (the `memory` controller's `memory.limit_in_bytes`). Walking up to the root also
/// finds the limit inside a container that sees its own cgroup as the root.
fn cgroup_limit(proc_self_cgroup: &str, read: impl Fn(&Path) -> Option<String>) -> Option<u64> {
    // `hierarchy-id:controllers:path`; on a hybrid host the v1 memory controller is the one in use.
    let entries = proc_self_cgroup.lines().filter_map(|line| {
        let mut fields = line.splitn(3, ':');
        Some((fields.next()?, fields.next()?, fields.next()?))
    });
    let v1 = entries.clone().find(|(_, controllers, _)| controllers.split(',').any(|c| c == "memory"));
    let (dir, file, path) = match v1 {
        Some((_, _, path)) => (Path::new(CGROUP_ROOT).join("memory"), "memory.limit_in_bytes", path),
        None => {
            let (_, _, path) = entries.clone().find(|(id, controllers, _)| *id == "0" && controllers.is_empty())?;
            (PathBuf::from(CGROUP_ROOT), "memory.max", path)
        }
    };
    let mut group = dir.join(path.trim_start_matches('/'));
    let mut tightest: Option<u64> = None;
    loop {
        // "max" (v2) does not parse: no limit at this level.
        if let Some(limit) = read(&group.join(file)).and_then(|s| s.trim().parse::<u64>().ok()) {
            tightest = Some(tightest.map_or(limit, |t| t.min(limit)));
        }
        if group == dir || !group.pop() {
            break;
        }
    }
    tightest
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashMap;

    fn files(entries: &[(&str, &str)]) -> impl Fn(&Path) -> Option<String> {
        let map: HashMap<PathBuf, String> = entries.iter().map(|(p, c)| (PathBuf::from(p), c.to_string())).collect();
        move |p| map.get(p).cloned()
    }

    #[test]
    fn meminfo_total_is_read_in_bytes() {
        let meminfo = "MemTotal:       16318904 kB\nMemFree:         1234 kB\n";
        assert_eq!(meminfo_total(meminfo), Some(16318904 * 1024));
        assert_eq!(meminfo_total("MemFree: 1 kB\n"), None);
    }

    #[test]
    fn a_pods_cgroup_v2_limit_caps_the_budget_base() {
        let groups = "0::/kubepods/burstable/pod1/c1\n";
        let read = files(&[
            ("/sys/fs/cgroup/kubepods/burstable/pod1/c1/memory.max", "8589934592\n"),
            ("/sys/fs/cgroup/kubepods/burstable/memory.max", "max\n"),
        ]);
        assert_eq!(cgroup_limit(groups, read), Some(8 << 30));
        // A parent's limit binds too.
        let read = files(&[
            ("/sys/fs/cgroup/kubepods/burstable/pod1/c1/memory.max", "max\n"),
            ("/sys/fs/cgroup/kubepods/burstable/pod1/memory.max", "4294967296\n"),
        ]);
        assert_eq!(cgroup_limit(groups, read), Some(4 << 30));
    }

    #[test]
    fn no_limit_is_none() {
        let read = files(&[("/sys/fs/cgroup/user.slice/memory.max", "max\n"), ("/sys/fs/cgroup/memory.max", "max\n")]);
        assert_eq!(cgroup_limit("0::/user.slice\n", read), None);
        assert_eq!(cgroup_limit("", files(&[])), None);
    }

    #[test]
    fn a_container_that_sees_its_cgroup_as_the_root_finds_its_limit() {
        // A cgroup namespace: /proc/self/cgroup says "/", the limit sits at the mount root.
        let read = files(&[("/sys/fs/cgroup/memory.max", "2147483648\n")]);
        assert_eq!(cgroup_limit("0::/\n", read), Some(2 << 30));
    }

    #[test]
    fn cgroup_v1_reads_the_memory_controllers_limit() {
        let groups = "0::/\n12:cpu,cpuacct:/docker/abc\n11:memory:/docker/abc\n";
        let read = files(&[("/sys/fs/cgroup/memory/docker/abc/memory.limit_in_bytes", "1073741824\n")]);
        assert_eq!(cgroup_limit(groups, read), Some(1 << 30));
        // Unlimited v1 is a huge number: the machine's memory stays the cap.
        let read = files(&[("/sys/fs/cgroup/memory/memory.limit_in_bytes", "9223372036854771712\n")]);
        assert_eq!(cgroup_limit("11:memory:/\n", read), Some(9223372036854771712));
    }
}
