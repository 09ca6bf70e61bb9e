//! Finding the Python processes of the host: [`HostDiscovery`], the one host scan (`list`,
//! `record` and the daemon use it, with the same names, roles and rules), and [`probe`],
//! which tells whether one process is Python and which version, under a deadline.
//!
//! A scan reads every pid's parent, start time and command name (the command name alone,
//! from its kept `/proc/PID/comm`, while it stays and for [`STAT_REFRESH`]: a parent that
//! changes, when a process is reparented, shows within that long), reads its executable's
//! path only when those changed (an `exec` changes the command name), probes new or exec'd
//! processes once per (pid, start time, executable), reads Python processes' command lines
//! every scan while they are young ([`YOUNG`]: servers set their titles as they start), then
//! every [`CMDLINE_REFRESH`] or when their command name changes, and lets
//! `policies::Family` name each Python process and give it its role; the match policy,
//! `--subprocesses` and `--exclude-role` decide the list. It must not schedule anything (the
//! actors decide when).
//!
//! A process pyfleet may not look at (another user's, without the privilege) is not "not
//! Python": when its command line says Python, or a probe was refused, it is kept as
//! [`Refused`], with why, and [`HostDiscovery::refused`] lists those the rules would match, so
//! that every command can say what it could not inspect and which privilege would let it.

pub mod labels;
pub mod probe;

pub use probe::{probe_many, probe_within, stuck_probes, Probed, PythonProcess, PROBE_DEADLINE};

use crate::cpython::Version;
use crate::process;
use pyfleet_actors::{Discovery, Labels, ProcessInfo};
use pyfleet_policies::{
    is_multiprocessing_child, is_multiprocessing_helper, short_name, Family, MatchPolicy,
    ProcessFacts, PythonFacts, Role,
};
use std::collections::{HashMap, HashSet};
use std::path::PathBuf;
use std::time::{Duration, Instant};

/// A process just exec'd may not have mapped libpython yet: "not Python" is only believed
/// after this long.
const SETTLE: Duration = Duration::from_secs(5);
/// A process seen for less than this long has its command line read at every scan.
const YOUNG: Duration = Duration::from_secs(10);
/// How often an older Python process's command line is read again (a title it sets later
/// shows within this long; at once when it renames itself, which changes its command name).
const CMDLINE_REFRESH: Duration = Duration::from_secs(10);

/// Most processes whose `/proc/PID/comm` is kept open between scans (the others' `stat` is
/// read each scan).
const MAX_KEPT: usize = 4096;
/// How long a process's `stat` facts are believed while its command name stays.
const STAT_REFRESH: Duration = Duration::from_secs(10);

/// A process whose probe did not return in time is probed again after this long.
const PROBE_RETRY: Duration = Duration::from_secs(30);

/// A process that may be Python but that pyfleet may not inspect.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Refused {
    pub pid: i32,
    /// Its command line (untrusted: escape before display).
    pub cmdline: String,
    /// Why it could not be read, and what would let pyfleet (one clause).
    pub why: String,
}

/// One line (no `pyfleet:` prefix) saying which processes could not be inspected and why,
/// or `None` when there are none: `2 Python processes could not be inspected (pid 4242
/// "python app.py", pid 4250 "..."): <why the first was refused>`.
pub fn refusal_line(refused: &[Refused]) -> Option<String> {
    const SHOWN: usize = 4;
    let first = refused.first()?;
    let mut shown: Vec<String> = refused
        .iter()
        .take(SHOWN)
        .map(|r| {
            let cmd: String = crate::output::for_terminal(&r.cmdline)
                .chars()
                .take(48)
                .collect();
            format!("pid {} \"{cmd}\"", r.pid)
        })
        .collect();
    if refused.len() > SHOWN {
        shown.push(format!("{} more", refused.len() - SHOWN));
    }
    let n = refused.len();
    Some(format!(
        "{n} process{} that may be Python could not be inspected ({}): {}",
        if n == 1 { "" } else { "es" },
        shown.join(", "),
        crate::output::for_terminal(&first.why)
    ))
}

