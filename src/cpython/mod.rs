//! CPython knowledge: versions, struct layouts, objects, and walking interpreters, threads and
//! frames of a live target.
//!
//! `attach` turns a pid into an [`Unwinder`]: it finds `_PyRuntime` (`binary`), reads the
//! version, and builds the target's [`Layout`] from `_Py_DebugOffsets` (3.13+) or the built-in
//! tables (3.11, 3.12). It must not write to the target.

pub mod asyncio;
pub mod debug_offsets;
pub mod instances;
pub mod layout;
pub mod linetable;
pub mod locals;
pub mod objects;
pub mod resolved;
pub mod tables;
pub mod threading_names;
pub mod unwinder;
pub mod versions;

#[cfg(test)]
mod image_tests;
#[cfg(any(test, fuzzing))]
pub mod synthetic;

pub use layout::{Layout, Version};
pub use objects::CodeInfo;
pub use resolved::{Frame, InterpreterStacks, InterpreterTasks, Task, ThreadStack};
pub use unwinder::{
    named_task, CapturedThread, SampleKind, TaskStack, ThreadSample, Unwinder, UnwinderOptions,
    UnwinderStats, GC_FILE, GC_FUNCTION, TASK_FILE,
};

use crate::binary::{self, BinaryError, RuntimeLocation};
use crate::memory::{FieldOutOfRange, MemoryError, ProcessMemory, RemoteMemory};
use crate::process::{Process, ProcessError};

