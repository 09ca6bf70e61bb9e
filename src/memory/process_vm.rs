//! `process_vm_readv` on a live process, and the one write pyfleet makes, guarded by a
//! `/proc/PID/mem` handle opened by [`ProcessMemory::bind_writes`] at attach: the handle stays
//! bound to the address space that was there then. A write ([`RemoteMemory::write_if`]) first
//! reads the word through the handle and writes only if it still holds the expected value: after
//! the process `exec`s or exits (and its pid is reused) that read fails and nothing is written.
//! The write itself goes through the handle when it could be opened for writing (root), else
//! (CAP_SYS_PTRACE without CAP_DAC_OVERRIDE, as the systemd unit runs) by `process_vm_writev`
//! right after the check.

use super::{MemoryError, ReadRequest, ReadStats, RemoteMemory};
use std::fs::File;
use std::os::unix::fs::FileExt;

/// The kernel's limit on iovecs per call (`UIO_MAXIOV`).
const MAX_IOVECS: usize = 1024;
/// Batches up to this many ranges build their iovecs on the stack.
pub const STACK_IOVECS: usize = 128;

/// A live process's memory.
#[derive(Debug)]
pub struct ProcessMemory {
    pid: i32,
    stats: ReadStats,
    /// `/proc/PID/mem` opened at attach (see the module docs), and whether for writing too;
    /// without it nothing is written.
    bound: Option<(File, bool)>,
}

impl ProcessMemory {
    pub fn new(pid: i32) -> Self {
        ProcessMemory {
            pid,
            stats: ReadStats::default(),
            bound: None,
        }
    }

    /// Opens the target's address space for the writes to come (see the module docs).
    pub fn bind_writes(&mut self) -> Result<(), MemoryError> {
        let path = format!("/proc/{}/mem", self.pid);
        let open = |write: bool| {
            std::fs::OpenOptions::new()
                .read(true)
                .write(write)
                .open(&path)
        };
        let bound = match open(true) {
            Ok(f) => (f, true),
            Err(_) => (
                open(false).map_err(|e| self.error(e.raw_os_error().unwrap_or(libc::EIO), 0, 0))?,
                false,
            ),
        };
        self.bound = Some(bound);
        Ok(())
    }

    /// `process_vm_writev` of `data` at `addr`.
    fn writev(&self, addr: u64, data: &[u8]) -> Result<(), MemoryError> {
        let local = libc::iovec {
            iov_base: data.as_ptr() as *mut libc::c_void,
            iov_len: data.len(),
        };
        let remote = libc::iovec {
            iov_base: addr as usize as *mut libc::c_void,
            iov_len: data.len(),
        };
        // SAFETY: the local iovec describes `data`, which is live and only read by the kernel
        // (process_vm_writev never writes to local memory). The remote address is validated by
        // the kernel; callers only write at offsets validated against the target's layout.
        let n = unsafe { libc::process_vm_writev(self.pid, &local, 1, &remote, 1, 0) };
        if n < 0 {
            let errno = std::io::Error::last_os_error().raw_os_error().unwrap_or(0);
            return Err(self.error(errno, addr, data.len()));
        }
        if n as usize != data.len() {
            return Err(MemoryError::BadAddress {
                addr,
                len: data.len(),
            });
        }
        Ok(())
    }

    pub fn pid(&self) -> i32 {
        self.pid
    }

    fn error(&self, errno: i32, addr: u64, len: usize) -> MemoryError {
        match errno {
            libc::ESRCH => MemoryError::ProcessGone(self.pid),
            libc::EPERM | libc::EACCES => MemoryError::PermissionDenied(self.pid),
            libc::EFAULT | libc::EIO => MemoryError::BadAddress { addr, len },
            e => MemoryError::Os(e),
        }
    }