/// Whether a command line, or a command name, names a Python interpreter.
fn names_python(argv: &[String], comm: &[u8]) -> bool {
    let first = argv
        .first()
        .map(|a| a.rsplit('/').next().unwrap_or(a).to_string())
        .unwrap_or_default();
    first.contains("python") || String::from_utf8_lossy(comm).contains("python")
}

/// What a scan learned about one process, kept while the process lives.
struct Known {
    start: u64,
    /// The command name when the executable was read.
    comm: Vec<u8>,
    exe: PathBuf,
    version: Option<Version>,
    /// Its labels, once found (see [`labels`]).
    labels: Option<Labels>,
    /// Its command line, and when it was read.
    argv: Option<(Vec<String>, Instant)>,
    /// When this process (pid, start time, executable) was first seen.
    first_seen: Instant,
    /// Its probe did not return in time: not probed again before then.
    retry_at: Option<Instant>,
}

/// Finds the Python processes that the match policy selects. Reading ELF files is the
/// expensive part, so it is done once per process (pid + start time + executable), while the
/// command line is read again every scan (servers rewrite their titles).
pub struct HostDiscovery {
    policy: MatchPolicy,
    known: HashMap<i32, Known>,
    /// Processes without a readable executable (kernel threads, mostly): their start time
    /// and command name, not looked at again while those stay.
    no_exe: HashMap<i32, (u64, Vec<u8>)>,
    /// Also every Python descendant of a matched process (`--subprocesses`).
    subprocesses: bool,
    /// Processes in these roles are not listed (`--exclude-role`).
    exclude_roles: Vec<Role>,
    /// Helper processes are not listed unless named by pid (wall mode without `--idle`).
    leave_out_helpers: bool,
    /// Processes seen at the last scan: what their `stat` said, and their command name's
    /// file kept open.
    kept: HashMap<i32, Kept>,
    /// Processes that may be Python and may not be read, by pid: their start time and why.
    refused: HashMap<i32, (u64, Refused)>,
    /// Say on stderr when processes the rules match are refused (the daemon: nothing else
    /// would), and the pids already said.
    warn_refused: Option<HashSet<i32>>,
}

/// A process's `stat` facts, when they were read, and its `/proc/PID/comm` open: a read of it
/// that fails says the process ended, even if its pid now names another
/// ([`process::comm_of`]).
struct Kept {
    facts: process::StatFacts,
    read_at: Instant,
    comm: std::fs::File,
}

impl HostDiscovery {
    pub fn new(policy: MatchPolicy) -> Self {
        HostDiscovery {
            policy,
            known: HashMap::new(),
            no_exe: HashMap::new(),
            subprocesses: false,
            exclude_roles: Vec::new(),
            leave_out_helpers: false,
            kept: HashMap::new(),
            refused: HashMap::new(),
            warn_refused: None,
        }
    }

    /// After each scan, says on stderr (one line) when processes the rules match newly could
    /// not be inspected.
    pub fn warning_of_refusals(mut self) -> Self {
        self.warn_refused = Some(HashSet::new());
        self
    }

    fn warn_of_new_refusals(&mut self) {
        let Some(said) = self.warn_refused.as_ref() else {
            return;
        };
        let refused = self.refused();
        if refused.iter().all(|r| said.contains(&r.pid)) {
            return;
        }
        if let Some(line) = refusal_line(&refused) {
            crate::logging::warning(&line);
        }
        self.warn_refused = Some(refused.iter().map(|r| r.pid).collect());
    }

    /// The processes of the last scan that may be Python, that the rules would match by
    /// pid or command line, and that pyfleet may not inspect.
    pub fn refused(&self) -> Vec<Refused> {
        let mut refused: Vec<Refused> = self
            .refused
            .values()
            .map(|(_, r)| r)
            .filter(|r| {
                let f = ProcessFacts {
                    pid: r.pid,
                    cmdline: &r.cmdline,
                    name: "",
                    exe_name: "",
                    labels: &[],
                };
                self.policy.matches(&f) && !self.policy.excludes(&f)
            })
            .cloned()
            .collect();
        refused.sort_by_key(|r| r.pid);
        refused
    }

