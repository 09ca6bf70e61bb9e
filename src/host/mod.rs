//! What this host and pyfleet's own privileges allow: effective capabilities, the kernel's
//! release, the sysctls that gate reading other processes and BPF, and the pid namespace
//! pyfleet runs in; why the kernel refused a process (`access`), and where a field of a
//! kernel struct lies (`kernel_types`), with the one procfs parse they share (a stat line
//! after its command name). Read from procfs and sysfs only; never fails (what
//! cannot be read is `None`). Imports no other room of pyfleet: `process` and `memory` both
//! stand on it.

pub mod access;
pub mod kernel_types;

use std::os::unix::fs::MetadataExt;

/// `/proc/PID/stat` from field 3 (the state) on: the command name before it is in parentheses
/// and may hold anything, spaces and parentheses included.
pub fn stat_after_command(pid: i32) -> Option<String> {
    let stat = std::fs::read(format!("/proc/{pid}/stat")).ok()?;
    let close = stat.iter().rposition(|&b| b == b')')?;
    String::from_utf8(stat.get(close + 2..)?.to_vec()).ok()
}

/// Whether this process holds CAP_SYS_PTRACE (root normally does): without it, only processes
/// of the same user can be read. From `CapEff` in /proc/self/status; `None` if unreadable.
pub fn has_ptrace_capability() -> Option<bool> {
    has_capability(CAP_SYS_PTRACE)
}

/// Capabilities pyfleet uses, by number (`linux/capability.h`).
pub const CAP_DAC_READ_SEARCH: u32 = 2;
pub const CAP_SYS_PTRACE: u32 = 19;
pub const CAP_SYS_ADMIN: u32 = 21;
pub const CAP_PERFMON: u32 = 38;
pub const CAP_BPF: u32 = 39;

/// The inode number of the host's (initial) pid namespace (`PROC_PID_INIT_INO`).
pub const HOST_PID_NAMESPACE_INODE: u64 = 0xEFFF_FFFC;

/// A hexadecimal bit set of this process's /proc/self/status (`CapEff:`, `SigIgn:`).
fn own_status_bits(key: &str) -> Option<u64> {
    let status = std::fs::read_to_string("/proc/self/status").ok()?;
    let hex = status.lines().find_map(|l| l.strip_prefix(key))?.trim();
    u64::from_str_radix(hex, 16).ok()
}

/// This process's effective capabilities (`CapEff` of /proc/self/status) as a bit set.
pub fn effective_capabilities() -> Option<u64> {
    own_status_bits("CapEff:")
}

/// The signals this process ignores (`SigIgn` of /proc/self/status): bit N-1 for signal N.
pub fn ignored_signals() -> Option<u64> {
    own_status_bits("SigIgn:")
}

/// Whether this process holds capability `cap` (`None`: its status could not be read).
pub fn has_capability(cap: u32) -> Option<bool> {
    effective_capabilities().map(|caps| cap < 64 && caps & (1u64 << cap) != 0)
}

/// Whether this process may load the capture's program and open its events on every CPU:
/// CAP_BPF with CAP_PERFMON, or CAP_SYS_ADMIN (what kernels before 5.8 ask instead).
pub fn may_use_bpf_tracing() -> Option<bool> {
    let caps = effective_capabilities()?;
    let has = |c: u32| caps & (1u64 << c) != 0;
    Some((has(CAP_BPF) && has(CAP_PERFMON)) || has(CAP_SYS_ADMIN))
}

/// The running kernel's release (`uname -r`, from /proc/sys/kernel/osrelease).
pub fn kernel_release() -> Option<String> {
    let r = std::fs::read_to_string("/proc/sys/kernel/osrelease").ok()?;
    Some(r.trim().to_string())
}

/// The (major, minor) of a kernel release such as `6.1.0-18-amd64`.
pub fn kernel_version(release: &str) -> Option<(u32, u32)> {
    let mut parts = release.split(|c: char| !c.is_ascii_digit());
    let major = parts.next()?.parse().ok()?;
    let minor = parts.next()?.parse().ok()?;
    Some((major, minor))
}

/// A sysctl's integer value, e.g. `kernel/yama/ptrace_scope` (`None`: absent or unreadable).
pub fn sysctl(name: &str) -> Option<i64> {
    std::fs::read_to_string(format!("/proc/sys/{name}"))
        .ok()?
        .trim()
        .parse()
        .ok()
}

/// The pid namespace this process runs in: its nsfs device and inode, as
/// `bpf_get_ns_current_pid_tgid` takes them.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PidNamespace {
    pub dev: u64,
    pub inode: u64,
}

impl PidNamespace {
    /// pyfleet's own (`/proc/self/ns/pid`).
    pub fn own() -> Option<PidNamespace> {
        Self::of("self")
    }

    /// Process `pid`'s (`/proc/PID/ns/pid`; "self" for pyfleet's).
    pub fn of(pid: &str) -> Option<PidNamespace> {
        let m = std::fs::metadata(format!("/proc/{pid}/ns/pid")).ok()?;
        Some(PidNamespace {
            dev: m.dev(),
            inode: m.ino(),
        })
    }

    /// Whether it is the host's: the one whose ids the kernel's own helpers give.
    pub fn is_host(&self) -> bool {
        self.inode == HOST_PID_NAMESPACE_INODE
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn kernel_versions_are_read_from_releases() {
        assert_eq!(kernel_version("6.1.0-18-amd64"), Some((6, 1)));
        assert_eq!(kernel_version("5.8.0"), Some((5, 8)));
        assert_eq!(kernel_version("6.18.44-fc-v657"), Some((6, 18)));
        assert_eq!(kernel_version("4.19"), Some((4, 19)));
        assert_eq!(kernel_version("garbage"), None);
        assert_eq!(kernel_version("6"), None);
    }

    #[test]
    fn this_process_has_a_pid_namespace_and_capabilities() {
        let own = PidNamespace::own().expect("/proc/self/ns/pid");
        assert_eq!(PidNamespace::of(&std::process::id().to_string()), Some(own));
        assert!(effective_capabilities().is_some());
        assert!(kernel_version(&kernel_release().expect("uname")).is_some());
    }
}
