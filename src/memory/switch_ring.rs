//! The kernel's log of context switches on one CPU, read from the ring buffer the kernel
//! shares with pyfleet: a CPU-wide `perf_event_open` of the dummy software event with
//! `context_switch` set, mapped once. Reading what is new costs no syscall.
//!
//! Each switch on the CPU writes two records, each with the time of the switch and the task
//! that was current when it was written: one as the old task leaves (naming the task that
//! comes in), one as the new task comes in (naming the task that left). Either record alone
//! says who left and who came in, and [`SwitchRing::drain`] takes both from each: some kernels
//! write no record while the CPU's idle task is current (seen on 6.18 in a VM), so a thread
//! that wakes on or sleeps to an idle CPU is named by its own record only. When the buffer was
//! full the kernel drops records and says so ([`Switch::Lost`]): the caller must then assume
//! that anything may have run.
//!
//! Opening it needs `CAP_PERFMON` (or `CAP_SYS_ADMIN`, or `perf_event_paranoid` at most 0).
//! It observes only which task runs where; it never touches a target.

use std::io;
use std::os::fd::{FromRawFd, OwnedFd};

/// Data pages of each ring (64 KiB: about 4,000 switches between two drains).
const DATA_PAGES: usize = 16;

const PERF_TYPE_SOFTWARE: u32 = 1;
const PERF_COUNT_SW_DUMMY: u64 = 9;
/// `perf_event_attr` as of its first published size (`PERF_ATTR_SIZE_VER0`).
const ATTR_SIZE: u32 = 64;
/// Bits of the attribute's flag word (offset 40): `watermark`, `sample_id_all`,
/// `context_switch`; and `PERF_SAMPLE_TID | PERF_SAMPLE_TIME` in its sample type (offset 24):
/// every record ends with the pid and tid of the task current as it was written, then the
/// time of the switch.
const FLAG_WATERMARK: u64 = 1 << 14;
const FLAG_SAMPLE_ID_ALL: u64 = 1 << 18;
const FLAG_CONTEXT_SWITCH: u64 = 1 << 26;
const SAMPLE_TID: u64 = 1 << 1;
const SAMPLE_TIME: u64 = 1 << 2;
/// `perf_event_mmap_page`: where the kernel's write position, our read position and the
/// data area are.
const DATA_HEAD: usize = 1024;
const DATA_TAIL: usize = 1032;
const DATA_OFFSET: usize = 1040;
const DATA_SIZE: usize = 1048;
/// Record types and the flag that marks a switch out.
const RECORD_LOST: u32 = 2;
const RECORD_SWITCH_CPU_WIDE: u32 = 15;
const MISC_SWITCH_OUT: u16 = 1 << 13;

/// What one record says; times are the kernel's perf clock (nanoseconds, only compared with
/// each other).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Switch {
    /// Thread `tid` (as this process's pid namespace sees it) began to run at `time`.
    In { tid: i32, time: u64 },
    /// Thread `tid` stopped running at `time`.
    Out { tid: i32, time: u64 },
    /// The kernel dropped records: anything may have run meanwhile.
    Lost,
}

/// One CPU's ring; see the module documentation.
pub struct SwitchRing {
    _fd: OwnedFd,
    map: *mut u8,
    map_len: usize,
    data_offset: usize,
    data_size: usize,
}

// SAFETY: the ring owns its mapping and descriptor; nothing else refers to the mapping, so
// moving the ring to another thread moves the only user.
unsafe impl Send for SwitchRing {}

