//! Fakes for the traits of pyfleet-actors: a world of fake processes that tests script, a
//! discovery that lists them, a factory whose sources sample them, and a writer that keeps
//! the snapshots in memory.

#![allow(dead_code)]

use std::collections::{BTreeMap, HashMap, HashSet};
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::ThreadId;
use std::time::{Duration, Instant};

use pyfleet_actors::{
    AttachFailure, Discovery, Fleet, FleetConfig, FleetStatus, FrameInfo, ProcessInfo,
    ProcessState, SampleError, SampleKind, SampledThread, Snapshot, SnapshotWriter, SourceFactory,
    SourceStats, StackSource, ThreadStatus,
};
use pyfleet_policies::{Mode, RatePolicy, RestartPolicy};

pub const CPU_GIL: ThreadStatus = ThreadStatus {
    on_cpu: true,
    holds_gil: true,
    waits_gil: false,
};
pub const CPU: ThreadStatus = ThreadStatus {
    on_cpu: true,
    holds_gil: false,
    waits_gil: false,
};
pub const GIL: ThreadStatus = ThreadStatus {
    on_cpu: false,
    holds_gil: true,
    waits_gil: false,
};
pub const IDLE: ThreadStatus = ThreadStatus {
    on_cpu: false,
    holds_gil: false,
    waits_gil: false,
};

/// What happens once a fake process has given `limit` successful samples.
#[derive(Clone, Copy, Debug)]
pub enum AfterLimit {
    /// Keeps answering with no thread.
    Idle,
    /// Reports `process_gone`; with `unlist`, discovery stops listing it at the same moment.
    Gone { unlist: bool },
}

/// How sample() behaves.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Failures {
    None,
    /// Every sample panics.
    Panic,
    /// Every other call fails (1st, 3rd, ...).
    EveryOther,
    /// Every call fails.
    Always,
    /// Every `n`th call panics (the `n`th, the `2n`th, ...), counted over all lives.
    PanicEvery(u64),
    /// attach() fails (as it does without permission to read the process).
    Attach,
    /// attach() finds the process ending (as it does once its memory is gone).
    AttachEnded,
}

pub struct FakeProc {
    pub info: ProcessInfo,
    pub threads: Vec<(ThreadStatus, u64)>,
    pub limit: Option<(u64, AfterLimit)>,
    pub failures: Failures,
    pub listed: AtomicBool,
    pub attaches: Mutex<Vec<Instant>>,
    pub needs_cpu_status: Mutex<Vec<bool>>,
    /// Calls of sample().
    pub calls: AtomicU64,
    /// Successful samples (with threads, i.e. before the limit).
    pub ok_samples: AtomicU64,
    pub resolves: Mutex<HashMap<u64, u32>>,
    /// The OS threads sample() ran on, and the names of those attach() ran on.
    pub sample_threads: Mutex<HashSet<ThreadId>>,
    pub sample_thread_names: Mutex<HashSet<String>>,
    pub attach_thread_names: Mutex<Vec<String>>,
    /// Sources dropped.
    pub drops: AtomicUsize,
    /// How long attach() takes (after recording the attach).
    pub attach_delay: Duration,
}

impl FakeProc {
    pub fn new(pid: i32, name: &str, threads: Vec<(ThreadStatus, u64)>) -> Self {
        FakeProc {
            info: ProcessInfo {
                ppid: 1,
                pid,
                name: name.to_string(),
                role: pyfleet_policies::Role::Single,
                cmdline: format!("python3 {name}.py"),
                python_version: "3.13.1".to_string(),
                labels: Default::default(),
                start_time: 0,
            },
            threads,
            limit: None,
            failures: Failures::None,
            listed: AtomicBool::new(true),
            attaches: Mutex::new(Vec::new()),
            needs_cpu_status: Mutex::new(Vec::new()),
            calls: AtomicU64::new(0),
            ok_samples: AtomicU64::new(0),
            resolves: Mutex::new(HashMap::new()),
            sample_threads: Mutex::new(HashSet::new()),
            sample_thread_names: Mutex::new(HashSet::new()),
            attach_thread_names: Mutex::new(Vec::new()),
            drops: AtomicUsize::new(0),
            attach_delay: Duration::ZERO,
        }
    }

    pub fn limit(mut self, n: u64, after: AfterLimit) -> Self {
        self.limit = Some((n, after));
        self
    }

    pub fn started(mut self, start_time: u64) -> Self {
        self.info.start_time = start_time;
        self
    }

    pub fn slow_attach(mut self, delay: Duration) -> Self {
        self.attach_delay = delay;
        self
    }

    pub fn failures(mut self, f: Failures) -> Self {
        self.failures = f;
        self
    }

    pub fn attach_count(&self) -> usize {
        self.attaches.lock().unwrap().len()
    }

    pub fn ok(&self) -> u64 {
        self.ok_samples.load(Ordering::SeqCst)
    }

    pub fn calls(&self) -> u64 {
        self.calls.load(Ordering::SeqCst)
    }

