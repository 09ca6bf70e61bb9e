//! The kernel capture's program, loaded and fed: Python frame chains copied by the kernel at
//! the sampling interrupt (what a record holds, and the layout a chain is copied by:
//! `memory::capture_records`).
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
//! chain last sent as that thread left its CPU: [`CapturedRecord::unchanged`], told by a hash
//! of the chain before any copy; a changed chain is copied by a third program, which the
//! second reaches by a tail call through the `copy_programs` array this module fills) and keeps
//! when it is switched in again, which the thread's next record tells
//! ([`CapturedRecord::switched_in_ns`]: it comes within about one sampling period of the
//! thread's CPU time): each thread's time off its CPU and the stack it spent it in. A thread
//! not watched of a watched process ([`KernelCapture::watch_process`]) gets a record without
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
use crate::memory::capture_records::*;
use aya::maps::{Array, HashMap as BpfMap, MapData, PerCpuArray, ProgramArray, RingBuf};
use aya::programs::perf_event::{
    PerfEvent, PerfEventConfig, PerfEventScope, SamplePolicy, SoftwareEvent,
};
use aya::programs::RawTracePoint;
use aya::Ebpf;
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

static PROGRAM: &[u8] = aya::include_bytes_aligned!(concat!(env!("OUT_DIR"), "/capture.bpf.o"));

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
    /// The perf event's frequency: each interrupt's sample stands for `1 / rate_hz` s.
    rate_hz: u32,
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
        // bpf_task_pt_regs came with 5.15: before, waits for the GIL are told on 3.15 only.
        let syscall_regs = match off_cpu && host::kernel_version(&release) >= Some((5, 15)) {
            true => SYSCALL_REGS,
            false => None,
        };
        let mut ebpf = load(
            ring_bytes(cpus.len(), rate_hz),
            namespace,
            task_pid_at,
            syscall_regs,
        )?;
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
            let switched = raw_tracepoint(&mut ebpf, "capture_switched_out")?;
            switched.load().map_err(refused)?;
            // Its second part, reached by a tail call: loaded, set in the program array, not
            // attached.
            let copy = raw_tracepoint(&mut ebpf, "copy_switched_out")?;
            copy.load().map_err(refused)?;
            let copy_fd = copy
                .fd()
                .and_then(|fd| fd.try_clone().map_err(aya::programs::ProgramError::from))
                .map_err(|e| CaptureError::Load(e.to_string()))?;
            let mut copies: ProgramArray<_> = ebpf
                .map_mut("copy_programs")
                .ok_or_else(|| {
                    CaptureError::Load("map copy_programs missing from the object".into())
                })?
                .try_into()
                .map_err(|e: aya::maps::MapError| CaptureError::Load(e.to_string()))?;
            copies
                .set(0, &copy_fd, 0)
                .map_err(|e| CaptureError::Load(e.to_string()))?;
            let switched = raw_tracepoint(&mut ebpf, "capture_switched_out")?;
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
            rate_hz: rate_hz.max(1),
            _ebpf: ebpf,
        })
    }

    /// The rate it samples at, fixed at its start (the perf event's frequency).
    pub fn rate_hz(&self) -> u32 {
        self.rate_hz
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
        collector: CollectorAt,
    ) -> Result<(), CaptureError> {
        layout.check().map_err(CaptureError::Layout)?;
        let known = self.threads.get(&tid, 0).is_ok();
        if !known && self.watched >= MAX_WATCHED {
            return Err(CaptureError::Watch {
                tid,
                why: format!("at most {MAX_WATCHED} threads are watched"),
            });
        }
        let info = ThreadInfo::new(pid, tstate, layout, gil, collector);
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

/// Where `struct pt_regs` holds a task's system call number (`orig_ax`) and first argument
/// (`di`), and futex(2)'s number, on x86-64: what the switch program looks at to tell a
/// thread leaving its CPU to wait for the GIL (3.11-3.14; 3.15 says so in the thread state).
#[cfg(target_arch = "x86_64")]
const SYSCALL_REGS: Option<SyscallRegs> = Some(SyscallRegs {
    number_at: 15 * 8,
    arg0_at: 14 * 8,
    futex: libc::SYS_futex as u64,
});
#[cfg(not(target_arch = "x86_64"))]
const SYSCALL_REGS: Option<SyscallRegs> = None;

/// See [`SYSCALL_REGS`].
#[derive(Debug, Clone, Copy)]
struct SyscallRegs {
    number_at: u64,
    arg0_at: u64,
    futex: u64,
}

/// The object with the ring sized and, in a pid namespace not the host's, the namespace set
/// (`pidns_dev`, `pidns_ino`), its maps created. `syscall_regs`: where the switch program
/// finds a thread's system call (`None`: it does not look).
fn load(
    ring: u32,
    namespace: Option<PidNamespace>,
    task_pid_at: u64,
    syscall_regs: Option<SyscallRegs>,
) -> Result<Ebpf, CaptureError> {
    let (dev, inode) = namespace.map_or((0, 0), |ns| (ns.dev, ns.inode));
    let (number_at, arg0_at, futex) =
        syscall_regs.map_or((0, 0, 0), |r| (r.number_at, r.arg0_at, r.futex));
    let words = id_words();
    aya::EbpfLoader::new()
        .map_max_entries("records", ring)
        .map_max_entries("thread_bits", words)
        .map_max_entries("process_bits", words)
        .override_global("pidns_dev", &dev, true)
        .override_global("pidns_ino", &inode, true)
        .override_global("task_pid_at", &task_pid_at, true)
        .override_global("regs_syscall_at", &number_at, true)
        .override_global("regs_arg0_at", &arg0_at, true)
        .override_global("futex_nr", &futex, true)
        .load(PROGRAM)
        .map_err(|e| match os_error(&e) {
            Some(libc::EPERM | libc::EACCES) => not_permitted(&e),
            _ => CaptureError::Load(e.to_string()),
        })
}

/// The object's raw tracepoint program `name`.
fn raw_tracepoint<'a>(
    ebpf: &'a mut Ebpf,
    name: &str,
) -> Result<&'a mut RawTracePoint, CaptureError> {
    ebpf.program_mut(name)
        .ok_or_else(|| CaptureError::Load(format!("program {name} missing from the object")))?
        .try_into()
        .map_err(|e: aya::programs::ProgramError| CaptureError::Load(e.to_string()))
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

#[cfg(test)]
mod tests {
    use super::*;

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
}
