//! The root package's side of the fleet daemon: the real implementations of the traits that
//! `pyfleet-actors` defines. [`HostDiscovery`] finds and matches Python processes in procfs;
//! [`UnwinderFactory`] attaches one [`UnwinderSource`] (the fast sampler of `cpython`) per
//! process. [`Counted`] wraps a factory to count the samples taken and failed across the fleet
//! (for `record`'s progress line).
//!
//! Must not schedule anything (the actors decide when) nor format output (`output/` does).

use crate::cpython::{self, Sampler, SamplerOptions, Version};
use crate::discovery;
use crate::memory::ProcessMemory;
use crate::process::{self, Process};
use pyfleet_actors::{
    Discovery, FrameInfo, ProcessInfo, SampleError, SampledThread, SourceFactory, SourceStats,
    StackSource, ThreadStatus,
};
use pyfleet_policies::{
    is_multiprocessing_child, short_name, Family, MatchPolicy, ProcessFacts, PythonFacts, Role,
};
use std::collections::{HashMap, HashSet};
use std::path::PathBuf;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// A process just exec'd may not have mapped libpython yet: "not Python" is only believed
/// after this long.
const SETTLE: Duration = Duration::from_secs(5);
/// A process whose probe did not return in time is probed again after this long.
const PROBE_RETRY: Duration = Duration::from_secs(30);

/// What a scan learned about one process, kept while the process lives.
struct Known {
    start: u64,
    exe: PathBuf,
    version: Option<Version>,
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
    /// Also every Python descendant of a matched process (`--subprocesses`).
    subprocesses: bool,
    /// Processes in these roles are not listed (`--exclude-role`).
    exclude_roles: Vec<Role>,
}

impl HostDiscovery {
    pub fn new(policy: MatchPolicy) -> Self {
        HostDiscovery {
            policy,
            known: HashMap::new(),
            subprocesses: false,
            exclude_roles: Vec::new(),
        }
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

    /// Remembers what a probe of this process found.
    fn learn(&mut self, pid: i32, start: u64, exe: &PathBuf, probed: discovery::Probed) {
        let first_seen = self
            .known
            .get(&pid)
            .filter(|k| k.start == start && &k.exe == exe)
            .map_or_else(Instant::now, |k| k.first_seen);
        let (version, retry_at) = match probed {
            discovery::Probed::Python(p) => (Some(p.version), None),
            discovery::Probed::NotPython => (None, None),
            discovery::Probed::TimedOut | discovery::Probed::Busy => {
                (None, Some(Instant::now() + PROBE_RETRY))
            }
        };
        self.known.insert(
            pid,
            Known {
                start,
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
        for &pid in &pids {
            let Some((ppid, start)) = process::parent_and_start(pid) else {
                continue;
            };
            parents.push((pid, ppid));
            let Ok(p) = Process::new(pid) else { continue };
            let Ok(exe) = p.exe() else { continue };
            if self.known_version(pid, start, &exe).is_none() {
                unknown.push(alive.len());
            }
            // Not the handle: it holds a file descriptor.
            alive.push((pid, exe, start));
        }
        let probe_pids: Vec<i32> = unknown.iter().map(|&i| alive[i].0).collect();
        let probed = discovery::probe_many(&probe_pids, discovery::PROBE_DEADLINE);
        for (&i, probed) in unknown.iter().zip(probed) {
            let (pid, exe, start) = &alive[i];
            self.learn(*pid, *start, exe, probed);
        }
        // Every Python process, then who is who among them.
        let mut python = Vec::new();
        for (pid, exe, start) in alive {
            let Some(Some(version)) = self.known_version(pid, start, &exe) else {
                continue;
            };
            let Ok(p) = Process::new(pid) else { continue };
            let Ok(argv) = p.cmdline() else { continue };
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
                })
                .collect(),
        );
        let facts = |pid: i32, cmdline: &str, exe_name: &str| -> (bool, bool) {
            let f = ProcessFacts {
                pid,
                cmdline,
                exe_name,
            };
            (self.policy.matches(&f), self.policy.excludes(&f))
        };
        let matched: HashSet<i32> = python
            .iter()
            .filter(|(pid, _, _, argv, exe_name)| facts(*pid, &argv.join(" "), exe_name).0)
            .map(|(pid, ..)| *pid)
            .collect();
        let own = std::process::id() as i32;
        let mut found = Vec::new();
        for (pid, start, version, argv, exe_name) in python {
            let cmdline = argv.join(" ");
            let (hit, excluded) = facts(pid, &cmdline, &exe_name);
            let listed = hit
                || (self.subprocesses
                    && pid != own
                    && !excluded
                    && family.descends_from(pid, &matched));
            let role = family.role(pid);
            if !listed || self.exclude_roles.contains(&role) {
                continue;
            }
            found.push(ProcessInfo {
                pid,
                ppid: family.parent(pid).unwrap_or(0),
                start_time: start,
                name: family
                    .name(pid)
                    .map_or_else(|| short_name(&argv, &exe_name), str::to_string),
                role,
                cmdline,
                python_version: version.to_string(),
            });
        }
        self.known.retain(|pid, _| pids.binary_search(pid).is_ok());
        found
    }
}

/// Attaches the fast sampler to each process.
#[derive(Debug, Clone, Copy, Default)]
pub struct UnwinderFactory {
    pub read_only: bool,
    /// Pause each target for its samples (`--blocking`).
    pub blocking: bool,
}

impl SourceFactory for UnwinderFactory {
    type Source = UnwinderSource;