    pub fn drop_count(&self) -> usize {
        self.drops.load(Ordering::SeqCst)
    }
}

fn thread_name() -> String {
    std::thread::current()
        .name()
        .unwrap_or("<unnamed>")
        .to_string()
}

/// The frames a fake stack id resolves to, innermost first.
pub fn frames_of(stack: u64) -> Vec<FrameInfo> {
    vec![
        FrameInfo {
            function: format!("f{stack}").into(),
            file: "fake.py".into(),
            line: Some(stack as i32),
        },
        FrameInfo {
            function: "<module>".into(),
            file: "fake.py".into(),
            line: None,
        },
    ]
}

#[derive(Default)]
pub struct World {
    procs: Mutex<BTreeMap<i32, Arc<FakeProc>>>,
    /// Roles that discovery reports instead of the processes' own.
    pub roles: Mutex<BTreeMap<i32, pyfleet_policies::Role>>,
    pub scans: AtomicUsize,
}

impl World {
    pub fn new() -> Arc<Self> {
        Arc::new(World::default())
    }

    pub fn add(&self, p: FakeProc) -> Arc<FakeProc> {
        let p = Arc::new(p);
        self.procs.lock().unwrap().insert(p.info.pid, p.clone());
        p
    }

    /// The distinct OS threads that sampled any process, and their names.
    pub fn sampling_threads(&self) -> (HashSet<ThreadId>, HashSet<String>) {
        let mut ids = HashSet::new();
        let mut names = HashSet::new();
        for p in self.procs.lock().unwrap().values() {
            ids.extend(p.sample_threads.lock().unwrap().iter().copied());
            names.extend(p.sample_thread_names.lock().unwrap().iter().cloned());
        }
        (ids, names)
    }
}

pub struct FakeDiscovery(pub Arc<World>);

impl Discovery for FakeDiscovery {
    fn scan(&mut self) -> Vec<ProcessInfo> {
        self.0.scans.fetch_add(1, Ordering::SeqCst);
        let roles = self.0.roles.lock().unwrap().clone();
        self.0
            .procs
            .lock()
            .unwrap()
            .values()
            .filter(|p| p.listed.load(Ordering::SeqCst))
            .map(|p| {
                let mut info = p.info.clone();
                if let Some(&role) = roles.get(&info.pid) {
                    info.role = role;
                }
                info
            })
            .collect()
    }
}

pub struct FakeFactory(pub Arc<World>);

pub struct FakeSource {
    proc: Arc<FakeProc>,
    stats: SourceStats,
}

impl SourceFactory for FakeFactory {
    type Source = FakeSource;

    fn attach(&self, p: &ProcessInfo, needs_cpu_status: bool) -> Result<FakeSource, AttachFailure> {
        let proc = self
            .0
            .procs
            .lock()
            .unwrap()
            .get(&p.pid)
            .cloned()
            .ok_or_else(|| AttachFailure::Failed(format!("no such process {}", p.pid)))?;
        proc.attaches.lock().unwrap().push(Instant::now());
        proc.attach_thread_names.lock().unwrap().push(thread_name());
        proc.needs_cpu_status.lock().unwrap().push(needs_cpu_status);
        std::thread::sleep(proc.attach_delay);
        match proc.failures {
            Failures::Attach => return Err(AttachFailure::Failed("permission denied".to_string())),
            Failures::AttachEnded => return Err(AttachFailure::Ended("no maps".to_string())),
            _ => {}
        }
        Ok(FakeSource {
            proc,
            stats: SourceStats::default(),
        })
    }
}

impl StackSource for FakeSource {
    fn sample(&mut self, out: &mut Vec<SampledThread>) -> Result<SampleKind, SampleError> {
        let p = &self.proc;
        let call = p.calls.fetch_add(1, Ordering::SeqCst);
        let me = std::thread::current().id();
        if p.sample_threads.lock().unwrap().insert(me) {
            p.sample_thread_names.lock().unwrap().insert(thread_name());
        }
        self.stats.remote_reads += 1;
        match p.failures {
            Failures::Panic => panic!("fake source for pid {} panics", p.info.pid),
            Failures::PanicEvery(n) if call % n == n - 1 => {
                panic!(
                    "fake source for pid {} panics at call {}",
                    p.info.pid,
                    call + 1
                )
            }
            Failures::Always => return Err(read_error()),
            Failures::EveryOther if call & 1 == 0 => return Err(read_error()),
            _ => {}
        }
        if let Some((limit, after)) = p.limit {
            if p.ok_samples.load(Ordering::SeqCst) >= limit {
                return match after {
                    AfterLimit::Idle => Ok(SampleKind::Read),
                    AfterLimit::Gone { unlist } => {
                        if unlist {
                            p.listed.store(false, Ordering::SeqCst);
                        }
                        Err(SampleError {
                            kind: "gone",
                            process_gone: true,
                            message: "no such process".to_string(),
                        })
                    }
                };
            }
        }
        for (i, (status, stack)) in p.threads.iter().enumerate() {
            out.push(SampledThread {
                tid: i as u64 + 1,
                status: *status,
                stack: *stack,
                samples: 1,
            });
        }
        p.ok_samples.fetch_add(1, Ordering::SeqCst);
        self.stats.samples += 1;
        Ok(SampleKind::Read)
    }