impl SwitchRing {
    /// Opens and maps the ring of `cpu`. Fails without the capability (see the module
    /// documentation) or on a kernel without the event.
    pub fn open(cpu: i32) -> io::Result<SwitchRing> {
        let mut attr = [0u8; ATTR_SIZE as usize];
        attr[0..4].copy_from_slice(&PERF_TYPE_SOFTWARE.to_ne_bytes());
        attr[4..8].copy_from_slice(&ATTR_SIZE.to_ne_bytes());
        attr[8..16].copy_from_slice(&PERF_COUNT_SW_DUMMY.to_ne_bytes());
        attr[24..32].copy_from_slice(&(SAMPLE_TID | SAMPLE_TIME).to_ne_bytes());
        let flags = FLAG_WATERMARK | FLAG_SAMPLE_ID_ALL | FLAG_CONTEXT_SWITCH;
        attr[40..48].copy_from_slice(&flags.to_ne_bytes());
        // Wake nobody: pyfleet polls (the watermark is in bytes, past the ring's size).
        attr[48..52].copy_from_slice(&u32::MAX.to_ne_bytes());
        // SAFETY: perf_event_open reads `size` bytes of the attribute, which lives for the
        // call; pid -1 with a cpu is a CPU-wide event; no group, no flags.
        let fd = unsafe {
            libc::syscall(
                libc::SYS_perf_event_open,
                attr.as_ptr(),
                -1 as libc::pid_t,
                cpu as libc::c_int,
                -1 as libc::c_int,
                0 as libc::c_ulong,
            )
        };
        if fd < 0 {
            return Err(io::Error::last_os_error());
        }
        let fd = libc::c_int::try_from(fd).map_err(|_| io::Error::other("bad descriptor"))?;
        // SAFETY: the kernel just returned this descriptor, and nothing else owns it.
        let fd = unsafe { OwnedFd::from_raw_fd(fd) };
        let page = page_size();
        let map_len = page * (DATA_PAGES + 1);
        // SAFETY: maps the event's metadata page and data pages, shared with the kernel, at
        // an address the kernel chooses; the descriptor is valid.
        let map = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                map_len,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_SHARED,
                std::os::fd::AsRawFd::as_raw_fd(&fd),
                0,
            )
        };
        if map == libc::MAP_FAILED {
            return Err(io::Error::last_os_error());
        }
        let mut ring = SwitchRing {
            _fd: fd,
            map: map.cast(),
            map_len,
            data_offset: page,
            data_size: page * DATA_PAGES,
        };
        // Kernels that say where the data lies (4.1+) are believed if it is inside the map.
        let (offset, size) = (ring.load(DATA_OFFSET), ring.load(DATA_SIZE));
        if offset != 0
            && size != 0
            && offset
                .checked_add(size)
                .is_some_and(|e| e <= map_len as u64)
        {
            ring.data_offset = offset as usize;
            ring.data_size = size as usize;
        }
        Ok(ring)
    }

    /// Reads every record written since the last drain, oldest first, into `out`, and gives
    /// the space back to the kernel.
    pub fn drain(&mut self, out: &mut Vec<Switch>) {
        let head = self.load_acquire(DATA_HEAD);
        let mut tail = self.load(DATA_TAIL);
        if head.wrapping_sub(tail) > self.data_size as u64 {
            // Cannot happen while the kernel honours our tail; treated as a loss.
            out.push(Switch::Lost);
            tail = head;
        }
        while tail < head {
            let mut header = [0u8; 8];
            self.copy_out(tail, &mut header);
            let kind = u32::from_ne_bytes([header[0], header[1], header[2], header[3]]);
            let misc = u16::from_ne_bytes([header[4], header[5]]);
            let size = u16::from_ne_bytes([header[6], header[7]]) as u64;
            if size < 8 || tail + size > head {
                out.push(Switch::Lost);
                tail = head;
                break;
            }
            match kind {
                RECORD_SWITCH_CPU_WIDE if size >= 32 => {
                    // The other task's pid and tid, then (sample_id) the current task's pid
                    // and tid, then the time.
                    let mut body = [0u8; 24];
                    self.copy_out(tail + 8, &mut body);
                    let other = i32::from_ne_bytes([body[4], body[5], body[6], body[7]]);
                    let current = i32::from_ne_bytes([body[12], body[13], body[14], body[15]]);
                    let mut t = [0u8; 8];
                    t.copy_from_slice(&body[16..24]);
                    let time = u64::from_ne_bytes(t);
                    // A switch out is written by the task leaving and names the one coming
                    // in; a switch in, the other way round.
                    let (left, came) = if misc & MISC_SWITCH_OUT != 0 {
                        (current, other)
                    } else {
                        (other, current)
                    };
                    out.push(Switch::Out { tid: left, time });
                    out.push(Switch::In { tid: came, time });
                }
                RECORD_LOST => out.push(Switch::Lost),
                _ => {}
            }
            tail += size;
        }
        self.store_release(DATA_TAIL, tail);
    }

    /// Copies bytes of the data area starting at ring position `at` (wrapping).
    fn copy_out(&self, at: u64, buf: &mut [u8]) {
        for (i, b) in buf.iter_mut().enumerate() {
            let pos = (at as usize).wrapping_add(i) % self.data_size;
            // SAFETY: `data_offset + pos` is inside the mapping (`pos < data_size` and the
            // data area lies inside it, checked at open); the kernel writes only records
            // past `head`, which this reads none of.
            *b = unsafe { std::ptr::read_volatile(self.map.add(self.data_offset + pos)) };
        }
    }

    fn load(&self, offset: usize) -> u64 {
        // SAFETY: `offset` is one of the metadata page's 8-byte aligned fields, inside the
        // mapping, which lives as long as `self`.
        unsafe { std::ptr::read_volatile(self.map.add(offset).cast::<u64>()) }
    }

    fn load_acquire(&self, offset: usize) -> u64 {
        let v = self.load(offset);
        // The records up to the head are read after the head (the kernel's rule).
        std::sync::atomic::fence(std::sync::atomic::Ordering::Acquire);
        v
    }

    fn store_release(&self, offset: usize, value: u64) {
        // Every record is read before the kernel may reuse its space.
        std::sync::atomic::fence(std::sync::atomic::Ordering::Release);
        // SAFETY: as in `load`; the tail is the one field the reader writes.
        unsafe { std::ptr::write_volatile(self.map.add(offset).cast::<u64>(), value) }
    }
}

