//! Reading (and, narrowly, writing) another process's memory.
//!
//! This module owns the [`RemoteMemory`] trait and its two implementations:
//! [`ProcessMemory`] (`process_vm_readv`, many ranges per syscall; a guarded write) and
//! [`MemoryImage`] (an in-memory address space for unit tests and fuzzing).
//!
//! [`Pauser`] stops a target's threads for a read that must see one instant (`--blocking`).
//! [`switch_ring::SwitchRing`] reads the kernel's log of context switches on one CPU from
//! the ring buffer it shares with pyfleet (memory too, though not a target's).
//! [`capture_records`] is what the kernel capture copies of a target (its records, and the
//! layout a chain is copied by, a map value of the program's); `capture::kernel` loads it.
//! [`limit_malloc_arenas`] keeps pyfleet's own heap from spreading over one arena per thread.
//!
//! It is the only home of `unsafe` in pyfleet. It knows nothing about CPython: callers ask for
//! byte ranges and get bytes or a [`MemoryError`]. Every syscall is counted in [`ReadStats`],
//! because syscalls, not bytes, are what a sample costs.

pub mod capture_records;
mod image;
pub mod pause;
mod process_vm;
pub mod switch_ring;

pub use image::MemoryImage;
pub use pause::{Paused, Pauser};
pub use process_vm::{ProcessMemory, STACK_IOVECS};

use std::cell::Cell;

/// Arenas glibc's malloc may use in pyfleet (see [`limit_malloc_arenas`]).
const MALLOC_ARENAS: i32 = 2;

/// Limits glibc's malloc to [`MALLOC_ARENAS`] arenas. A long-running daemon spawns short
/// threads (a probe per new process, the async runtime's blocking pool); each may get an
/// arena of its own, and memory freed in one is not reused by another, so RSS creeps up with
/// every thread that ever ran (measured in BENCHMARKS.md, "Hostile processes and churn"). Call
/// once, first thing, before other threads start.
pub fn limit_malloc_arenas() {
    // SAFETY: mallopt only sets an allocator parameter; called before any other thread exists,
    // it races with no allocation. M_ARENA_MAX takes any positive count.
    unsafe {
        libc::mallopt(libc::M_ARENA_MAX, MALLOC_ARENAS);
    }
}

/// Why a remote read or write failed.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum MemoryError {
    /// The target process no longer exists (ESRCH).
    #[error("no such process (pid {0})")]
    ProcessGone(i32),
    /// The kernel refused access (EPERM): no ptrace permission over the target.
    #[error("permission denied reading memory of pid {0}: {why}", why = crate::host::access::why_denied(*.0))]
    PermissionDenied(i32),
    /// The range is not (or no longer) mapped in the target.
    #[error("unreadable target memory at {addr:#x} ({len} bytes)")]
    BadAddress { addr: u64, len: usize },
    /// `--blocking`: the target is traced by another process (a debugger, or another
    /// profiler's blocking mode), so it cannot be paused.
    #[error("cannot pause pid {0}: it is traced by another process (a debugger?)")]
    AlreadyTraced(i32),
    /// `--blocking`: a thread of the target did not stop in time (an uninterruptible sleep).
    #[error("cannot pause pid {pid}: a thread did not stop within {ms} ms")]
    PauseTimeout { pid: i32, ms: u64 },
    /// `--blocking`: more threads than pyfleet pauses at once.
    #[error("cannot pause pid {pid}: more than {max} threads")]
    TooManyThreads { pid: i32, max: usize },
    /// Any other errno from the kernel.
    #[error("remote memory access failed: {}", std::io::Error::from_raw_os_error(*.0))]
    Os(i32),
}

impl MemoryError {
    /// True when the target process is gone; the caller should stop sampling it.
    pub fn is_process_gone(&self) -> bool {
        matches!(self, MemoryError::ProcessGone(_))
    }
}

/// One range of a batched read: `buf.len()` bytes at `addr`.
pub struct ReadRequest<'a> {
    pub addr: u64,
    pub buf: &'a mut [u8],
}

impl<'a> ReadRequest<'a> {
    pub fn new(addr: u64, buf: &'a mut [u8]) -> Self {
        ReadRequest { addr, buf }
    }
}

/// Counts of remote accesses, per memory object. Plain cells: a memory object belongs to one
/// unwinder, which belongs to one sampler.
#[derive(Debug, Default)]
pub struct ReadStats {
    reads: Cell<u64>,
    bytes: Cell<u64>,
}