    /// One `process_vm_readv` over `reqs` (at most `MAX_IOVECS`). Returns bytes read.
    /// Batches of up to [`STACK_IOVECS`] ranges (every steady-state sample) allocate nothing.
    fn readv_once(&self, reqs: &mut [ReadRequest<'_>]) -> Result<usize, i32> {
        const EMPTY: libc::iovec = libc::iovec {
            iov_base: std::ptr::null_mut(),
            iov_len: 0,
        };
        let mut local_arr = [EMPTY; STACK_IOVECS];
        let mut remote_arr = [EMPTY; STACK_IOVECS];
        let (mut local_vec, mut remote_vec) = (Vec::new(), Vec::new());
        let (local, remote): (&mut [libc::iovec], &mut [libc::iovec]) =
            if reqs.len() <= STACK_IOVECS {
                (&mut local_arr[..reqs.len()], &mut remote_arr[..reqs.len()])
            } else {
                local_vec.resize(reqs.len(), EMPTY);
                remote_vec.resize(reqs.len(), EMPTY);
                (&mut local_vec[..], &mut remote_vec[..])
            };
        let mut total = 0usize;
        for ((r, l), rm) in reqs.iter_mut().zip(local.iter_mut()).zip(remote.iter_mut()) {
            *l = libc::iovec {
                iov_base: r.buf.as_mut_ptr().cast(),
                iov_len: r.buf.len(),
            };
            *rm = libc::iovec {
                iov_base: r.addr as usize as *mut libc::c_void,
                iov_len: r.buf.len(),
            };
            total += r.buf.len();
        }
        // SAFETY: every local iovec points into a live `&mut [u8]` borrowed from `reqs` for the
        // duration of this call, with its exact length, so the kernel writes only into memory
        // we own exclusively. Remote iovecs are just addresses in the target; the kernel checks
        // them and reports EFAULT or a short count, never touching our memory for them.
        let n = unsafe {
            libc::process_vm_readv(
                self.pid,
                local.as_ptr(),
                local.len() as libc::c_ulong,
                remote.as_ptr(),
                remote.len() as libc::c_ulong,
                0,
            )
        };
        self.stats.record(if n > 0 { n as usize } else { 0 });
        if n < 0 {
            return Err(std::io::Error::last_os_error().raw_os_error().unwrap_or(0));
        }
        debug_assert!(n as usize <= total);
        Ok(n as usize)
    }
}

impl RemoteMemory for ProcessMemory {
    fn read(&self, addr: u64, buf: &mut [u8]) -> Result<(), MemoryError> {
        if buf.is_empty() {
            return Ok(());
        }
        let len = buf.len();
        let mut reqs = [ReadRequest::new(addr, buf)];
        self.read_many(&mut reqs)
            .map_err(|(_, e)| e)
            .map_err(|e| match e {
                MemoryError::BadAddress { .. } => MemoryError::BadAddress { addr, len },
                e => e,
            })
    }

