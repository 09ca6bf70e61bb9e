//! The kernel capture: Python frame chains copied by the kernel at the sampling interrupt.
//!
//! `bpf/capture.bpf.c` (kept built as `bpf/capture.bpf.o`, embedded by `build.rs`) runs at every tick of a cpu-clock perf
//! event on each online CPU. When the interrupted thread is one this capture watches
//! ([`KernelCapture::watch`]: its thread state and where its current-frame pointer lies), it
//! copies the thread's frames as they are at that instant, newest first (each frame's address
//! and first [`FRAME_BYTES`] bytes, following `previous`, with a fingerprint of the code object
//! the frame names, read at the same instant), into a ring buffer this module drains
//! ([`KernelCapture::drain`]). The interrupted thread does not run while its frames are
//! copied: a record is one instant's chain, never a torn one. Threads on a CPU are captured
//! each in proportion to the CPU time it uses (a cpu-mode profile). Started for wall mode
//! (`off_cpu`), a second program at the scheduler's switch tracepoint copies a watched
//! thread's chain as it leaves its CPU ([`CapturedRecord::switched_out`]; none when it is the
//! chain last sent for that thread: [`CapturedRecord::unchanged`]) and keeps when it is
//! switched in again, which the thread's next record tells ([`CapturedRecord::switched_in_ns`]:
//! it comes within about one sampling period of the thread's CPU time): each thread's time
//! off its CPU and the stack it spent it in. A thread not
//! watched of a watched process ([`KernelCapture::watch_process`]) gets a record without
//! frames ([`CapturedRecord::unknown_thread`]) at each of its interrupts: a thread started
//! since its process was last read, or one that does not run Python.
//!
//! Contract: bounded by the program's constants (at most [`MAX_FRAMES`] frames a record,
//! deeper chains flagged [`CapturedRecord::truncated`]; [`MAX_WATCHED`] threads; a ring sized for
//! 200 ms of sampling at the rate, 1-16 MiB, whose overflow is counted by [`KernelCapture::lost`], never
//! blocking anything).
//! Nothing is written to any target. Needs CAP_BPF and CAP_PERFMON (or root) and Linux 5.8.
//! Threads and processes are named by the ids of pyfleet's own pid namespace.

use crate::host::kernel_types;
use crate::host::{self, PidNamespace};
use aya::maps::{Array, HashMap as BpfMap, MapData, PerCpuArray, RingBuf};
use aya::programs::perf_event::{
    PerfEvent, PerfEventConfig, PerfEventScope, SamplePolicy, SoftwareEvent,
};
use aya::programs::RawTracePoint;
use aya::{Ebpf, Pod};

/// Most frames one record holds (`MAX_FRAMES` in `bpf/capture.bpf.c`).
pub const MAX_FRAMES: usize = 256;
/// Bytes copied from the start of each frame (`FRAME_BYTES`): every field pyfleet reads of a
/// frame lies in the first 80 bytes on 3.11-3.15.
pub const FRAME_BYTES: usize = 80;
/// Most threads watched at once (`MAX_THREADS`).
pub const MAX_WATCHED: usize = 16384;
/// Most processes watched at once (`MAX_PROCESSES`).
pub const MAX_WATCHED_PROCESSES: usize = 16384;

/// Most words of the id bitmaps (`ID_WORDS`: ids below 2^22, Linux's largest pid_max).
const MAX_ID_WORDS: u32 = 65536;

/// Words of the id bitmaps for this host: every id below its pid_max.
fn id_words() -> u32 {
    let pid_max = std::fs::read_to_string("/proc/sys/kernel/pid_max")
        .ok()
        .and_then(|s| s.trim().parse::<u32>().ok())
        .unwrap_or(1 << 22);
    (pid_max / 64 + 1).min(MAX_ID_WORDS)
}

/// One bit per id (thread or process) in the program's array of words (`thread_bits`,
/// `process_bits`), mirrored here: set while the id is in the matching hash map. An id past
/// the array (pid_max raised since the start) is not in it, and the program then looks in the
/// hash map.
struct IdBits {
    map: Array<MapData, u64>,
    words: Vec<u64>,
}

impl IdBits {
    fn new(map: Array<MapData, u64>) -> IdBits {
        let words = vec![0; map.len() as usize];
        IdBits { map, words }
    }

    fn set(&mut self, id: u32, on: bool) -> Result<(), aya::maps::MapError> {
        let at = (id / 64) as usize;
        let Some(&old) = self.words.get(at) else {
            return Ok(());
        };
        let bit = 1u64 << (id % 64);
        let new = if on { old | bit } else { old & !bit };
        if new != old {
            self.map.set(at as u32, new, 0)?;
            self.words[at] = new;
        }
        Ok(())
    }
}

/// How long of sampling the ring holds, at the capture's rate on every CPU in 8 KiB records:
/// a drain later than this after the last loses samples.
const RING_HOLDS: std::time::Duration = std::time::Duration::from_millis(200);
/// A record's room in the ring's sizing: 24 bytes a record and 96 a frame, so an 85-frame
/// chain (the deepest 24 KiB; a 50-frame one 4.8 KiB).
const RING_RECORD_BYTES: u64 = 8 << 10;
const MIN_RING_BYTES: u64 = 1 << 20;
const MAX_RING_BYTES: u64 = 16 << 20;