    /// Keeps `pid` as refused when it may be Python (a probe refused, or its command line
    /// names Python), else as a process without an executable to look at.
    fn note_refused(&mut self, pid: i32, start: u64, comm: Vec<u8>, why: Option<String>) {
        let argv = process::cmdline(pid).unwrap_or_default();
        if why.is_none() && !names_python(&argv, &comm) {
            self.no_exe.insert(pid, (start, comm));
            return;
        }
        let refused = Refused {
            pid,
            cmdline: argv.join(" "),
            why: why.unwrap_or_else(|| crate::host::access::why_denied(pid)),
        };
        self.refused.insert(pid, (start, refused));
    }

    /// Lists every Python descendant of a matched process too, however it was started.
    pub fn with_subprocesses(mut self, on: bool) -> Self {
        self.subprocesses = on;
        self
    }

    /// Leaves out processes in these roles.
    pub fn excluding_roles(mut self, roles: &[Role]) -> Self {
        self.exclude_roles = roles.to_vec();
        self
    }

    /// Leaves out helper processes (multiprocessing's resource tracker and forkserver, which
    /// wait for work), unless named by pid.
    pub fn leaving_out_helpers(mut self, on: bool) -> Self {
        self.leave_out_helpers = on;
        self
    }

    /// What is known of this process without probing it: `Some(version)` when a probe
    /// already answered (or one timed out and its retry is not due), `None` when it needs a
    /// probe: a new (or exec'd) process, one too young to be sure it is not Python yet, or
    /// one whose last probe did not return in time.
    fn known_version(&self, pid: i32, start: u64, exe: &PathBuf) -> Option<Option<Version>> {
        let k = self
            .known
            .get(&pid)
            .filter(|k| k.start == start && &k.exe == exe)?;
        match k.retry_at {
            Some(at) if Instant::now() < at => Some(None),
            Some(_) => None,
            None if k.version.is_some() || k.first_seen.elapsed() > SETTLE => Some(k.version),
            None => None,
        }
    }

    /// The labels of a Python process: found at its first scan, then remembered with it.
    fn labels_of(&mut self, pid: i32, start: u64, name: &str) -> Labels {
        let Some(k) = self.known.get_mut(&pid).filter(|k| k.start == start) else {
            return labels::of_process(pid, name);
        };
        k.labels
            .get_or_insert_with(|| labels::of_process(pid, name))
            .clone()
    }

    /// The command line of a Python process: read again when due (see the module
    /// documentation), else as last read. `None` when it cannot be read.
    fn argv_of(&mut self, pid: i32, start: u64) -> Option<Vec<String>> {
        let Some(k) = self.known.get_mut(&pid).filter(|k| k.start == start) else {
            return process::cmdline(pid).ok();
        };
        let young = k.first_seen.elapsed() < YOUNG;
        match &k.argv {
            Some((argv, at)) if !young && at.elapsed() < CMDLINE_REFRESH => Some(argv.clone()),
            _ => {
                let argv = process::cmdline(pid).ok()?;
                k.argv = Some((argv.clone(), Instant::now()));
                Some(argv)
            }
        }
    }

    /// The stat facts of `pid`: as last read while its kept command-name file still answers
    /// with the same name (for [`STAT_REFRESH`]), else read afresh.
    fn stat_facts(&mut self, pid: i32) -> Option<process::StatFacts> {
        let mut buf = [0u8; 80];
        if let Some(k) = self.kept.get_mut(&pid) {
            match process::comm_of(&k.comm, &mut buf) {
                Some(comm) if comm == k.facts.comm && k.read_at.elapsed() < STAT_REFRESH => {
                    return Some(k.facts.clone());
                }
                // The same process (its file still answers): its facts read again.
                Some(_) => {
                    if let Some(facts) =
                        process::stat_facts(pid).filter(|f| f.start == k.facts.start)
                    {
                        k.facts = facts.clone();
                        k.read_at = Instant::now();
                        return Some(facts);
                    }
                }
                None => {}
            }
            self.kept.remove(&pid);
        }
        // Opened before `stat` is read: if the pid is reused in between, the file is the
        // older process's and fails at the next scan.
        let comm = std::fs::File::open(format!("/proc/{pid}/comm")).ok();
        let facts = process::stat_facts(pid)?;
        if let Some(comm) = comm.filter(|_| self.kept.len() < MAX_KEPT) {
            self.kept.insert(
                pid,
                Kept {
                    facts: facts.clone(),
                    read_at: Instant::now(),
                    comm,
                },
            );
        }
        Some(facts)
    }

