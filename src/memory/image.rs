//! An in-memory address space: the test double for [`RemoteMemory`].

use super::{MemoryError, ReadRequest, ReadStats, RemoteMemory};
use std::cell::RefCell;
use std::collections::BTreeMap;
use std::time::Duration;

/// Segments of bytes at fixed addresses. Reads must fall inside one segment, as they must fall
/// inside mapped memory in a real process.
#[derive(Debug, Default)]
pub struct MemoryImage {
    segments: RefCell<BTreeMap<u64, Vec<u8>>>,
    stats: ReadStats,
    /// How long each read (each call, like a syscall) takes: a slow target.
    read_delay: Duration,
}

impl MemoryImage {
    pub fn new() -> Self {
        Self::default()
    }

    /// Maps `bytes` at `addr` (replacing any segment that starts there).
    pub fn map(&mut self, addr: u64, bytes: Vec<u8>) {
        self.segments.get_mut().insert(addr, bytes);
    }

    /// Makes every read (every call) take `delay`, as the reads of a slow target do.
    pub fn set_read_delay(&mut self, delay: Duration) {
        self.read_delay = delay;
    }

    /// Writes `data` at `addr` inside an existing segment (for building test images, and for
    /// a target that changes while it is read).
    pub fn poke(&self, addr: u64, data: &[u8]) {
        let len = data.len();
        let (base, off) = self
            .locate(addr, len)
            .unwrap_or_else(|| panic!("poke outside mapped segments at {addr:#x}"));
        if let Some(seg) = self.segments.borrow_mut().get_mut(&base) {
            seg[off..off + len].copy_from_slice(data);
        }
    }

    fn locate(&self, addr: u64, len: usize) -> Option<(u64, usize)> {
        let segs = self.segments.borrow();
        let (&base, seg) = segs.range(..=addr).next_back()?;
        let off = usize::try_from(addr - base).ok()?;
        let end = off.checked_add(len)?;
        (end <= seg.len()).then_some((base, off))
    }
}

impl RemoteMemory for MemoryImage {
    fn read(&self, addr: u64, buf: &mut [u8]) -> Result<(), MemoryError> {
        std::thread::sleep(self.read_delay);
        self.stats.record(buf.len());
        let len = buf.len();
        let (base, off) = self
            .locate(addr, len)
            .ok_or(MemoryError::BadAddress { addr, len })?;
        let segs = self.segments.borrow();
        let seg = segs
            .get(&base)
            .ok_or(MemoryError::BadAddress { addr, len })?;
        buf.copy_from_slice(&seg[off..off + len]);
        Ok(())
    }

    fn read_many(&self, reqs: &mut [ReadRequest<'_>]) -> Result<(), (usize, MemoryError)> {
        std::thread::sleep(self.read_delay);
        for (i, r) in reqs.iter_mut().enumerate() {
            let len = r.buf.len();
            let (base, off) = self
                .locate(r.addr, len)
                .ok_or((i, MemoryError::BadAddress { addr: r.addr, len }))?;
            let segs = self.segments.borrow();
            if let Some(seg) = segs.get(&base) {
                r.buf.copy_from_slice(&seg[off..off + len]);
            }
        }
        // One call, like one syscall.
        self.stats.record(reqs.iter().map(|r| r.buf.len()).sum());
        Ok(())
    }

    fn write_if(&self, addr: u64, expected: u64, value: u64) -> Result<bool, MemoryError> {
        if self.read_u64(addr)? != expected {
            return Ok(false);
        }
        let data = value.to_le_bytes();
        let len = data.len();
        let (base, off) = self
            .locate(addr, len)
            .ok_or(MemoryError::BadAddress { addr, len })?;
        let mut segs = self.segments.borrow_mut();
        let seg = segs
            .get_mut(&base)
            .ok_or(MemoryError::BadAddress { addr, len })?;
        seg[off..off + len].copy_from_slice(&data);
        Ok(true)
    }

    fn stats(&self) -> &ReadStats {
        &self.stats
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_inside_segments_only() {
        let mut m = MemoryImage::new();
        m.map(0x1000, (0u8..16).collect());
        let mut b = [0u8; 4];
        m.read(0x1004, &mut b).unwrap();
        assert_eq!(b, [4, 5, 6, 7]);
        assert!(m.read(0x100e, &mut b).is_err());
        assert!(m.read(0xfff, &mut b).is_err());
        let (mut x, mut y) = ([0u8; 2], [0u8; 2]);
        let mut reqs = [
            ReadRequest::new(0x1000, &mut x),
            ReadRequest::new(0x2000, &mut y),
        ];
        assert_eq!(m.read_many(&mut reqs).unwrap_err().0, 1);
        m.poke(0x1000, &[9]);
        assert_eq!(m.read_u64(0x1000).unwrap() & 0xff, 9);
    }
}