// `struct record`'s head: where each field lies, and its size (the frames follow it).
const PID_AT: usize = 0;
const TID_AT: usize = 4;
const TIME_AT: usize = 8;
const FRAMES_AT: usize = 16;
const FLAGS_AT: usize = 18;
const SWITCHED_IN_AT: usize = 24;
const HEAD_BYTES: usize = 32;
// `struct frame_copy`: the frame's address, its code object's fingerprint, its first bytes.
const ADDR_AT: usize = 0;
const FINGERPRINT_AT: usize = 8;
const BYTES_AT: usize = 16;
const FRAME_COPY_BYTES: usize = BYTES_AT + FRAME_BYTES;
const NO_INDIRECTION: u64 = u64::MAX;
const FLAG_POINTER_UNREADABLE: u16 = 1;
const FLAG_FRAME_UNREADABLE: u16 = 2;
const FLAG_TRUNCATED: u16 = 4;
const FLAG_UNKNOWN_THREAD: u16 = 8;
const FLAG_SWITCHED_OUT: u16 = 16;
const FLAG_UNCHANGED: u16 = 64;
const FLAG_ENTERING: u16 = 128;
const FLAG_HOLDS_GIL: u16 = 256;

static PROGRAM: &[u8] = aya::include_bytes_aligned!(concat!(env!("OUT_DIR"), "/capture.bpf.o"));

/// Most bytes of a code object its fingerprint covers (`MAX_FINGERPRINT_BYTES`).
pub const MAX_FINGERPRINT_BYTES: u64 = 64;

/// What the program needs of a version's layout to copy a chain: where a thread's
/// current-frame pointer lies, from its thread state (the layout's `CurrentFrame`), where a
/// frame names its caller and its code object, and which bytes of a code object its
/// fingerprint covers.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CaptureLayout {
    /// Offset in the thread state of the current frame's address (3.13+), or of a pointer
    /// to the C frame holding it (3.11, 3.12: then `in_cframe` is that offset in it).
    pub first: u64,
    pub in_cframe: Option<u64>,
    /// Offset of `previous` in a frame (below [`FRAME_BYTES`] - 8).
    pub previous: u64,
    /// Offset of the code object's pointer in a frame (below [`FRAME_BYTES`] - 8), and the
    /// tag bits to clear from it.
    pub code: u64,
    /// Offset of the instruction pointer in a frame (below [`FRAME_BYTES`] - 8).
    pub instr: u64,
    /// 3.11, 3.12: offset in the thread state of its own C frame (see `CurrentFrame`).
    pub root_cframe: u64,
    pub code_tag_mask: u64,
    /// The fingerprint's bytes in a code object: `fingerprint_bytes` (a multiple of 8, at
    /// most [`MAX_FINGERPRINT_BYTES`]) at `fingerprint_at`.
    pub fingerprint_at: u64,
    pub fingerprint_bytes: u64,
    /// Offset in the thread state of its current data-stack chunk's address: the program
    /// reads the chunk below the top frame at once (none: frame by frame).
    pub chunk: Option<u64>,
}

/// Where the program finds whether a thread holds the GIL (gil mode), read with each chain.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum GilAt {
    /// Not asked (cpu and wall mode) or not known: every record says it does not.
    #[default]
    NotAsked,
    /// The thread's own `int`, nonzero while it holds the GIL (3.15+: `holds_gil`).
    OwnFlag(u64),
    /// The GIL's `locked` `int` and its holder's thread-state pointer: the thread holds it
    /// when it is locked and the holder is the thread's state.
    Holder { locked: u64, holder: u64 },
}

#[repr(C)]
#[derive(Debug, Clone, Copy)]
struct ThreadInfo {
    pid: u32,
    pad: u32,
    tstate: u64,
    first: u64,
    second: u64,
    previous: u64,
    code: u64,
    code_tag_mask: u64,
    fingerprint_at: u64,
    fingerprint_bytes: u64,
    /// The hash of the chain last sent for the thread (the program's; 0 when watched).
    last_chain: u64,
    instr: u64,
    root_cframe: u64,
    /// The GIL's `locked` word (0: not asked) and holder pointer (0: the word is the
    /// thread's own), see [`GilAt`].
    gil_locked: u64,
    gil_holder: u64,
    /// See [`CaptureLayout::chunk`] (0: none).
    chunk: u64,
    /// The program's: when the thread was last switched in (0 when watched).
    switched_in_at: u64,
}

// SAFETY: two u32 then fifteen u64 fields, `repr(C)`, no padding: every bit pattern is a valid value, which
// is what `Pod` asks of types copied to and from BPF maps.
unsafe impl Pod for ThreadInfo {}

/// The oldest kernel the capture runs on: the BPF ring buffer came with 5.8.
pub const MIN_KERNEL: (u32, u32) = (5, 8);

/// Why the capture could not start or watch a thread. The first four are why it cannot start
/// on this host at all, each with its remedy.
#[derive(Debug, thiserror::Error)]
pub enum CaptureError {
    #[error(
        "the kernel capture needs CAP_BPF and CAP_PERFMON (or root), which pyfleet does not hold"
    )]
    NoPrivilege,
    #[error("the kernel capture needs Linux {}.{} or later (this is {release})", MIN_KERNEL.0, MIN_KERNEL.1)]
    KernelTooOld { release: String },
    #[error(
        "the kernel denied the kernel capture though pyfleet holds CAP_BPF and CAP_PERFMON \
         ({0}): a seccomp filter without bpf and perf_event_open, a locked-memory limit too \
         low (Linux before 5.11), or the kernel's lockdown"
    )]
    Denied(String),
    #[error("the kernel's verifier refused the capture program: {0}")]
    VerifierRefused(String),
    #[error("cannot load the kernel capture program: {0}")]
    Load(String),
    #[error("cannot attach the kernel capture to CPU {cpu}: {why}")]
    Attach { cpu: u32, why: String },
    #[error("cannot watch thread {tid}: {why}")]
    Watch { tid: u32, why: String },
    #[error("cannot watch process {pid}: {why}")]
    WatchProcess { pid: u32, why: String },
    #[error("the frame layout does not fit the capture: {0}")]
    Layout(String),
    #[error(
        "the kernel capture cannot follow threads off their CPU here (wall and gil modes): {0}"
    )]
    OffCpu(&'static str),
}

