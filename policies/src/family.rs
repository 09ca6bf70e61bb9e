//! Who is who among a host's Python processes: masters and their workers, multiprocessing's
//! helpers, and the descendants of a matched process.
//!
//! Owns three decisions, from facts the caller gathers (pid, parent pid, short name, whether
//! the process is one of multiprocessing's children) and never reads anything itself:
//! - [`Family::name`]: a child started by multiprocessing (`spawn`, `forkserver`: its command
//!   line is `python -c "from multiprocessing..."`) is named after the nearest ancestor that
//!   is not such a child (`mpjob`, not `python-c`);
//! - [`Family::role`]: multiprocessing's resource tracker and forkserver (by their command
//!   lines) are [`Role::Helper`]s of the program that started them; a Python process whose
//!   parent is a Python process of the same name is a [`Role::Worker`] (gunicorn's and
//!   uvicorn's workers, Celery's prefork pool, multiprocessing's pool, a forkserver's
//!   children), and that parent a [`Role::Master`]; any other is [`Role::Single`];
//! - [`Family::named_after`]: the process a multiprocessing child is named after, whose
//!   command line the rules match it by;
//! - [`Family::descends_from`]: whether a process has an ancestor in a set (any process in
//!   between, Python or not), for `--subprocesses`.
//!
//! Ancestry is followed at most [`MAX_GENERATIONS`] steps, so a hostile or cyclic parent table
//! cannot make a walk unbounded.

use std::collections::{HashMap, HashSet};
use std::fmt;
use std::str::FromStr;

/// Steps up the parent chain any walk takes at most.
pub const MAX_GENERATIONS: usize = 64;

/// A process's place in its family.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Role {
    /// Neither the parent of a worker nor one.
    Single,
    /// The parent of Python processes of its own name.
    Master,
    /// The child of a Python process of its own name.
    Worker,
    /// A process multiprocessing starts to serve its program (the resource tracker, the
    /// forkserver), not to run its work.
    Helper,
}

impl Role {
    pub const ALL: [Role; 4] = [Role::Single, Role::Master, Role::Worker, Role::Helper];

    /// The role's name in `list`, the `role` metric label and `--exclude-role`.
    pub fn as_str(self) -> &'static str {
        match self {
            Role::Single => "single",
            Role::Master => "master",
            Role::Worker => "worker",
            Role::Helper => "helper",
        }
    }
}

impl fmt::Display for Role {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// `--exclude-role` was given a name that is not a role.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("unknown role {input:?}: expected one of single, master, worker")]
pub struct RoleError {
    pub input: String,
}

impl FromStr for Role {
    type Err = RoleError;
    fn from_str(s: &str) -> Result<Self, RoleError> {
        Role::ALL
            .into_iter()
            .find(|r| r.as_str() == s.trim())
            .ok_or_else(|| RoleError {
                input: s.to_string(),
            })
    }
}

/// What the caller knows of one Python process.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PythonFacts {
    pub pid: i32,
    /// Its short name (see [`short_name`](crate::short_name)).
    pub name: String,
    /// Started by multiprocessing (`python -c "from multiprocessing..."`).
    pub multiprocessing_child: bool,
    /// One of multiprocessing's helpers (resource tracker, forkserver) by its command line
    /// (see [`is_multiprocessing_helper`](crate::is_multiprocessing_helper)); a forkserver's
    /// children share its command line.
    pub multiprocessing_helper: bool,
}

/// The host's processes as one family tree, for one scan.
#[derive(Debug, Default)]
pub struct Family {
    /// Every process's parent (Python or not).
    parents: HashMap<i32, i32>,
    python: HashMap<i32, PythonFacts>,
    names: HashMap<i32, String>,
    /// The process each Python process is named after (itself, or for a multiprocessing
    /// child its nearest ancestor that is none).
    origins: HashMap<i32, i32>,
    masters: HashSet<i32>,
}