impl Drop for SwitchRing {
    fn drop(&mut self) {
        // SAFETY: unmaps exactly the mapping made at open, which nothing uses after this.
        unsafe {
            libc::munmap(self.map.cast(), self.map_len);
        }
    }
}

fn page_size() -> usize {
    // SAFETY: sysconf only reads a system parameter.
    let n = unsafe { libc::sysconf(libc::_SC_PAGESIZE) };
    usize::try_from(n).ok().filter(|&n| n > 0).unwrap_or(4096)
}

/// The online CPUs, each of which needs a ring (`None` if the kernel does not say; the
/// ring's own test opens the same CPUs as the log).
#[cfg(test)]
pub(crate) fn online_cpu_ids() -> Option<Vec<i32>> {
    cpu_list(&online_cpus()?)
}

/// `/sys/devices/system/cpu/online`, as the kernel writes it ("0-3,6").
pub(crate) fn online_cpus() -> Option<String> {
    let s = std::fs::read_to_string("/sys/devices/system/cpu/online").ok()?;
    Some(s.trim().to_string())
}

/// The CPUs of such a list (at most 4096 of them).
pub(crate) fn cpu_list(list: &str) -> Option<Vec<i32>> {
    let mut cpus = Vec::new();
    for part in list.split(',').filter(|p| !p.is_empty()) {
        let (lo, hi) = match part.split_once('-') {
            Some((lo, hi)) => (lo.parse::<i32>().ok()?, hi.parse::<i32>().ok()?),
            None => {
                let c = part.parse::<i32>().ok()?;
                (c, c)
            }
        };
        if lo < 0 || hi < lo || hi >= 4096 {
            return None;
        }
        cpus.extend(lo..=hi);
    }
    (!cpus.is_empty()).then_some(cpus)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_cpu_lists() {
        assert_eq!(cpu_list("0-3"), Some(vec![0, 1, 2, 3]));
        assert_eq!(cpu_list("0,2-3"), Some(vec![0, 2, 3]));
        assert_eq!(cpu_list("5"), Some(vec![5]));
        assert_eq!(cpu_list(""), None);
        assert_eq!(cpu_list("3-1"), None);
        assert_eq!(cpu_list("0-99999"), None);
        assert_eq!(cpu_list("x"), None);
    }

    /// A real thread of this process that sleeps and wakes is seen coming in and going out
    /// (where the capability is there to open the ring).
    #[test]
    fn sees_a_thread_come_in_and_go_out() {
        // Every online CPU, as the log opens them: the thread may run on any of them, even
        // where a CPU quota makes the process's available parallelism smaller.
        let Some(cpus) = online_cpu_ids() else {
            eprintln!("the kernel does not list its online CPUs: nothing to test");
            return;
        };
        let mut rings = Vec::new();
        for cpu in cpus {
            match SwitchRing::open(cpu) {
                Ok(r) => rings.push(r),
                Err(e) => {
                    eprintln!("no switch ring here ({e}): nothing to test");
                    return;
                }
            }
        }
        let (tx, rx) = std::sync::mpsc::channel();
        let napper = std::thread::spawn(move || {
            let tid = std::fs::read_link("/proc/thread-self")
                .ok()
                .and_then(|p| p.file_name()?.to_str()?.parse::<i32>().ok())
                .unwrap_or(0);
            tx.send(tid).ok();
            for _ in 0..20 {
                std::thread::sleep(std::time::Duration::from_millis(2));
            }
        });
        let tid = rx.recv().unwrap();
        napper.join().unwrap();
        let mut out = Vec::new();
        for r in &mut rings {
            r.drain(&mut out);
        }
        let ins = out
            .iter()
            .filter(|s| matches!(s, Switch::In { tid: t, .. } if *t == tid))
            .count();
        let outs = out
            .iter()
            .filter(|s| matches!(s, Switch::Out { tid: t, .. } if *t == tid))
            .count();
        assert!(
            ins >= 10 && outs >= 10,
            "thread {tid} came in {ins} and went out {outs} times in 20 naps"
        );
        // Drained: nothing new until something switches.
        out.clear();
        for r in &mut rings {
            r.drain(&mut out);
        }
        assert!(!out
            .iter()
            .any(|s| matches!(s, Switch::In { tid: t, .. } if *t == tid)));
    }
}