impl ReadStats {
    pub fn record(&self, bytes: usize) {
        self.reads.set(self.reads.get() + 1);
        self.bytes.set(self.bytes.get() + bytes as u64);
    }
    /// Syscalls (or, for an image, calls) made so far.
    pub fn reads(&self) -> u64 {
        self.reads.get()
    }
    /// Bytes transferred so far.
    pub fn bytes(&self) -> u64 {
        self.bytes.get()
    }
}

/// Access to a target's address space.
pub trait RemoteMemory {
    /// Reads exactly `buf.len()` bytes at `addr`.
    fn read(&self, addr: u64, buf: &mut [u8]) -> Result<(), MemoryError>;

    /// Reads every range, in as few syscalls as the implementation can. On success every
    /// buffer is filled. On failure, returns the index of the first range that could not be
    /// read along with the error; ranges before it are filled, ranges after it may or may not
    /// be.
    fn read_many(&self, reqs: &mut [ReadRequest<'_>]) -> Result<(), (usize, MemoryError)>;

    /// Writes the word `value` at `addr` if it holds `expected` right before; `Ok(false)` when
    /// it does not (or no longer can be read the way it was). pyfleet only ever writes the
    /// 3.15 frame-cache marker.
    fn write_if(&self, addr: u64, expected: u64, value: u64) -> Result<bool, MemoryError>;

    /// Whether [`RemoteMemory::write_if`] can succeed at all (a live process's memory is
    /// writable only through a handle bound at attach).
    fn writable(&self) -> bool {
        true
    }

    /// Syscall and byte counts.
    fn stats(&self) -> &ReadStats;

    /// Reads a little-endian u64 at `addr`.
    fn read_u64(&self, addr: u64) -> Result<u64, MemoryError> {
        let mut b = [0u8; 8];
        self.read(addr, &mut b)?;
        Ok(u64::from_le_bytes(b))
    }

    /// Reads `len` bytes at `addr` into a new vector.
    fn read_vec(&self, addr: u64, len: usize) -> Result<Vec<u8>, MemoryError> {
        let mut v = vec![0u8; len];
        self.read(addr, &mut v)?;
        Ok(v)
    }
}

/// Little-endian field access on a local copy of a remote struct. Out-of-range offsets read as
/// an error rather than panicking: offsets come from target memory on 3.13+.
#[derive(Clone, Copy)]
pub struct Bytes<'a>(pub &'a [u8]);

/// A field offset lay outside the bytes that were read.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[error("field at offset {offset} (+{size}) outside a {len}-byte copy")]
pub struct FieldOutOfRange {
    pub offset: u64,
    pub size: usize,
    pub len: usize,
}

impl<'a> Bytes<'a> {
    #[inline]
    fn field<const N: usize>(&self, offset: u64) -> Result<[u8; N], FieldOutOfRange> {
        let err = FieldOutOfRange {
            offset,
            size: N,
            len: self.0.len(),
        };
        let start = usize::try_from(offset).map_err(|_| err)?;
        let end = start.checked_add(N).ok_or(err)?;
        let slice = self.0.get(start..end).ok_or(err)?;
        let mut out = [0u8; N];
        out.copy_from_slice(slice);
        Ok(out)
    }
    #[inline]
    pub fn u64(&self, offset: u64) -> Result<u64, FieldOutOfRange> {
        self.field::<8>(offset).map(u64::from_le_bytes)
    }
    #[inline]
    pub fn i64(&self, offset: u64) -> Result<i64, FieldOutOfRange> {
        self.field::<8>(offset).map(i64::from_le_bytes)
    }
    #[inline]
    pub fn u32(&self, offset: u64) -> Result<u32, FieldOutOfRange> {
        self.field::<4>(offset).map(u32::from_le_bytes)
    }
    #[inline]
    pub fn i32(&self, offset: u64) -> Result<i32, FieldOutOfRange> {
        self.field::<4>(offset).map(i32::from_le_bytes)
    }
    #[inline]
    pub fn u8(&self, offset: u64) -> Result<u8, FieldOutOfRange> {
        self.field::<1>(offset).map(|b| b[0])
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bytes_fields_are_bounds_checked() {
        let data = [1u8, 0, 0, 0, 0, 0, 0, 0, 2];
        let b = Bytes(&data);
        assert_eq!(b.u64(0), Ok(1));
        assert_eq!(b.u8(8), Ok(2));
        assert!(b.u64(2).is_err());
        assert!(b.u32(u64::MAX).is_err());
        assert!(b.u8(9).is_err());
    }
}