    fn read_many(&self, reqs: &mut [ReadRequest<'_>]) -> Result<(), (usize, MemoryError)> {
        // Each round either completes at least one range or returns an error, so this ends.
        let mut i = 0usize;
        while i < reqs.len() {
            let end = (i + MAX_IOVECS).min(reqs.len());
            let want: usize = reqs[i..end].iter().map(|r| r.buf.len()).sum();
            let (addr, len) = (reqs[i].addr, reqs[i].buf.len());
            let got = self
                .readv_once(&mut reqs[i..end])
                .map_err(|errno| (i, self.error(errno, addr, len)))?;
            if got == want {
                i = end;
                continue;
            }
            // Short read: the kernel stopped at the first range it could not read whole.
            // Skip the complete ranges and retry from the first incomplete one; if that one is
            // the first of the round, it is the culprit.
            let mut done = 0usize;
            let mut j = i;
            while j < end && done + reqs[j].buf.len() <= got {
                done += reqs[j].buf.len();
                j += 1;
            }
            if j == i {
                return Err((i, MemoryError::BadAddress { addr, len }));
            }
            i = j;
        }
        Ok(())
    }

    fn write_if(&self, addr: u64, expected: u64, value: u64) -> Result<bool, MemoryError> {
        let Some((file, writable)) = &self.bound else {
            return Err(MemoryError::PermissionDenied(self.pid));
        };
        let io = |e: std::io::Error| self.error(e.raw_os_error().unwrap_or(libc::EIO), addr, 8);
        let mut now = [0u8; 8];
        match file.read_at(&mut now, addr) {
            Ok(8) => {}
            // The address space bound at attach is gone (exec, exit): nothing is written.
            Ok(_) => return Ok(false),
            Err(e) => return Err(io(e)),
        }
        if u64::from_le_bytes(now) != expected {
            return Ok(false);
        }
        let data = value.to_le_bytes();
        if *writable {
            match file.write_at(&data, addr) {
                Ok(8) => Ok(true),
                Ok(_) => Ok(false),
                Err(e) => Err(io(e)),
            }
        } else {
            self.writev(addr, &data).map(|()| true)
        }
    }

    fn writable(&self) -> bool {
        self.bound.is_some()
    }

    fn stats(&self) -> &ReadStats {
        &self.stats
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Reads this very process: real `process_vm_readv`, with unmapped ranges mixed in.
    #[test]
    fn batched_reads_on_a_live_process() {
        let me = ProcessMemory::new(std::process::id() as i32);
        let a: Vec<u8> = (0..=255).collect();
        let b = vec![7u8; 5000];
        let addr = |v: &Vec<u8>| v.as_ptr() as u64;

        let (mut x, mut y) = (vec![0u8; 256], vec![0u8; 5000]);
        let mut reqs = [
            ReadRequest::new(addr(&a), &mut x),
            ReadRequest::new(addr(&b), &mut y),
        ];
        me.read_many(&mut reqs).unwrap();
        assert_eq!((x.as_slice(), y.as_slice()), (a.as_slice(), b.as_slice()));
        assert_eq!(me.stats().reads(), 1, "two ranges, one syscall");

        // The second range is unmapped: the first is still filled, the error names index 1.
        let (mut x, mut y, mut z) = (vec![0u8; 16], vec![0u8; 16], vec![0u8; 16]);
        let mut reqs = [
            ReadRequest::new(addr(&a), &mut x),
            ReadRequest::new(8, &mut y),
            ReadRequest::new(addr(&a) + 16, &mut z),
        ];
        let (i, e) = me.read_many(&mut reqs).unwrap_err();
        assert_eq!(i, 1);
        assert!(matches!(e, MemoryError::BadAddress { addr: 8, len: 16 }));
        assert_eq!(x.as_slice(), &a[..16]);

        // More ranges than one syscall takes.
        let mut bufs = vec![[0u8; 1]; 3000];
        let mut reqs: Vec<_> = bufs
            .iter_mut()
            .enumerate()
            .map(|(i, buf)| ReadRequest::new(addr(&a) + (i % 256) as u64, buf))
            .collect();
        me.read_many(&mut reqs).unwrap();
        assert!(bufs
            .iter()
            .enumerate()
            .all(|(i, b)| b[0] == (i % 256) as u8));

        // Single reads and writes.
        assert!(matches!(
            me.read_u64(0),
            Err(MemoryError::BadAddress { .. })
        ));
        // Writes need the handle bound first, and the expected old value.
        let mut target = vec![7u64];
        let at = target.as_mut_ptr() as u64;
        assert!(me.write_if(at, 7, 9).is_err());
        let mut me = me;
        me.bind_writes().unwrap();
        // No borrow of `target` is live while the kernel writes to it.
        assert_eq!(me.write_if(at, 8, 9), Ok(false));
        assert_eq!(me.write_if(at, 7, 9), Ok(true));
        assert_eq!(std::hint::black_box(&mut target).as_slice(), &[9]);
    }

    #[test]
    fn a_missing_process_is_gone() {
        // pid_max is at most 2^22: this pid cannot exist.
        let m = ProcessMemory::new(i32::MAX);
        assert_eq!(m.read_u64(0x1000), Err(MemoryError::ProcessGone(i32::MAX)));
    }
}
