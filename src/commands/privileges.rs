//! Who pyfleet's processes run as: the daemon, once what needs more is open, and a program
//! started under sudo.
//!
//! Contract of [`keep_only_what_is_used`] (the daemon, `pyfleet run` without a program):
//! - It is called on the main thread while that is the process's only thread (it refuses
//!   otherwise). Capabilities are each thread's own and a new thread starts with its maker's,
//!   so every thread the daemon makes afterwards (the async runtime's, the sampler's) holds
//!   exactly what the main thread holds then.
//! - Afterwards the permitted and effective sets are [`USED`] and nothing else (those of them
//!   pyfleet held: it never gains one); the ambient and inheritable sets are empty; the
//!   bounding set is empty where pyfleet held CAP_SETPCAP (else it stays as the parent left it);
//!   and `no_new_privs` is set, so no exec can hand back what was dropped. With a user to
//!   become (`--user`), the process's uids and gids are that user's and its supplementary
//!   groups the user's, the capabilities above kept across the change (`PR_SET_KEEPCAPS`).
//! - A set already as it should be is not written again: under systemd's seccomp filter, which
//!   refuses `capset`, a unit that already grants only [`USED`] passes. The result is read
//!   back, and anything more in the permitted or effective set is an error: the daemon does
//!   not run with more than it says.

use anyhow::{anyhow, bail, Context, Result};
use caps::{CapSet, Capability, CapsHashSet};
use std::ffi::OsString;

/// The capabilities the daemon uses once started: reading other users' processes
/// (`process_vm_readv`, /proc/PID/maps, root and exe), reading their files whatever their
/// permissions (not writing them), and the kernel capture's maps and perf events.
pub const USED: [Capability; 4] = [
    Capability::CAP_SYS_PTRACE,
    Capability::CAP_DAC_READ_SEARCH,
    Capability::CAP_BPF,
    Capability::CAP_PERFMON,
];

/// A user the daemon runs as (`--user`): a name from the user database or a numeric uid.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RunAs {
    pub uid: u32,
    pub gid: u32,
    /// The user's name, when the database has one (for the supplementary groups).
    pub name: Option<String>,
}

impl RunAs {
    /// `--user NAME` or `--user UID` (a uid without a name runs with its own gid = uid).
    pub fn parse(spec: &str) -> Result<RunAs> {
        use nix::unistd::{Uid, User};
        let found = match spec.parse::<u32>() {
            Ok(uid) => User::from_uid(Uid::from_raw(uid)),
            Err(_) => User::from_name(spec),
        }
        .map_err(|e| anyhow!("--user {}: {e}", spec.escape_debug()))?;
        match (found, spec.parse::<u32>()) {
            (Some(user), _) => Ok(RunAs {
                uid: user.uid.as_raw(),
                gid: user.gid.as_raw(),
                name: Some(user.name),
            }),
            (None, Ok(uid)) => Ok(RunAs {
                uid,
                gid: uid,
                name: None,
            }),
            (None, Err(_)) => bail!("--user {}: no such user", spec.escape_debug()),
        }
    }

    /// The owner pyfleet's output directory must have.
    pub fn owner(&self) -> pyfleet::output::Owner {
        pyfleet::output::Owner {
            uid: self.uid,
            gid: self.gid,
        }
    }
}

/// What the daemon runs with after [`keep_only_what_is_used`], for its first line.
#[derive(Debug, Clone)]
pub struct Kept {
    pub uid: u32,
    pub capabilities: Vec<Capability>,
    /// Whether the bounding set could be emptied (it needs CAP_SETPCAP).
    pub bounding_cleared: bool,
}

impl std::fmt::Display for Kept {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let names: Vec<String> = self
            .capabilities
            .iter()
            .map(|c| c.to_string().to_ascii_lowercase())
            .collect();
        write!(
            f,
            "runs as uid {} with {}{}",
            self.uid,
            match names.is_empty() {
                true => "no capability".to_string(),
                false => format!("only {}", names.join(", ")),
            },
            match self.bounding_cleared {
                true => "",
                false => " (bounding set as given: no CAP_SETPCAP to empty it)",
            }
        )
    }
}