/// Why a walk over target memory failed. Every variant is an expected outcome of reading a
/// live process (it changed or exited under us, or its memory is not what it should be).
#[derive(Debug, thiserror::Error)]
pub enum UnwindError {
    #[error(transparent)]
    Memory(#[from] MemoryError),
    #[error("target memory is inconsistent: {0}")]
    Field(#[from] FieldOutOfRange),
    #[error("cycle in the target's {0}")]
    Cycle(&'static str),
    #[error("the target's {0} is longer than {1} entries")]
    TooLong(&'static str, usize),
    #[error("object at {0:#x} is not a code object")]
    NotCode(u64),
    #[error("bad object at {addr:#x}: {what}")]
    BadObject { addr: u64, what: String },
    /// A thread's frames were not all in one read of it: read again, or count the sample
    /// failed; never splice bytes of two reads into one stack.
    #[error("the stack moved while it was read ({0})")]
    Moved(&'static str),
    /// More than pyfleet reads for one sample (bytes, objects): the rest waits for the next.
    #[error("over the sample's budget: {0}")]
    Budget(&'static str),
    /// A chain from the kernel capture that cannot be a whole stack.
    #[error("the kernel capture copied {0}")]
    Capture(&'static str),
}

impl UnwindError {
    /// True when the target exited: stop sampling it.
    pub fn is_process_gone(&self) -> bool {
        matches!(self, UnwindError::Memory(e) if e.is_process_gone())
    }

    /// The target's memory changed under the read (or the read went where a changed pointer
    /// led): reading again may succeed at once.
    pub fn is_torn(&self) -> bool {
        match self {
            UnwindError::Memory(MemoryError::BadAddress { .. }) => true,
            UnwindError::Memory(_) => false,
            _ => matches!(self.kind(), "inconsistent" | "cycle"),
        }
    }

    /// A short stable name for metrics and counters.
    pub fn kind(&self) -> &'static str {
        match self {
            UnwindError::Memory(MemoryError::ProcessGone(_)) => "process_gone",
            UnwindError::Memory(MemoryError::PermissionDenied(_)) => "permission",
            UnwindError::Memory(
                MemoryError::AlreadyTraced(_)
                | MemoryError::PauseTimeout { .. }
                | MemoryError::TooManyThreads { .. },
            ) => "pause",
            UnwindError::Memory(_) => "read",
            UnwindError::Field(_)
            | UnwindError::BadObject { .. }
            | UnwindError::NotCode(_)
            | UnwindError::Moved(_) => "inconsistent",
            UnwindError::Cycle(_) | UnwindError::TooLong(..) => "cycle",
            UnwindError::Budget(_) => "budget",
            UnwindError::Capture(_) => "capture",
        }
    }
}

/// Why pyfleet cannot profile a process at all.
#[derive(Debug, thiserror::Error)]
pub enum AttachError {
    #[error(transparent)]
    Process(#[from] ProcessError),
    #[error(transparent)]
    Binary(#[from] BinaryError),
    #[error(transparent)]
    Memory(#[from] MemoryError),
    #[error("unsupported Python version {0} (pyfleet supports {range})", range = versions::supported_range())]
    Unsupported(String),
    #[error("free-threaded Python builds are not supported yet (Python {0})")]
    FreeThreaded(String),
    #[error("cannot tell the Python version of process {0}")]
    UnknownVersion(i32),
    #[error("invalid _Py_DebugOffsets in the target: {0}")]
    BadDebugOffsets(String),
}

impl AttachError {
    /// Whether the target refused to be read (no permission): it may be Python all the same.
    pub fn is_permission_denied(&self) -> bool {
        match self {
            AttachError::Memory(e) => matches!(e, MemoryError::PermissionDenied(_)),
            AttachError::Process(e) => e.is_permission_denied(),
            AttachError::Binary(e) => e.is_permission_denied(),
            _ => false,
        }
    }
}

impl From<UnwindError> for AttachError {
    fn from(e: UnwindError) -> Self {
        match e {
            UnwindError::Memory(m) => AttachError::Memory(m),
            other => AttachError::BadDebugOffsets(other.to_string()),
        }
    }
}

/// The version of the target's CPython: `Py_Version` (3.11+), else the file name.
pub fn detect_version<M: RemoteMemory>(
    mem: &M,
    loc: &RuntimeLocation,
    pid: i32,
) -> Result<Version, AttachError> {
    if let Some(addr) = loc.py_version {
        let v = Version::from_hex(mem.read_u64(addr)?);
        if v.major == 3 {
            return Ok(v);
        }
    }
    match loc.name_version {
        Some((major, minor)) => Ok(Version::from_hex(
            (u64::from(major) << 24) | (u64::from(minor) << 16),
        )),
        None => Err(AttachError::UnknownVersion(pid)),
    }
}

/// The layout of the target's CPython.
pub fn detect_layout<M: RemoteMemory>(
    mem: &M,
    loc: &RuntimeLocation,
    pid: i32,
) -> Result<Layout, AttachError> {
    let version = detect_version(mem, loc, pid)?;
    let Some(supported) = versions::find(version) else {
        return Err(AttachError::Unsupported(format!(
            "{}.{}",
            version.major, version.minor
        )));
    };
    match supported.layout {
        versions::LayoutSource::BuiltIn(build) => Ok(build(version)),
        versions::LayoutSource::DebugOffsets(names) => {
            debug_offsets::layout(mem, loc.runtime, version, names)
        }
    }
}

/// Attaches to a live process: finds its runtime and layout (reading only) and returns its
/// unwinder. Only sampling with the 3.15 frame cache, and not `read_only`, ever writes.
pub fn attach(pid: i32, opts: UnwinderOptions) -> Result<Unwinder<ProcessMemory>, AttachError> {
    let process = Process::new(pid)?;
    let loc = binary::locate_runtime(&process)?;
    let mut mem = ProcessMemory::new(pid);
    let layout = detect_layout(&mem, &loc, pid)?;
    if opts.frame_cache && !opts.read_only && layout.tstate.frame_marker.is_some() {
        // Without the handle the marker is not used: sampling works as on 3.14.
        if let Err(e) = mem.bind_writes() {
            tracing::debug!(pid, "no frame-cache marker: {e}");
        }
    }
    Ok(Unwinder::new(pid, mem, layout, &loc, opts))
}