impl Family {
    /// `parents`: (pid, parent pid) of every process the caller saw, Python or not; `python`:
    /// the Python processes among them.
    pub fn new(parents: impl IntoIterator<Item = (i32, i32)>, python: Vec<PythonFacts>) -> Self {
        let mut f = Family {
            parents: parents.into_iter().collect(),
            python: python.into_iter().map(|p| (p.pid, p)).collect(),
            names: HashMap::new(),
            origins: HashMap::new(),
            masters: HashSet::new(),
        };
        let origins: HashMap<i32, i32> = f
            .python
            .keys()
            .map(|&pid| (pid, f.resolve_origin(pid)))
            .collect();
        let names: HashMap<i32, String> = origins
            .iter()
            .map(|(&pid, origin)| {
                let name = f.python.get(origin).or(f.python.get(&pid));
                (pid, name.map(|p| p.name.clone()).unwrap_or_default())
            })
            .collect();
        f.origins = origins;
        f.names = names;
        let masters: HashSet<i32> = f
            .python
            .keys()
            .filter(|&&pid| f.same_name_as_parent(pid) && !f.is_helper(pid))
            .filter_map(|pid| f.parents.get(pid).copied())
            .collect();
        f.masters = masters;
        f
    }

    /// The name a Python process goes by (its own short name, or for a multiprocessing
    /// child its nearest non-helper ancestor's). `None` for a pid that is not a known Python
    /// process.
    pub fn name(&self, pid: i32) -> Option<&str> {
        self.names.get(&pid).map(String::as_str)
    }

    /// The process `pid` is named after: itself, or for a multiprocessing child the nearest
    /// ancestor that is not one. `None` for a pid that is not a known Python process.
    pub fn named_after(&self, pid: i32) -> Option<i32> {
        self.origins.get(&pid).copied()
    }

    pub fn role(&self, pid: i32) -> Role {
        if self.is_helper(pid) {
            Role::Helper
        } else if self.same_name_as_parent(pid) {
            Role::Worker
        } else if self.masters.contains(&pid) {
            Role::Master
        } else {
            Role::Single
        }
    }

    /// The parent pid of a process seen, if known.
    pub fn parent(&self, pid: i32) -> Option<i32> {
        self.parents.get(&pid).copied()
    }

    /// Whether an ancestor of `pid` (not `pid` itself) is in `set`.
    pub fn descends_from(&self, pid: i32, set: &HashSet<i32>) -> bool {
        let mut at = pid;
        for _ in 0..MAX_GENERATIONS {
            match self.parents.get(&at) {
                Some(&p) if p > 0 && p != at => {
                    if set.contains(&p) {
                        return true;
                    }
                    at = p;
                }
                _ => return false,
            }
        }
        false
    }

    /// A helper by its command line whose parent is not one (a forkserver's children share
    /// its command line: they are its workers).
    fn is_helper(&self, pid: i32) -> bool {
        let helper = |p: &i32| self.python.get(p).is_some_and(|f| f.multiprocessing_helper);
        helper(&pid) && !self.parents.get(&pid).is_some_and(helper)
    }

    fn same_name_as_parent(&self, pid: i32) -> bool {
        let Some(&parent) = self.parents.get(&pid) else {
            return false;
        };
        self.python.contains_key(&pid)
            && self.python.contains_key(&parent)
            && parent != pid
            && self.names.contains_key(&pid)
            && self.names.get(&pid) == self.names.get(&parent)
    }