impl CaptureError {
    /// A short, fixed name of the reason (for metrics labels and JSON).
    pub fn code(&self) -> &'static str {
        match self {
            CaptureError::NoPrivilege => "no_privilege",
            CaptureError::Denied(_) => "denied",
            CaptureError::KernelTooOld { .. } => "kernel_too_old",
            CaptureError::VerifierRefused(_) => "verifier_refused",
            CaptureError::Load(_) | CaptureError::Attach { .. } => "load_failed",
            CaptureError::Watch { .. }
            | CaptureError::WatchProcess { .. }
            | CaptureError::Layout(_) => "watch_failed",
            CaptureError::OffCpu(_) => "off_cpu_unavailable",
        }
    }
}

/// The loaded program, its events and maps. Dropping it detaches everything.
pub struct KernelCapture {
    /// The pid namespace whose ids the program gives, when not the host's.
    namespace: Option<PidNamespace>,
    /// Ring records too short for what their head says (never expected: counted, not read).
    unparsable: u64,
    threads: BpfMap<MapData, u32, ThreadInfo>,
    processes: BpfMap<MapData, u32, u32>,
    thread_bits: IdBits,
    process_bits: IdBits,
    ring: RingBuf<MapData>,
    lost: PerCpuArray<MapData, u64>,
    watched: usize,
    watched_processes: usize,
    /// Owns the program and its perf events (detached when dropped).
    _ebpf: Ebpf,
}

impl KernelCapture {
    /// Loads the program and attaches it to a cpu-clock event at `rate_hz` on every online
    /// CPU, and with `off_cpu` to the scheduler's switch tracepoint. Threads and processes
    /// are known by the ids of pyfleet's own pid namespace: the host's, or else the one
    /// pyfleet runs in (a thread of a process outside it is never captured; see
    /// [`KernelCapture::namespace`]).
    pub fn start(rate_hz: u32, off_cpu: bool) -> Result<KernelCapture, CaptureError> {
        let release = host::kernel_release().unwrap_or_default();
        if host::kernel_version(&release).is_some_and(|v| v < MIN_KERNEL) {
            return Err(CaptureError::KernelTooOld { release });
        }
        if host::may_use_bpf_tracing() == Some(false) {
            return Err(CaptureError::NoPrivilege);
        }
        let namespace = PidNamespace::own().filter(|ns| !ns.is_host());
        // Off the CPU, a switch-in names the thread by the task's `pid`: the host's id.
        let task_pid_at = match (off_cpu, namespace) {
            (false, _) => 0,
            (true, Some(_)) => {
                return Err(CaptureError::OffCpu(
                    "pyfleet runs in a pid namespace not the host's",
                ))
            }
            (true, None) => kernel_types::field_offset("task_struct", "pid")
                .filter(|&at| at > 0 && at < 65536)
                .ok_or(CaptureError::OffCpu(
                    "the kernel's BTF (/sys/kernel/btf/vmlinux) does not say where a task's id is",
                ))?,
        };
        let cpus = aya::util::online_cpus()
            .map_err(|(what, e)| CaptureError::Load(format!("{what}: {e}")))?;
        let mut ebpf = load(ring_bytes(cpus.len(), rate_hz), namespace, task_pid_at)?;
        let program: &mut PerfEvent = ebpf
            .program_mut("capture_python_frames")
            .ok_or_else(|| CaptureError::Load("program missing from the object".into()))?
            .try_into()
            .map_err(|e: aya::programs::ProgramError| CaptureError::Load(e.to_string()))?;
        program.load().map_err(refused)?;
        for cpu in cpus {
            program
                .attach(
                    PerfEventConfig::Software(SoftwareEvent::CpuClock),
                    PerfEventScope::AllProcessesOneCpu { cpu },
                    SamplePolicy::Frequency(u64::from(rate_hz.max(1))),
                    false,
                )
                .map_err(|e| match os_error(&e) {
                    Some(libc::EPERM | libc::EACCES) => not_permitted(&e),
                    _ => CaptureError::Attach {
                        cpu,
                        why: e.to_string(),
                    },
                })?;
        }
        if off_cpu {
            let switched: &mut RawTracePoint = ebpf
                .program_mut("capture_switched_out")
                .ok_or_else(|| CaptureError::Load("program missing from the object".into()))?
                .try_into()
                .map_err(|e: aya::programs::ProgramError| CaptureError::Load(e.to_string()))?;
            switched.load().map_err(refused)?;
            switched
                .attach("sched_switch")
                .map_err(|e| match os_error(&e) {
                    Some(libc::EPERM | libc::EACCES) => not_permitted(&e),
                    _ => CaptureError::Load(format!("the scheduler's switch tracepoint: {e}")),
                })?;
        }
        let mut map = |name: &str| {
            ebpf.take_map(name)
                .ok_or_else(|| CaptureError::Load(format!("map {name} missing from the object")))
        };
        let threads =
            BpfMap::try_from(map("threads")?).map_err(|e| CaptureError::Load(e.to_string()))?;
        let processes =
            BpfMap::try_from(map("processes")?).map_err(|e| CaptureError::Load(e.to_string()))?;
        let mut bits = |name: &str| -> Result<IdBits, CaptureError> {
            let array =
                Array::try_from(map(name)?).map_err(|e| CaptureError::Load(e.to_string()))?;
            Ok(IdBits::new(array))
        };
        let thread_bits = bits("thread_bits")?;
        let process_bits = bits("process_bits")?;
        let ring =
            RingBuf::try_from(map("records")?).map_err(|e| CaptureError::Load(e.to_string()))?;
        let lost =
            PerCpuArray::try_from(map("lost")?).map_err(|e| CaptureError::Load(e.to_string()))?;
        Ok(KernelCapture {
            namespace,
            unparsable: 0,
            threads,
            processes,
            thread_bits,
            process_bits,
            ring,
            lost,
            watched: 0,
            watched_processes: 0,
            _ebpf: ebpf,
        })
    }