/// Drops everything but [`USED`] and becomes `user`, when given; see the module
/// documentation.
pub fn keep_only_what_is_used(user: Option<&RunAs>) -> Result<Kept> {
    let threads = std::fs::read_dir("/proc/self/task")
        .map(|d| d.count())
        .context("cannot read /proc/self/task")?;
    if threads != 1 {
        bail!("internal: privileges are dropped before any thread starts ({threads} run)");
    }
    let refused = |what: &str, e: caps::errors::CapsError| anyhow!("cannot {what}: {e}");
    let permitted =
        caps::read(None, CapSet::Permitted).map_err(|e| refused("read capabilities", e))?;
    let keep: CapsHashSet = USED
        .iter()
        .copied()
        .filter(|c| permitted.contains(c))
        .collect();
    if user.is_some()
        && !(permitted.contains(&Capability::CAP_SETUID)
            && permitted.contains(&Capability::CAP_SETGID))
    {
        bail!("--user needs root (or CAP_SETUID and CAP_SETGID) to become another user");
    }
    // The bounding set first: emptying it takes CAP_SETPCAP, which goes with the rest below.
    let effective =
        caps::read(None, CapSet::Effective).map_err(|e| refused("read capabilities", e))?;
    let bounding_cleared = if effective.contains(&Capability::CAP_SETPCAP) {
        for cap in
            caps::read(None, CapSet::Bounding).map_err(|e| refused("read the bounding set", e))?
        {
            caps::drop(None, CapSet::Bounding, cap)
                .map_err(|e| refused("empty the bounding set", e))?;
        }
        true
    } else {
        caps::read(None, CapSet::Bounding).is_ok_and(|b| b.is_empty())
    };
    // Ambient capabilities would pass to a program pyfleet ran; it runs none. Kernels before
    // 4.3 have no ambient set (nothing to clear).
    let _ = caps::clear(None, CapSet::Ambient);
    nix::sys::prctl::set_no_new_privs().context("cannot set no_new_privs")?;
    if let Some(user) = user {
        nix::sys::prctl::set_keepcaps(true).context("cannot keep capabilities across --user")?;
        become_user(user.uid, user.gid)
            .with_context(|| format!("cannot become uid {}", user.uid))?;
        nix::sys::prctl::set_keepcaps(false).context("cannot reset keepcaps")?;
    }
    // One set at a time, each step valid on its own: effective within permitted.
    for (set, value) in [
        (CapSet::Effective, keep.clone()),
        (CapSet::Permitted, keep.clone()),
        (CapSet::Inheritable, CapsHashSet::new()),
    ] {
        let now = caps::read(None, set).map_err(|e| refused("read capabilities", e))?;
        if now != value {
            caps::set(None, set, &value).map_err(|e| refused("drop capabilities", e))?;
        }
    }
    for set in [CapSet::Permitted, CapSet::Effective] {
        let now = caps::read(None, set).map_err(|e| refused("read capabilities", e))?;
        if now != keep {
            bail!("capabilities still held after the drop: {now:?}");
        }
    }
    let mut capabilities: Vec<Capability> = keep.into_iter().collect();
    capabilities.sort_by_key(|c| c.index());
    Ok(Kept {
        uid: nix::unistd::geteuid().as_raw(),
        capabilities,
        bounding_cleared,
    })
}

/// Becomes user `uid` of group `gid` with that user's supplementary groups (none for a uid
/// without a name), as `sudo -u` would: real, effective and saved ids alike. Returns the
/// user's HOME, USER and LOGNAME, for a program about to run as them.
pub fn become_user(uid: u32, gid: u32) -> nix::Result<Vec<(&'static str, OsString)>> {
    use nix::unistd::{Gid, Uid, User};
    let (uid, gid) = (Uid::from_raw(uid), Gid::from_raw(gid));
    let mut environment = Vec::new();
    match User::from_uid(uid)? {
        Some(user) => {
            let name =
                std::ffi::CString::new(user.name.as_bytes()).map_err(|_| nix::Error::EINVAL)?;
            nix::unistd::initgroups(&name, gid)?;
            environment.push(("HOME", user.dir.into_os_string()));
            environment.push(("USER", OsString::from(&user.name)));
            environment.push(("LOGNAME", OsString::from(user.name)));
        }
        None => nix::unistd::setgroups(&[])?,
    }
    nix::unistd::setresgid(gid, gid, gid)?;
    nix::unistd::setresuid(uid, uid, uid)?;
    Ok(environment)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn users_are_named_or_numbered() {
        let root = RunAs::parse("root").unwrap();
        assert_eq!((root.uid, root.gid), (0, 0));
        assert_eq!(RunAs::parse("0").unwrap(), root);
        let unnamed = RunAs::parse("4000123").unwrap();
        assert_eq!(
            (unnamed.uid, unnamed.gid, unnamed.name),
            (4000123, 4000123, None)
        );
        let e = RunAs::parse("no-such-user-here").unwrap_err().to_string();
        assert!(e.contains("no such user"), "{e}");
    }

    #[test]
    fn what_is_kept_is_said_in_words() {
        let kept = Kept {
            uid: 65534,
            capabilities: USED.to_vec(),
            bounding_cleared: false,
        };
        assert_eq!(
            kept.to_string(),
            "runs as uid 65534 with only cap_sys_ptrace, cap_dac_read_search, cap_bpf, \
             cap_perfmon (bounding set as given: no CAP_SETPCAP to empty it)"
        );
    }
}
