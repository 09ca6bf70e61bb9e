//! Why the kernel refused pyfleet a process: "permission denied" explained in words that apply
//! to this host and this target (pyfleet's own privileges, Yama's ptrace scope, a kernel
//! thread, another user namespace, a target that is not dumpable), not a generic hint.
//!
//! Reads procfs only (pyfleet's own status, the target's stat and namespace links, the Yama
//! sysctl) and never fails: what cannot be read is left out of the explanation.

use std::fs;

/// `PF_KTHREAD` in `/proc/PID/stat`'s flags.
const PF_KTHREAD: u64 = 0x0020_0000;
/// Yama's setting: who may ptrace (and so read the memory of) whom.
const YAMA_SCOPE: &str = "/proc/sys/kernel/yama/ptrace_scope";

/// One clause (no trailing period) saying why reading `pid` was refused and what to do.
pub fn why_denied(pid: i32) -> String {
    if is_kernel_thread(pid) {
        return format!("pid {pid} is a kernel thread: it runs no Python");
    }
    let yama = fs::read_to_string(YAMA_SCOPE)
        .ok()
        .and_then(|s| s.trim().parse::<u32>().ok());
    if yama == Some(3) {
        return "ptrace is disabled for every process on this host \
                (kernel.yama.ptrace_scope = 3; only a reboot lowers it)"
            .to_string();
    }
    let ptrace_cap = super::has_ptrace_capability() == Some(true);
    let own_uid = status_field("self", "Uid:").and_then(|u| first_number(&u));
    let target_uid = status_field(&pid.to_string(), "Uid:").and_then(|u| first_number(&u));
    if !ptrace_cap {
        if let Some(scope @ (1 | 2)) = yama {
            return format!(
                "kernel.yama.ptrace_scope = {scope} lets only root or a process's parent read \
                 it: run pyfleet as root or give it CAP_SYS_PTRACE"
            );
        }
        return match (own_uid, target_uid) {
            (Some(me), Some(them)) if me != them => format!(
                "pid {pid} runs as uid {them} and pyfleet as uid {me} without CAP_SYS_PTRACE: \
                 run pyfleet as root or give it CAP_SYS_PTRACE"
            ),
            _ => "pyfleet runs without CAP_SYS_PTRACE: run it as root or give it the capability"
                .to_string(),
        };
    }
    let own_ns = fs::read_link("/proc/self/ns/user").ok();
    let target_ns = fs::read_link(format!("/proc/{pid}/ns/user")).ok();
    match (own_ns, target_ns) {
        (Some(a), Some(b)) if a != b => format!(
            "pid {pid} is in another user namespace (a container's or a sandbox's) that \
             pyfleet's CAP_SYS_PTRACE does not cover: run pyfleet in that namespace or an \
             ancestor of it"
        ),
        (Some(_), None) => format!(
            "pyfleet has CAP_SYS_PTRACE but may not even look at pid {pid}'s namespaces: it is \
             in a user namespace pyfleet's capabilities do not cover, or protected by a \
             security module (SELinux, AppArmor)"
        ),
        _ => format!(
            "pyfleet has CAP_SYS_PTRACE and the kernel still refused: pid {pid} is not dumpable \
             (prctl PR_SET_DUMPABLE) or a security module (SELinux, AppArmor) denies ptrace"
        ),
    }
}

/// Whether `pid` is a kernel thread (by its stat flags).
fn is_kernel_thread(pid: i32) -> bool {
    // Flags are field 9, the seventh after the command name.
    super::stat_after_command(pid)
        .and_then(|rest| rest.split_whitespace().nth(9 - 3)?.parse::<u64>().ok())
        .is_some_and(|flags| flags & PF_KTHREAD != 0)
}

/// The text after `key` on its line of `/proc/<who>/status`, trimmed.
fn status_field(who: &str, key: &str) -> Option<String> {
    let status = fs::read_to_string(format!("/proc/{who}/status")).ok()?;
    status
        .lines()
        .find_map(|l| l.strip_prefix(key))
        .map(|v| v.trim().to_string())
}

fn first_number(s: &str) -> Option<u32> {
    s.split_whitespace().next()?.parse().ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_kernel_thread_is_named_as_one() {
        // kthreadd is pid 2 in the initial pid namespace; elsewhere there is nothing to check.
        if fs::read_to_string("/proc/2/comm").is_ok_and(|c| c.trim() == "kthreadd") {
            assert!(is_kernel_thread(2));
            assert!(why_denied(2).contains("kernel thread"));
        }
        assert!(!is_kernel_thread(std::process::id() as i32));
    }

    #[test]
    fn every_explanation_is_one_line() {
        for pid in [1, 2, std::process::id() as i32, 999_999_999] {
            let why = why_denied(pid);
            assert!(!why.is_empty() && !why.contains('\n'), "{why}");
        }
    }
}