    /// The pid namespace whose ids the capture knows threads by, when it is not the host's
    /// (pyfleet runs in a container or under `unshare -p`): processes in other namespaces,
    /// nested ones included, cannot be captured.
    pub fn namespace(&self) -> Option<PidNamespace> {
        self.namespace
    }

    /// Tells of every thread of process `pid` (pyfleet's id) that runs unwatched, from now
    /// on (records flagged [`CapturedRecord::unknown_thread`]).
    pub fn watch_process(&mut self, pid: u32) -> Result<(), CaptureError> {
        if self.processes.get(&pid, 0).is_ok() {
            return Ok(());
        }
        if self.watched_processes >= MAX_WATCHED_PROCESSES {
            return Err(CaptureError::WatchProcess {
                pid,
                why: format!("at most {MAX_WATCHED_PROCESSES} processes are watched"),
            });
        }
        let why = |e: aya::maps::MapError| CaptureError::WatchProcess {
            pid,
            why: e.to_string(),
        };
        self.processes.insert(pid, 0, 0).map_err(why)?;
        self.watched_processes += 1;
        self.process_bits.set(pid, true).map_err(why)?;
        Ok(())
    }

    /// Stops telling of process `pid`'s unwatched threads (its watched threads stay watched
    /// until [`unwatch`](Self::unwatch)ed).
    pub fn unwatch_process(&mut self, pid: u32) {
        if self.processes.remove(&pid).is_ok() {
            self.watched_processes = self.watched_processes.saturating_sub(1);
        }
        // Nothing more to undo if it fails: the program then finds the id not in the map.
        let _ = self.process_bits.set(pid, false);
    }

    /// Captures thread `tid` of process `pid` (pyfleet's ids) from now on, its chain copied
    /// from its thread state at `tstate` as `layout` says, and whether it holds the GIL from
    /// `gil`. Watching a watched thread again updates it.
    pub fn watch(
        &mut self,
        pid: u32,
        tid: u32,
        tstate: u64,
        layout: CaptureLayout,
        gil: GilAt,
    ) -> Result<(), CaptureError> {
        layout.check()?;
        let known = self.threads.get(&tid, 0).is_ok();
        if !known && self.watched >= MAX_WATCHED {
            return Err(CaptureError::Watch {
                tid,
                why: format!("at most {MAX_WATCHED} threads are watched"),
            });
        }
        let info = ThreadInfo {
            pid,
            pad: 0,
            tstate,
            first: layout.first,
            second: layout.in_cframe.unwrap_or(NO_INDIRECTION),
            previous: layout.previous,
            code: layout.code,
            code_tag_mask: layout.code_tag_mask,
            fingerprint_at: layout.fingerprint_at,
            fingerprint_bytes: layout.fingerprint_bytes,
            last_chain: 0,
            instr: layout.instr,
            root_cframe: layout.root_cframe,
            gil_locked: match gil {
                GilAt::NotAsked => 0,
                GilAt::OwnFlag(at) | GilAt::Holder { locked: at, .. } => at,
            },
            gil_holder: match gil {
                GilAt::Holder { holder, .. } => holder,
                _ => 0,
            },
            chunk: layout.chunk.unwrap_or(0),
            switched_in_at: 0,
        };
        let why = |e: aya::maps::MapError| CaptureError::Watch {
            tid,
            why: e.to_string(),
        };
        self.threads.insert(tid, info, 0).map_err(why)?;
        if !known {
            self.watched += 1;
        }
        self.thread_bits.set(tid, true).map_err(why)
    }

    /// Stops capturing thread `tid` (nothing if it was not watched).
    pub fn unwatch(&mut self, tid: u32) {
        if self.threads.remove(&tid).is_ok() {
            self.watched = self.watched.saturating_sub(1);
        }
        let _ = self.thread_bits.set(tid, false);
    }