    fn attach(&self, p: &ProcessInfo, needs_cpu_status: bool) -> Result<UnwinderSource, String> {
        let opts = SamplerOptions {
            frame_cache: true,
            read_only: self.read_only,
            cpu_status: needs_cpu_status,
            blocking: self.blocking,
            ..Default::default()
        };
        let sampler = cpython::attach(p.pid, opts).map_err(|e| e.to_string())?;
        Ok(UnwinderSource { sampler })
    }
}

/// One process's sampler, as the actors see it.
pub struct UnwinderSource {
    sampler: Sampler<ProcessMemory>,
}

impl StackSource for UnwinderSource {
    fn sample(&mut self, out: &mut Vec<SampledThread>) -> Result<(), SampleError> {
        // A target that changed its stack under the read (a torn frame chain, a frame freed
        // mid-read) usually reads fine a moment later: one immediate retry, so the profile
        // loses fewer samples. Both attempts count in the unwinder's own error stats.
        let first = self.sampler.sample().map(|_| ());
        let result = match first {
            Err(e) if !e.is_process_gone() => self.sampler.sample().map(|_| ()),
            other => other,
        };
        if let Err(e) = result {
            return Err(SampleError {
                kind: e.kind(),
                process_gone: e.is_process_gone(),
                message: e.to_string(),
            });
        }
        out.extend(self.sampler.last_sample().iter().map(|t| SampledThread {
            thread_id: t.thread_id,
            status: ThreadStatus {
                on_cpu: t.on_cpu.unwrap_or(false),
                holds_gil: t.holds_gil,
            },
            stack: u64::from(t.stack),
        }));
        Ok(())
    }

    fn resolve(&self, stack: u64) -> Option<Vec<FrameInfo>> {
        let frames = self.sampler.stacks().resolve(u32::try_from(stack).ok()?)?;
        Some(
            frames
                .map(|f| FrameInfo {
                    function: f.function.qualname.clone(),
                    file: f.function.filename.clone(),
                    line: f.line,
                })
                .collect(),
        )
    }

    fn stats(&self) -> SourceStats {
        let s = self.sampler.stats();
        SourceStats {
            samples: s.samples,
            errors: s.errors,
            frame_cache_hits: s.frame_cache_hits,
            frame_cache_partial_hits: s.frame_cache_partial_hits,
            frame_cache_misses: s.frame_cache_misses,
            code_cache_hits: s.code_cache_hits,
            code_cache_misses: s.code_cache_misses,
            remote_reads: s.remote_reads,
            remote_read_bytes: s.remote_read_bytes,
        }
    }
}

/// Samples taken and failed so far, across every source a [`Counted`] factory attached.
#[derive(Debug, Default)]
pub struct SampleCounters {
    samples: AtomicU64,
    errors: AtomicU64,
}

impl SampleCounters {
    /// Successful samples (one per process per tick).
    pub fn samples(&self) -> u64 {
        self.samples.load(Ordering::Relaxed)
    }

    /// Failed samples (not counting the one that finds a process gone).
    pub fn errors(&self) -> u64 {
        self.errors.load(Ordering::Relaxed)
    }
}

/// A factory whose sources count their samples and errors into shared [`SampleCounters`].
pub struct Counted<F> {
    pub inner: F,
    pub counters: Arc<SampleCounters>,
}

impl<F: SourceFactory> SourceFactory for Counted<F> {
    type Source = CountedSource<F::Source>;

    fn attach(&self, p: &ProcessInfo, needs_cpu_status: bool) -> Result<Self::Source, String> {
        Ok(CountedSource {
            inner: self.inner.attach(p, needs_cpu_status)?,
            counters: self.counters.clone(),
        })
    }
}

/// A source of a [`Counted`] factory.
pub struct CountedSource<S> {
    inner: S,
    counters: Arc<SampleCounters>,
}

impl<S: StackSource> StackSource for CountedSource<S> {
    fn sample(&mut self, out: &mut Vec<SampledThread>) -> Result<(), SampleError> {
        let r = self.inner.sample(out);
        match &r {
            Ok(()) => self.counters.samples.fetch_add(1, Ordering::Relaxed),
            // The process exiting is how a recording ends, not a failure.
            Err(e) if e.process_gone => 0,
            Err(_) => self.counters.errors.fetch_add(1, Ordering::Relaxed),
        };
        r
    }

    fn resolve(&self, stack: u64) -> Option<Vec<FrameInfo>> {
        self.inner.resolve(stack)
    }

    fn stats(&self) -> SourceStats {
        self.inner.stats()
    }
}