    /// Remembers what a probe of this process found.
    fn learn(&mut self, pid: i32, start: u64, comm: &[u8], exe: &PathBuf, probed: probe::Probed) {
        let first_seen = self
            .known
            .get(&pid)
            .filter(|k| k.start == start && &k.exe == exe)
            .map_or_else(Instant::now, |k| k.first_seen);
        let (version, retry_at) = match probed {
            probe::Probed::Python(p) => (Some(p.version), None),
            probe::Probed::NotPython => (None, None),
            // Not probed again while it lives: it stays refused (see `refused`).
            probe::Probed::Refused(_) => (None, None),
            probe::Probed::TimedOut | probe::Probed::Busy => {
                (None, Some(Instant::now() + PROBE_RETRY))
            }
        };
        self.known.insert(
            pid,
            Known {
                start,
                comm: comm.to_vec(),
                labels: None,
                argv: None,
                exe: exe.clone(),
                version,
                first_seen,
                retry_at,
            },
        );
    }
}

impl Discovery for HostDiscovery {
    fn scan(&mut self) -> Vec<ProcessInfo> {
        let pids = match self.policy.only_pids().filter(|_| !self.subprocesses) {
            // Only the processes named by pid can match: the others need no look.
            Some(named) => {
                let mut pids = named.to_vec();
                pids.sort_unstable();
                pids.dedup();
                pids
            }
            None => process::all_pids(),
        };
        // Every process with an executable (kernel threads, often most pids, have none), and
        // which of them need a probe: probed together, so that hanging probes cost the scan
        // one deadline per wave, not one each.
        let mut alive = Vec::new();
        let mut unknown = Vec::new();
        let mut parents = Vec::with_capacity(pids.len());
        self.kept.retain(|pid, _| pids.binary_search(pid).is_ok());
        for &pid in &pids {
            let Some(facts) = self.stat_facts(pid) else {
                continue;
            };
            let start = facts.start;
            parents.push((pid, facts.ppid));
            if self.refused.get(&pid).is_some_and(|(s, _)| *s != start) {
                self.refused.remove(&pid);
            }
            if self
                .no_exe
                .get(&pid)
                .is_some_and(|(s, c)| *s == start && *c == facts.comm)
            {
                continue;
            }
            let exe = match self
                .known
                .get(&pid)
                .filter(|k| k.start == start && k.comm == facts.comm)
            {
                Some(k) => k.exe.clone(),
                None => {
                    if self.refused.get(&pid).is_some_and(|(s, _)| *s == start) {
                        continue;
                    }
                    let exe = match process::exe_link(pid) {
                        Ok(exe) => exe,
                        Err(e) if e.kind() == std::io::ErrorKind::PermissionDenied => {
                            self.note_refused(pid, start, facts.comm, None);
                            continue;
                        }
                        Err(_) => {
                            self.no_exe.insert(pid, (start, facts.comm));
                            continue;
                        }
                    };
                    // The same program renamed itself: the name is remembered with it.
                    if let Some(k) = self
                        .known
                        .get_mut(&pid)
                        .filter(|k| k.start == start && k.exe == exe)
                    {
                        k.comm.clone_from(&facts.comm);
                        k.argv = None;
                    }
                    exe
                }
            };
            self.no_exe.remove(&pid);
            if self.known_version(pid, start, &exe).is_none() {
                unknown.push(alive.len());
            }
            alive.push((pid, exe, start, facts.comm));
        }
        let probe_pids: Vec<i32> = unknown.iter().map(|&i| alive[i].0).collect();
        let probed = probe::probe_many(&probe_pids, probe::PROBE_DEADLINE);
        for (&i, probed) in unknown.iter().zip(probed) {
            let (pid, exe, start, comm) = &alive[i];
            if let Probed::Refused(why) = &probed {
                self.note_refused(*pid, *start, comm.clone(), Some(why.clone()));
            } else {
                self.refused.remove(pid);
            }
            self.learn(*pid, *start, comm, exe, probed);
        }
        // Every Python process, then who is who among them.
        let mut python = Vec::new();
        for (pid, exe, start, _) in alive {
            let Some(Some(version)) = self.known_version(pid, start, &exe) else {
                continue;
            };
            let Some(argv) = self.argv_of(pid, start) else {
                continue;
            };
            let exe_name = exe
                .file_name()
                .map(|n| n.to_string_lossy().into_owned())
                .unwrap_or_default();
            python.push((pid, start, version, argv, exe_name));
        }
        let family = Family::new(
            parents,
            python
                .iter()
                .map(|(pid, _, _, argv, exe_name)| PythonFacts {
                    pid: *pid,
                    name: short_name(argv, exe_name),
                    multiprocessing_child: is_multiprocessing_child(argv),
                    multiprocessing_helper: is_multiprocessing_helper(argv),
                })
                .collect(),
        );
        // Each Python process's name and labels (found once per process: see `labels`).
        let python: Vec<_> = python
            .into_iter()
            .map(|(pid, start, version, argv, exe_name)| {
                let name = family
                    .name(pid)
                    .map_or_else(|| short_name(&argv, &exe_name), str::to_string);
                let labels = self.labels_of(pid, start, &name);
                (pid, start, version, argv.join(" "), exe_name, name, labels)
            })
            .collect();
        // A multiprocessing child (`python -c "from multiprocessing..."`) is matched by its
        // own command line or by that of the program it is named after.
        let cmdlines: HashMap<i32, String> = python
            .iter()
            .map(|(pid, _, _, cmdline, ..)| (*pid, cmdline.clone()))
            .collect();
        let facts = |pid: i32,
                     cmdline: &str,
                     exe_name: &str,
                     name: &str,
                     labels: &Labels|
         -> (bool, bool) {
            let labels: Vec<(&str, &str)> = labels.iter().collect();
            let origin = family
                .named_after(pid)
                .filter(|&o| o != pid)
                .and_then(|o| cmdlines.get(&o));
            let mut hit = false;
            let mut excluded = false;
            for cmdline in std::iter::once(cmdline).chain(origin.map(String::as_str)) {
                let f = ProcessFacts {
                    pid,
                    cmdline,
                    name,
                    exe_name,
                    labels: &labels,
                };
                hit |= self.policy.matches(&f);
                excluded |= self.policy.excludes(&f);
            }
            (hit, excluded)
        };
        // Whose descendants `--subprocesses` takes: the matched Python processes, and every
        // process named by pid, Python or not (a program started by `-- COMMAND` may be a
        // shell or a launcher whose children run Python).
        let matched: HashSet<i32> = python
            .iter()
            .filter(|(pid, _, _, cmdline, exe_name, name, labels)| {
                facts(*pid, cmdline, exe_name, name, labels).0
            })
            .map(|(pid, ..)| *pid)
            .chain(self.policy.named_pids().iter().copied())
            .collect();
        let own = std::process::id() as i32;
        let mut found = Vec::new();
        for (pid, start, version, cmdline, exe_name, name, labels) in python {
            let (hit, excluded) = facts(pid, &cmdline, &exe_name, &name, &labels);
            let listed = hit
                || (self.subprocesses
                    && pid != own
                    && !excluded
                    && family.descends_from(pid, &matched));
            let role = family.role(pid);
            let idle_helper = self.leave_out_helpers
                && role == Role::Helper
                && !self.policy.named_pids().contains(&pid);
            if !listed || self.exclude_roles.contains(&role) || idle_helper {
                continue;
            }
            found.push(ProcessInfo {
                pid,
                ppid: family.parent(pid).unwrap_or(0),
                start_time: start,
                name,
                role,
                cmdline,
                python_version: version.to_string(),
                labels,
            });
        }
        self.known.retain(|pid, _| pids.binary_search(pid).is_ok());
        self.no_exe.retain(|pid, _| pids.binary_search(pid).is_ok());
        self.refused
            .retain(|pid, _| pids.binary_search(pid).is_ok());
        self.warn_of_new_refusals();
        found
    }
}