    /// Hands every record captured since the last drain to `f`, oldest first.
    pub fn drain(&mut self, mut f: impl FnMut(CapturedRecord<'_>)) {
        while let Some(item) = self.ring.next() {
            match CapturedRecord::parse(&item) {
                Some(r) => f(r),
                None => self.unparsable += 1,
            }
        }
    }

    /// Records of the ring that did not parse, since the start.
    pub fn unparsable(&self) -> u64 {
        self.unparsable
    }

    /// Samples the ring had no room for, since the start (summed over CPUs).
    pub fn lost(&self) -> u64 {
        self.lost
            .get(&0, 0)
            .map(|per_cpu| per_cpu.iter().sum())
            .unwrap_or(0)
    }
}

impl CaptureLayout {
    /// That the program can follow this layout (it checks again, and reads nothing where a
    /// value is out of its bounds).
    fn check(&self) -> Result<(), CaptureError> {
        let in_frame = (FRAME_BYTES - 8) as u64;
        if self.previous > in_frame || self.code > in_frame || self.instr > in_frame {
            return Err(CaptureError::Layout(format!(
                "`previous` at {}, the code object at {} or the instruction pointer at {}, \
                 past the {FRAME_BYTES} bytes copied of a frame",
                self.previous, self.code, self.instr
            )));
        }
        if self.fingerprint_bytes == 0
            || self.fingerprint_bytes % 8 != 0
            || self.fingerprint_bytes > MAX_FINGERPRINT_BYTES
        {
            return Err(CaptureError::Layout(format!(
                "a code object's fingerprint of {} bytes (whole words, at most \
                 {MAX_FINGERPRINT_BYTES})",
                self.fingerprint_bytes
            )));
        }
        Ok(())
    }
}

/// The ring's size for `cpus` CPUs sampled at `rate_hz`: [`RING_HOLDS`] of records on every
/// CPU, as a power of two (as the kernel requires), within [`MIN_RING_BYTES`] and
/// [`MAX_RING_BYTES`].
fn ring_bytes(cpus: usize, rate_hz: u32) -> u32 {
    let records_per_cpu = (u64::from(rate_hz) * RING_HOLDS.as_millis() as u64).div_ceil(1000);
    let want = (cpus.max(1) as u64)
        .saturating_mul(records_per_cpu)
        .saturating_mul(RING_RECORD_BYTES);
    want.next_power_of_two()
        .clamp(MIN_RING_BYTES, MAX_RING_BYTES)
        .try_into()
        .unwrap_or(MAX_RING_BYTES as u32)
}

/// The object with the ring sized and, in a pid namespace not the host's, the namespace set
/// (`pidns_dev`, `pidns_ino`), its maps created.
fn load(
    ring: u32,
    namespace: Option<PidNamespace>,
    task_pid_at: u64,
) -> Result<Ebpf, CaptureError> {
    let (dev, inode) = namespace.map_or((0, 0), |ns| (ns.dev, ns.inode));
    let words = id_words();
    aya::EbpfLoader::new()
        .map_max_entries("records", ring)
        .map_max_entries("thread_bits", words)
        .map_max_entries("process_bits", words)
        .override_global("pidns_dev", &dev, true)
        .override_global("pidns_ino", &inode, true)
        .override_global("task_pid_at", &task_pid_at, true)
        .load(PROGRAM)
        .map_err(|e| match os_error(&e) {
            Some(libc::EPERM | libc::EACCES) => not_permitted(&e),
            _ => CaptureError::Load(e.to_string()),
        })
}

/// Why loading the program failed: the verifier's own words when it refused it.
fn refused(e: aya::programs::ProgramError) -> CaptureError {
    if let aya::programs::ProgramError::LoadError { verifier_log, .. } = &e {
        let log = verifier_log.to_string();
        // The verifier's last lines say what it refused; the lines before trace its walk.
        let why = log.lines().rev().map(str::trim).find(|l| {
            !l.is_empty()
                && !l.starts_with("processed ")
                && !l.starts_with("verification time")
                && !l.starts_with("stack depth")
        });
        if let Some(why) = why {
            return CaptureError::VerifierRefused(why.chars().take(200).collect());
        }
    }
    match os_error(&e) {
        Some(libc::EPERM) => not_permitted(&e),
        _ => CaptureError::Load(e.to_string()),
    }
}

/// The kernel said "not permitted": pyfleet lacks the capabilities, or holds them and
/// something else refused (seccomp, the locked-memory limit, lockdown).
fn not_permitted(e: &dyn std::error::Error) -> CaptureError {
    match host::may_use_bpf_tracing() {
        Some(true) => CaptureError::Denied(e.to_string()),
        _ => CaptureError::NoPrivilege,
    }
}

/// The OS error number somewhere in an error's chain of sources.
fn os_error(e: &(dyn std::error::Error + 'static)) -> Option<i32> {
    let mut next = Some(e);
    while let Some(err) = next {
        if let Some(code) = err
            .downcast_ref::<std::io::Error>()
            .and_then(std::io::Error::raw_os_error)
        {
            return Some(code);
        }
        next = err.source();
    }
    None
}

/// The frames of a record's [`CapturedRecord::frame_bytes`], newest first.
pub fn frames_in(bytes: &[u8]) -> impl Iterator<Item = CapturedFrame<'_>> + '_ {
    bytes.chunks_exact(FRAME_COPY_BYTES).map(|c| {
        let word = |at: usize| {
            let mut w = [0u8; 8];
            w.copy_from_slice(&c[at..at + 8]);
            u64::from_le_bytes(w)
        };
        CapturedFrame {
            addr: word(ADDR_AT),
            code_fingerprint: word(FINGERPRINT_AT),
            bytes: &c[BYTES_AT..],
        }
    })
}

/// One frame of a record.
#[derive(Debug, Clone, Copy)]
pub struct CapturedFrame<'a> {
    pub addr: u64,
    /// The fingerprint of the code object the frame named at the interrupt (over
    /// [`CaptureLayout`]'s bytes, as `cpython::objects::fingerprint` computes it); 0 when the
    /// frame names none or its bytes could not be read without a page fault.
    pub code_fingerprint: u64,
    /// Its first [`FRAME_BYTES`] bytes.
    pub bytes: &'a [u8],
}

/// One record of the ring: a thread's frame chain at one interrupt.
#[derive(Debug, Clone, Copy)]
pub struct CapturedRecord<'a> {
    pub pid: u32,
    pub tid: u32,
    /// `CLOCK_MONOTONIC` nanoseconds of the interrupt.
    pub time_ns: u64,
    flags: u16,
    switched_in_ns: u64,
    frames: &'a [u8],
}