    /// The process `pid` is named after (see [`Family::named_after`]): itself when no
    /// Python ancestor that is not a multiprocessing child is found.
    fn resolve_origin(&self, pid: i32) -> i32 {
        let mut at = pid;
        for _ in 0..MAX_GENERATIONS {
            match self.python.get(&at) {
                Some(p) if p.multiprocessing_child => match self.parents.get(&at) {
                    Some(&q) if q > 0 && q != at => at = q,
                    _ => break,
                },
                Some(_) => return at,
                // A non-Python process in between: go on up (a shell that started it).
                None => match self.parents.get(&at) {
                    Some(&q) if q > 0 && q != at => at = q,
                    _ => break,
                },
            }
        }
        pid
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A family of the processes `others` (pid, parent) and the Python processes `python`
    /// (pid, parent, name, started by multiprocessing).
    fn family(others: &[(i32, i32)], python: &[(i32, i32, &str, bool)]) -> Family {
        let parents = others
            .iter()
            .copied()
            .chain(python.iter().map(|&(pid, ppid, ..)| (pid, ppid)));
        let facts = python
            .iter()
            .map(|&(pid, _, name, mp)| PythonFacts {
                pid,
                name: name.into(),
                multiprocessing_child: mp,
                multiprocessing_helper: false,
            })
            .collect();
        Family::new(parents, facts)
    }

    #[test]
    fn multiprocessing_helpers_are_helpers_and_a_forkservers_children_workers() {
        // uvicorn (10) with spawned workers (11, 12) and a resource tracker (13); a job (20)
        // with a forkserver (21) and the forkserver's children (22, 23).
        let fact = |pid, name: &str, mp, helper| PythonFacts {
            pid,
            name: name.into(),
            multiprocessing_child: mp,
            multiprocessing_helper: helper,
        };
        let f = Family::new(
            [
                (10, 1),
                (11, 10),
                (12, 10),
                (13, 10),
                (20, 1),
                (21, 20),
                (22, 21),
                (23, 21),
            ],
            vec![
                fact(10, "uvicorn", false, false),
                fact(11, "python-c", true, false),
                fact(12, "python-c", true, false),
                fact(13, "python-c", true, true),
                fact(20, "job", false, false),
                fact(21, "python-c", true, true),
                fact(22, "python-c", true, true),
                fact(23, "python-c", true, true),
            ],
        );
        for (pid, role, name, after) in [
            (10, Role::Master, "uvicorn", 10),
            (11, Role::Worker, "uvicorn", 10),
            (12, Role::Worker, "uvicorn", 10),
            (13, Role::Helper, "uvicorn", 10),
            // The forkserver, not the job, is its workers' parent.
            (20, Role::Single, "job", 20),
            (21, Role::Helper, "job", 20),
            (22, Role::Worker, "job", 20),
            (23, Role::Worker, "job", 20),
        ] {
            assert_eq!(f.role(pid), role, "pid {pid}");
            assert_eq!(f.name(pid), Some(name), "pid {pid}");
            assert_eq!(f.named_after(pid), Some(after), "pid {pid}");
        }
        assert_eq!(Role::from_str("helper"), Ok(Role::Helper));
    }

    #[test]
    fn a_prefork_server_has_one_master_and_its_workers() {
        let f = family(
            &[(1, 0), (10, 1)],
            &[
                (100, 10, "gunicorn", false),
                (101, 100, "gunicorn", false),
                (102, 100, "gunicorn", false),
                (200, 10, "batch", false),
            ],
        );
        assert_eq!(f.role(100), Role::Master);
        assert_eq!(f.role(101), Role::Worker);
        assert_eq!(f.role(102), Role::Worker);
        assert_eq!(f.role(200), Role::Single);
        assert_eq!(f.role(999), Role::Single);
    }

    #[test]
    fn multiprocessing_children_take_their_program_s_name() {
        // spawn: children of the script; forkserver: children of the server, itself a child
        // of the script; the resource tracker too.
        let f = family(
            &[(50, 1)],
            &[
                (60, 50, "mpjob", false),
                (61, 60, "python-c", true),
                (62, 60, "python-c", true),
                (63, 62, "python-c", true),
                (64, 60, "python-c", false),
            ],
        );
        for pid in [61, 62, 63] {
            assert_eq!(f.name(pid), Some("mpjob"), "pid {pid}");
            assert_eq!(f.role(pid), Role::Worker, "pid {pid}");
        }
        assert_eq!(f.role(60), Role::Master);
        assert_eq!(
            f.name(64),
            Some("python-c"),
            "a plain -c child keeps its name"
        );
        assert_eq!(f.role(64), Role::Single);
    }

    #[test]
    fn descendants_through_any_process_and_bounded() {
        let f = family(
            &[(2, 1), (3, 2), (4, 3)],
            &[(1, 0, "app", false), (4, 3, "tool", false)],
        );
        let set: HashSet<i32> = [1].into();
        assert!(f.descends_from(4, &set));
        assert!(!f.descends_from(1, &set), "not its own descendant");
        // A cycle in a (hostile, or racy) parent table ends.
        let cyc = family(&[(7, 8), (8, 7)], &[(7, 8, "x", true)]);
        assert!(!cyc.descends_from(7, &[99].into()));
        assert_eq!(cyc.name(7), Some("x"));
        assert_eq!("master".parse::<Role>(), Ok(Role::Master));
        assert!("boss".parse::<Role>().is_err());
    }
}