    fn resolve(&self, stack: u64) -> Option<Vec<FrameInfo>> {
        *self.proc.resolves.lock().unwrap().entry(stack).or_default() += 1;
        Some(frames_of(stack))
    }

    fn stats(&self) -> SourceStats {
        self.stats
    }
}

impl Drop for FakeSource {
    fn drop(&mut self) {
        self.proc.drops.fetch_add(1, Ordering::SeqCst);
    }
}

fn read_error() -> SampleError {
    SampleError {
        kind: "read",
        process_gone: false,
        message: "fake read error".to_string(),
    }
}

#[derive(Clone, Default)]
pub struct FakeWriter {
    pub snaps: Arc<Mutex<Vec<Snapshot>>>,
    pub retention_runs: Arc<AtomicUsize>,
}

impl FakeWriter {
    pub fn snapshots(&self) -> Vec<Snapshot> {
        self.snaps.lock().unwrap().clone()
    }
}

impl SnapshotWriter for FakeWriter {
    fn write(&self, snap: &Snapshot) -> Result<PathBuf, String> {
        let mut snaps = self.snaps.lock().unwrap();
        snaps.push(snap.clone());
        Ok(PathBuf::from(format!("snapshot-{}", snaps.len())))
    }

    fn apply_retention(&self) {
        self.retention_runs.fetch_add(1, Ordering::SeqCst);
    }
}

/// Fast intervals; no rate adjustment and no periodic snapshot unless a test sets them.
pub fn fast_config() -> FleetConfig {
    FleetConfig {
        scan_interval: Duration::from_millis(50),
        snapshot_interval: Duration::from_secs(3600),
        ends_after: None,
        batch_interval: Duration::from_millis(50),
        rate_interval: Duration::from_secs(3600),
        mode: Mode::Wall,
        rate: RatePolicy::new(200.0, 100.0).unwrap(),
        restart: RestartPolicy {
            initial_backoff: Duration::from_millis(20),
            max_backoff: Duration::from_millis(200),
            multiplier: 2.0,
            jitter: 0.0,
            max_restarts: 3,
            window: Duration::from_secs(60),
        },
        max_consecutive_errors: 100,
        max_stacks_per_process: 1000,
        healthy_after: Duration::from_secs(10),
        stop_timeout: Duration::from_secs(5),
        sampling_threads: 1,
        push: None,
    }
}

pub struct Harness {
    pub world: Arc<World>,
    pub writer: FakeWriter,
    pub fleet: Fleet,
}

pub async fn start(config: FleetConfig, world: &Arc<World>) -> Harness {
    let writer = FakeWriter::default();
    let fleet = Fleet::start(
        config,
        FakeDiscovery(world.clone()),
        FakeFactory(world.clone()),
        writer.clone(),
    )
    .await
    .expect("fleet starts");
    Harness {
        world: world.clone(),
        writer,
        fleet,
    }
}

/// Generous bound for conditions that should hold within a fraction of a second.
pub const PATIENCE: Duration = Duration::from_secs(10);

/// Polls `cond` until it holds or `PATIENCE` runs out; returns whether it held.
pub async fn eventually(mut cond: impl FnMut() -> bool) -> bool {
    let deadline = Instant::now() + PATIENCE;
    while Instant::now() < deadline {
        if cond() {
            return true;
        }
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    cond()
}

/// Polls the fleet's status until `cond` holds; returns the status that satisfied it.
pub async fn status_when(
    fleet: &Fleet,
    mut cond: impl FnMut(&FleetStatus) -> bool,
) -> Option<FleetStatus> {
    let deadline = Instant::now() + PATIENCE;
    loop {
        let status = fleet.status().await.expect("supervisor answers");
        if cond(&status) {
            return Some(status);
        }
        if Instant::now() >= deadline {
            eprintln!("last status: {status:?}");
            return None;
        }
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
}

pub fn state_of(status: &FleetStatus, pid: i32) -> Option<ProcessState> {
    status
        .processes
        .iter()
        .find(|p| p.pid == pid)
        .map(|p| p.state)
}

/// Counts per (status, innermost function) of one process over all snapshots.
pub fn counts(snaps: &[Snapshot], pid: i32) -> BTreeMap<(ThreadStatus, String), u64> {
    let mut out = BTreeMap::new();
    for snap in snaps {
        for p in snap.processes.iter().filter(|p| p.pid == pid) {
            for (status, frames, n) in &p.samples {
                *out.entry((*status, frames[0].function.to_string()))
                    .or_default() += n;
            }
        }
    }
    out
}

pub fn total(snaps: &[Snapshot], pid: i32) -> u64 {
    counts(snaps, pid).values().sum()
}