impl<'a> CapturedRecord<'a> {
    /// A record as the ring holds it (`struct record` of the program, with only the frames it
    /// holds); `None` when it is shorter than its head says.
    pub fn parse(bytes: &'a [u8]) -> Option<CapturedRecord<'a>> {
        let head = bytes.get(..HEAD_BYTES)?;
        let u32_at = |o: usize| Some(u32::from_le_bytes(head.get(o..o + 4)?.try_into().ok()?));
        let u16_at = |o: usize| Some(u16::from_le_bytes(head.get(o..o + 2)?.try_into().ok()?));
        let n = usize::from(u16_at(FRAMES_AT)?).min(MAX_FRAMES);
        let frames = bytes.get(HEAD_BYTES..HEAD_BYTES + n * FRAME_COPY_BYTES)?;
        Some(CapturedRecord {
            pid: u32_at(PID_AT)?,
            tid: u32_at(TID_AT)?,
            time_ns: u64::from_le_bytes(head.get(TIME_AT..TIME_AT + 8)?.try_into().ok()?),
            flags: u16_at(FLAGS_AT)?,
            switched_in_ns: u64::from_le_bytes(
                head.get(SWITCHED_IN_AT..SWITCHED_IN_AT + 8)?
                    .try_into()
                    .ok()?,
            ),
            frames,
        })
    }

    /// The frames, newest first.
    pub fn frames(&self) -> impl Iterator<Item = CapturedFrame<'a>> + 'a {
        frames_in(self.frames)
    }

    /// The frames as the ring holds them (for [`frames_in`] once copied out).
    pub fn frame_bytes(&self) -> &'a [u8] {
        self.frames
    }

    /// A thread of a watched process that is not watched itself: no frames (see the module
    /// documentation).
    pub fn unknown_thread(&self) -> bool {
        self.flags & FLAG_UNKNOWN_THREAD != 0
    }

    /// Copied as the thread left its CPU (its stack until it runs again), not at an
    /// interrupt.
    pub fn switched_out(&self) -> bool {
        self.flags & FLAG_SWITCHED_OUT != 0
    }

    /// Switched out with the chain last sent for the thread: no frames, the stack is that
    /// chain's.
    pub fn unchanged(&self) -> bool {
        self.flags & FLAG_UNCHANGED != 0
    }

    /// When the thread was last switched in (`CLOCK_MONOTONIC` nanoseconds; 0: not known,
    /// the capture not following threads off their CPU, or not since it was watched).
    pub fn switched_in_ns(&self) -> u64 {
        self.switched_in_ns
    }

    /// The thread held the GIL (as of the record; always false unless it was watched with
    /// [`GilAt`] other than `NotAsked`).
    pub fn holds_gil(&self) -> bool {
        self.flags & FLAG_HOLDS_GIL != 0
    }

    /// The chain is deeper than [`MAX_FRAMES`]: the oldest frames are missing.
    pub fn truncated(&self) -> bool {
        self.flags & FLAG_TRUNCATED != 0
    }

    /// Why the kernel could not copy the chain, if it could not: the pointer to the current
    /// frame or a frame was not readable without a page fault at the interrupt.
    pub fn unreadable(&self) -> Option<&'static str> {
        if self.flags & FLAG_POINTER_UNREADABLE != 0 {
            Some("the current-frame pointer was not resident at the interrupt")
        } else if self.flags & FLAG_FRAME_UNREADABLE != 0 {
            Some("a frame was not resident at the interrupt")
        } else if self.flags & FLAG_ENTERING != 0 {
            Some("an eval loop was being entered at the interrupt (its current frame not set)")
        } else {
            None
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn record(pid: u32, tid: u32, flags: u16, frames: &[(u64, u8)]) -> Vec<u8> {
        let mut v = Vec::new();
        v.extend(pid.to_le_bytes());
        v.extend(tid.to_le_bytes());
        v.extend(7u64.to_le_bytes());
        v.extend((frames.len() as u16).to_le_bytes());
        v.extend(flags.to_le_bytes());
        v.extend(0u32.to_le_bytes());
        v.extend(5u64.to_le_bytes());
        for &(addr, fill) in frames {
            v.extend(addr.to_le_bytes());
            v.extend((addr + 1).to_le_bytes());
            v.extend([fill; FRAME_BYTES]);
        }
        v
    }

    /// The program's constants and struct layouts, as a host C compiler lays out
    /// `bpf/capture.bpf.c` (the same LP64 rules as the BPF target): `NAME VALUE` lines.
    fn program_layout() -> std::collections::HashMap<String, u64> {
        let dir = std::env::temp_dir().join(format!("pyfleet-layout-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let source = concat!(env!("CARGO_MANIFEST_DIR"), "/bpf/capture.bpf.c");
        let probe = dir.join("layout.c");
        let mut c = format!("#include <stdio.h>\n#include <stddef.h>\n#include \"{source}\"\n");
        c.push_str("#define SHOW(name, v) printf(\"%s %llu\\n\", name, (unsigned long long)(v))\n");
        c.push_str("#define AT(s, f) SHOW(#s \".\" #f, offsetof(struct s, f))\n");
        c.push_str("#define SIZE(s) SHOW(#s, sizeof(struct s))\n");
        c.push_str("#define CONST(n) SHOW(#n, n)\nint main(void) {\n");
        for line in [
            "CONST(MAX_FRAMES); CONST(FRAME_BYTES); CONST(MAX_FINGERPRINT_BYTES);",
            "CONST(MAX_THREADS); CONST(MAX_PROCESSES); CONST(NO_INDIRECTION);",
            "CONST(FLAG_POINTER_UNREADABLE); CONST(FLAG_FRAME_UNREADABLE);",
            "CONST(FLAG_TRUNCATED); CONST(FLAG_UNKNOWN_THREAD); CONST(FLAG_SWITCHED_OUT);",
            "CONST(FLAG_UNCHANGED); CONST(FLAG_ENTERING);",
            "CONST(FLAG_HOLDS_GIL);",
            "AT(record, pid); AT(record, tid); AT(record, time); AT(record, frames);",
            "AT(record, flags); AT(record, switched_in); AT(record, frame);",
            "AT(thread_info, switched_in_at);",
            "AT(frame_copy, addr); AT(frame_copy, code_fingerprint); AT(frame_copy, bytes);",
            "SIZE(frame_copy); SIZE(thread_info);",
            "AT(thread_info, pid); AT(thread_info, tstate); AT(thread_info, first);",
            "AT(thread_info, second); AT(thread_info, previous); AT(thread_info, code);",
            "AT(thread_info, code_tag_mask); AT(thread_info, fingerprint_at);",
            "AT(thread_info, fingerprint_bytes); AT(thread_info, last_chain);",
            "AT(thread_info, instr); AT(thread_info, root_cframe);",
            "AT(thread_info, gil_locked); AT(thread_info, gil_holder);",
            "AT(thread_info, chunk); CONST(CHUNK_HEAD);",
        ] {
            c.push_str(line);
            c.push('\n');
        }
        c.push_str("return 0; }\n");
        std::fs::write(&probe, c).unwrap();
        let exe = dir.join("layout");
        let built = std::process::Command::new("cc")
            .arg("-w")
            .arg(&probe)
            .arg("-o")
            .arg(&exe)
            .output()
            .expect("cc (the host C compiler) runs");
        assert!(
            built.status.success(),
            "{}",
            String::from_utf8_lossy(&built.stderr)
        );
        let out = std::process::Command::new(&exe).output().unwrap();
        let _ = std::fs::remove_dir_all(&dir);
        String::from_utf8(out.stdout)
            .unwrap()
            .lines()
            .map(|l| {
                let (name, v) = l.split_once(' ').unwrap();
                (name.to_string(), v.parse().unwrap())
            })
            .collect()
    }

    #[test]
    fn the_program_and_the_decoder_agree_on_layouts_and_constants() {
        let c = program_layout();
        let rust: &[(&str, u64)] = &[
            ("MAX_FRAMES", MAX_FRAMES as u64),
            ("FRAME_BYTES", FRAME_BYTES as u64),
            ("MAX_FINGERPRINT_BYTES", MAX_FINGERPRINT_BYTES),
            ("MAX_THREADS", MAX_WATCHED as u64),
            ("MAX_PROCESSES", MAX_WATCHED_PROCESSES as u64),
            ("NO_INDIRECTION", NO_INDIRECTION),
            (
                "FLAG_POINTER_UNREADABLE",
                u64::from(FLAG_POINTER_UNREADABLE),
            ),
            ("FLAG_FRAME_UNREADABLE", u64::from(FLAG_FRAME_UNREADABLE)),
            ("FLAG_TRUNCATED", u64::from(FLAG_TRUNCATED)),
            ("FLAG_UNKNOWN_THREAD", u64::from(FLAG_UNKNOWN_THREAD)),
            ("FLAG_SWITCHED_OUT", u64::from(FLAG_SWITCHED_OUT)),
            ("FLAG_UNCHANGED", u64::from(FLAG_UNCHANGED)),
            ("FLAG_ENTERING", u64::from(FLAG_ENTERING)),
            ("FLAG_HOLDS_GIL", u64::from(FLAG_HOLDS_GIL)),
            ("record.pid", PID_AT as u64),
            ("record.tid", TID_AT as u64),
            ("record.time", TIME_AT as u64),
            ("record.frames", FRAMES_AT as u64),
            ("record.flags", FLAGS_AT as u64),
            ("record.switched_in", SWITCHED_IN_AT as u64),
            ("record.frame", HEAD_BYTES as u64),
            ("frame_copy.addr", ADDR_AT as u64),
            ("frame_copy.code_fingerprint", FINGERPRINT_AT as u64),
            ("frame_copy.bytes", BYTES_AT as u64),
            ("frame_copy", FRAME_COPY_BYTES as u64),
            ("thread_info", std::mem::size_of::<ThreadInfo>() as u64),
            (
                "thread_info.pid",
                std::mem::offset_of!(ThreadInfo, pid) as u64,
            ),
            (
                "thread_info.tstate",
                std::mem::offset_of!(ThreadInfo, tstate) as u64,
            ),
            (
                "thread_info.first",
                std::mem::offset_of!(ThreadInfo, first) as u64,
            ),
            (
                "thread_info.second",
                std::mem::offset_of!(ThreadInfo, second) as u64,
            ),
            (
                "thread_info.previous",
                std::mem::offset_of!(ThreadInfo, previous) as u64,
            ),
            (
                "thread_info.code",
                std::mem::offset_of!(ThreadInfo, code) as u64,
            ),
            (
                "thread_info.code_tag_mask",
                std::mem::offset_of!(ThreadInfo, code_tag_mask) as u64,
            ),
            (
                "thread_info.fingerprint_at",
                std::mem::offset_of!(ThreadInfo, fingerprint_at) as u64,
            ),
            (
                "thread_info.fingerprint_bytes",
                std::mem::offset_of!(ThreadInfo, fingerprint_bytes) as u64,
            ),
            (
                "thread_info.last_chain",
                std::mem::offset_of!(ThreadInfo, last_chain) as u64,
            ),
            (
                "thread_info.instr",
                std::mem::offset_of!(ThreadInfo, instr) as u64,
            ),
            (
                "thread_info.root_cframe",
                std::mem::offset_of!(ThreadInfo, root_cframe) as u64,
            ),
            (
                "thread_info.gil_locked",
                std::mem::offset_of!(ThreadInfo, gil_locked) as u64,
            ),
            (
                "thread_info.gil_holder",
                std::mem::offset_of!(ThreadInfo, gil_holder) as u64,
            ),
            (
                "thread_info.chunk",
                std::mem::offset_of!(ThreadInfo, chunk) as u64,
            ),
            (
                "thread_info.switched_in_at",
                std::mem::offset_of!(ThreadInfo, switched_in_at) as u64,
            ),
            ("CHUNK_HEAD", crate::cpython::layout::CHUNK_DATA),
        ];
        for (name, value) in rust {
            assert_eq!(
                c.get(*name),
                Some(value),
                "{name}: C says {:?}",
                c.get(*name)
            );
        }
        assert_eq!(
            c.len(),
            rust.len(),
            "a constant of the probe is not compared"
        );
    }

    #[test]
    fn records_parse_into_their_frames() {
        let bytes = record(10, 11, FLAG_TRUNCATED, &[(0x1000, 1), (0x2000, 2)]);
        let r = CapturedRecord::parse(&bytes).expect("parses");
        assert_eq!(
            (r.pid, r.tid, r.time_ns, r.switched_in_ns()),
            (10, 11, 7, 5)
        );
        assert!(r.truncated());
        assert_eq!(r.unreadable(), None);
        let frames: Vec<_> = r.frames().collect();
        assert_eq!(frames.len(), 2);
        assert_eq!(frames[1].addr, 0x2000);
        assert_eq!(frames[1].code_fingerprint, 0x2001);
        assert_eq!(frames[1].bytes.len(), FRAME_BYTES);
        assert!(frames[1].bytes.iter().all(|&b| b == 2));
    }

    #[test]
    fn a_layout_past_what_the_program_copies_is_refused() {
        let fits = CaptureLayout {
            first: 16,
            in_cframe: None,
            previous: 0,
            code: FRAME_BYTES as u64 - 8,
            instr: 56,
            root_cframe: 0,
            code_tag_mask: 1,
            fingerprint_at: 96,
            fingerprint_bytes: 32,
            chunk: Some(200),
        };
        assert!(fits.check().is_ok());
        let refused = [
            CaptureLayout {
                previous: FRAME_BYTES as u64 - 7,
                ..fits
            },
            CaptureLayout {
                code: FRAME_BYTES as u64,
                ..fits
            },
            CaptureLayout {
                instr: FRAME_BYTES as u64,
                ..fits
            },
            CaptureLayout {
                fingerprint_bytes: 0,
                ..fits
            },
            CaptureLayout {
                fingerprint_bytes: 20,
                ..fits
            },
            CaptureLayout {
                fingerprint_bytes: MAX_FINGERPRINT_BYTES + 8,
                ..fits
            },
        ];
        for layout in refused {
            assert!(
                matches!(layout.check(), Err(CaptureError::Layout(_))),
                "{layout:?}"
            );
        }
    }

    #[test]
    fn the_ring_grows_with_the_cpus_and_the_rate_within_its_bounds() {
        assert_eq!(ring_bytes(0, 100), 1 << 20);
        assert_eq!(ring_bytes(2, 0), 1 << 20);
        assert_eq!(ring_bytes(2, 100), 1 << 20);
        // 2 CPUs x 200 records x 8 KiB: 3.2 MB.
        assert_eq!(ring_bytes(2, 1000), 4 << 20);
        assert_eq!(ring_bytes(4, 1000), 8 << 20);
        assert_eq!(ring_bytes(8, 1000), 16 << 20);
        assert_eq!(ring_bytes(4096, 100), 16 << 20);
    }

    #[test]
    fn a_short_record_is_refused_not_read_past() {
        let bytes = record(1, 2, FLAG_FRAME_UNREADABLE, &[(0x1000, 1), (0x2000, 2)]);
        assert!(CapturedRecord::parse(&bytes[..bytes.len() - 1]).is_none());
        assert!(CapturedRecord::parse(&bytes[..10]).is_none());
        let r = CapturedRecord::parse(&bytes).expect("parses");
        assert!(r.unreadable().is_some());
    }

    #[test]
    fn a_record_of_a_thread_not_watched_has_no_frames_and_says_so() {
        let bytes = record(1, 3, FLAG_UNKNOWN_THREAD, &[]);
        let r = CapturedRecord::parse(&bytes).expect("parses");
        assert!(r.unknown_thread());
        assert_eq!((r.pid, r.tid, r.frames().count()), (1, 3, 0));
        assert!(r.unreadable().is_none() && !r.truncated());
        let chain = record(1, 2, 0, &[(0x1000, 1)]);
        assert!(!CapturedRecord::parse(&chain)
            .expect("parses")
            .unknown_thread());
    }
}
