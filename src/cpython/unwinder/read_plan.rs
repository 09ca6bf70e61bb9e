//! The read plan of one sample: what to copy from the target (keys and ranges, as the
//! unwinder's prediction pushes them), the physical reads they become (sorted, coalesced
//! iovecs, in an order that is part of the consistency contract), and where each key's bytes
//! landed. See [`ReadPlan`] for the order and why.

use crate::memory::{ReadRequest, RemoteMemory, STACK_IOVECS};
use rustc_hash::FxHashMap;

/// Granularity of the kernel's work in `process_vm_readv` (pinning and copying a page).
pub(super) const PAGE: u64 = 4096;

/// Ranges of a batch closer than this, or that start in the page where the one before ends,
/// are read as one iovec: on a cold target each iovec costs the kernel about 0.5-0.75 µs
/// (pinning its pages), a few KiB more of a page it pins anyway cost less.
pub(super) const MERGE_GAP: u64 = 1024;

/// What was prefetched, by what it is.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub(super) enum Key {
    Head,
    Interp(u64),
    Word(u64),
    /// 3.11/3.12: the C stack where a thread's eval loops keep their C frames, by thread
    /// state (see `ThreadCache::cstack`).
    CStack(u64),
    Gil(u64),
    Tstate(u64),
    Region(u64),
    /// The newest part of a data-stack region, read first (see [`top_split`](super::next_read::top_split)).
    RegionTop(u64),
    Frame(u64),
    /// The validation fields of a code object (before 3.14).
    Code(u64),
    /// 3.12+: C stack around a thread's innermost entry frame (see [`ENTRY_WINDOW`](super::ENTRY_WINDOW)).
    Entries(u64),
}

/// One sample's prefetch: what to read (`keys`, `ranges`, as `predict` pushed them) and,
/// once fetched, where each range landed in `buf`. The physical plan (sorted, coalesced
/// iovecs and the index) is rebuilt only when the prediction differs from the previous
/// sample's; in steady state a fetch is one syscall and no hashing or sorting.
///
/// Order within the syscall: the kernel copies iovecs one after the other while the target
/// runs. Data stacks come first, every thread's (the newest part of each, then the older
/// part), then the rest by group (one per moving thread: its thread state, the words that
/// hold its current frame on 3.11/3.12, its frames elsewhere: generators', entry frames on
/// the C stack; last the shared group: interpreter state and the threads whose stacks held
/// still). Reading memory the target writes makes its next writes there slower (the lines
/// leave its cache): a thread state, the C stack and the interpreter state are written hardest
/// by allocation, exception handling and calls into C, so reading them before the frames
/// would slow exactly that code in the microsecond before the frames are copied, and the
/// frames would show it more often than it runs. The frames, copied first, are the stack of
/// one unperturbed instant; the pointer to the top, copied right after, only says
/// where the search for the top starts (see [`settle_top`](super::settle_top)).
#[derive(Default)]
pub(super) struct ReadPlan {
    pub(super) ranges: Vec<(u64, usize)>,
    pub(super) keys: Vec<Key>,
    /// Each range's (group, rank in its group), and the group `push` puts ranges in now.
    pub(super) slots: Vec<(u32, u8)>,
    pub(super) group: u32,
    pub(super) groups: u32,
    pub(super) buf: Vec<u8>,
    /// Each key's bytes in `buf` (position, length) and the address they were read from.
    pub(super) index: FxHashMap<Key, (usize, usize, u64)>,
    /// The prediction the plan below was built for.
    pub(super) plan_keys: Vec<Key>,
    pub(super) plan_ranges: Vec<(u64, usize)>,
    pub(super) plan_slots: Vec<(u32, u8)>,
    // The plan: physical reads (start, end), their offsets in `buf`, and for each logical
    // range its physical read and offset in it.
    pub(super) phys: Vec<(u64, u64)>,
    pub(super) offsets: Vec<usize>,
    pub(super) place: Vec<(usize, usize)>,
    pub(super) order: Vec<usize>,
}

impl ReadPlan {
    pub(super) fn clear(&mut self) {
        self.ranges.clear();
        self.keys.clear();
        self.slots.clear();
        self.group = 0;
        self.groups = 0;
    }
    /// Ranges pushed from now on, until [`ReadPlan::shared_group`], are read together after
    /// those of the groups before.
    pub(super) fn next_group(&mut self) {
        self.groups += 1;
        self.group = self.groups;
    }
    /// Ranges pushed from now on go to the shared group.
    pub(super) fn shared_group(&mut self) {
        self.group = 0;
    }
    pub(super) fn push(&mut self, key: Key, addr: u64, len: usize) {
        if len > 0 {
            let rank = match key {
                Key::RegionTop(_) => 0,
                Key::Region(_) => 1,
                Key::Tstate(_) => 2,
                Key::Word(_) | Key::CStack(_) => 3,
                Key::Frame(_) => 4,
                Key::Entries(_) => 5,
                _ => 6,
            };
            self.keys.push(key);
            self.ranges.push((addr, len));
            self.slots.push((self.group, rank));
        }
    }
    /// Sorts the ranges by group, rank (but in the shared group) and address, coalesces those
    /// of one group less than [`MERGE_GAP`] apart or in one page into one iovec (each iovec
    /// costs the kernel a lookup and a pin, a few hundred bytes more cost nothing) and indexes
    /// where every key's bytes will land.
    pub(super) fn plan(&mut self) {
        self.order.clear();
        self.order.extend(0..self.ranges.len());
        let (ranges, slots) = (&self.ranges, &self.slots);
        // The shared group by address only (its ranges merge best that way).
        self.order.sort_unstable_by_key(|&i| {
            let (group, rank) = slots[i];
            let frames_first = u8::from(rank > 1);
            match group {
                0 => (frames_first, u32::MAX, 0, ranges[i].0),
                g => (frames_first, g, rank, ranges[i].0),
            }
        });
        self.phys.clear();
        self.place.clear();
        self.place.resize(self.ranges.len(), (0, 0));
        let mut last_group = None;
        for &i in &self.order {
            let (addr, len) = self.ranges[i];
            let end = addr.saturating_add(len as u64);
            let same_group = last_group == Some(self.slots[i].0);
            last_group = Some(self.slots[i].0);
            match self.phys.last_mut() {
                Some((s, e))
                    if same_group
                        && addr >= *s
                        && (addr <= e.saturating_add(MERGE_GAP)
                            || addr <= (e.saturating_add(PAGE - 1) & !(PAGE - 1))) =>
                {
                    *e = (*e).max(end);
                }
                _ => self.phys.push((addr, end)),
            }
            let p = self.phys.len() - 1;
            self.place[i] = (p, (addr - self.phys[p].0) as usize);
        }
        self.offsets.clear();
        let mut total = 0usize;
        for &(s, e) in &self.phys {
            self.offsets.push(total);
            total += (e - s) as usize;
        }
        self.buf.clear();
        self.buf.resize(total, 0);
        self.index.clear();
        for (i, (k, r)) in self.keys.iter().zip(&self.ranges).enumerate() {
            let (p, off) = self.place[i];
            self.index.insert(*k, (self.offsets[p] + off, r.1, r.0));
        }
        self.plan_keys.clone_from(&self.keys);
        self.plan_ranges.clone_from(&self.ranges);
        self.plan_slots.clone_from(&self.slots);
    }
    /// Reads everything in one batch. A range that cannot be read (a thread that exited took
    /// its memory with it) is left out and the rest read again from after it: predictions are
    /// only hints, and a miss costs one more syscall, not the whole batch.
    pub(super) fn fetch<M: RemoteMemory>(&mut self, mem: &M) {
        if self.keys != self.plan_keys
            || self.ranges != self.plan_ranges
            || self.slots != self.plan_slots
        {
            self.plan();
        }
        let mut failed: Vec<usize> = Vec::new();
        let mut from = 0;
        while from < self.phys.len() {
            let n = self.phys.len() - from;
            let mut rest = &mut self.buf[self.offsets[from]..];
            let mut requests = self.phys[from..].iter().map(|&(s, e)| {
                let (head, tail) = std::mem::take(&mut rest).split_at_mut((e - s) as usize);
                rest = tail;
                ReadRequest::new(s, head)
            });
            // Up to STACK_IOVECS ranges (any steady-state sample but of a process with very
            // many threads) without allocating.
            let mut on_stack: [ReadRequest<'_>; STACK_IOVECS];
            let mut on_heap: Vec<ReadRequest<'_>>;
            let reqs: &mut [ReadRequest<'_>] = if n <= STACK_IOVECS {
                on_stack = std::array::from_fn(|_| {
                    requests
                        .next()
                        .unwrap_or_else(|| ReadRequest::new(0, &mut []))
                });
                &mut on_stack[..n]
            } else {
                on_heap = requests.collect();
                &mut on_heap
            };
            match mem.read_many(reqs) {
                Ok(()) => break,
                Err((i, e)) if !e.is_process_gone() => {
                    failed.push(from + i);
                    from += i + 1;
                }
                Err(_) => {
                    failed.extend(from..self.phys.len());
                    break;
                }
            }
        }
        if !failed.is_empty() {
            // Unread keys are absent this time; the plan is rebuilt next time.
            for (i, k) in self.keys.iter().enumerate() {
                if failed.contains(&self.place[i].0) {
                    self.index.insert(*k, (usize::MAX, 0, 0));
                }
            }
            self.plan_keys.clear();
        }
    }

    pub(super) fn get(&self, key: Key) -> Option<&[u8]> {
        let (pos, len) = self.locate(key)?;
        self.buf.get(pos..pos + len)
    }
    /// `len` bytes at `addr`, inside the range read under `key`, if it holds them.
    pub(super) fn within(&self, key: Key, addr: u64, len: usize) -> Option<&[u8]> {
        let &(pos, n, start) = self.index.get(&key)?;
        let off = usize::try_from(addr.checked_sub(start)?).ok()?;
        (off.checked_add(len)? <= n).then_some(())?;
        self.buf.get(pos.checked_add(off)?..pos + off + len)
    }
    /// Whether `key` was asked for but could not be read.
    pub(super) fn unread(&self, key: Key) -> bool {
        self.index.contains_key(&key) && self.locate(key).is_none()
    }
    /// Where `key`'s bytes are in `buf` (position, length), if they were read.
    pub(super) fn locate(&self, key: Key) -> Option<(usize, usize)> {
        let &(pos, len, _) = self.index.get(&key)?;
        (pos.checked_add(len)? <= self.buf.len()).then_some((pos, len))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bytes_within_a_range_are_found_only_inside_it() {
        let mut b = ReadPlan::default();
        b.next_group();
        b.push(Key::CStack(0x9000), 0x7000, 64);
        b.plan();
        let (pos, _) = b.locate(Key::CStack(0x9000)).expect("planned");
        b.buf[pos + 16..pos + 24].copy_from_slice(&7u64.to_le_bytes());
        assert_eq!(
            b.within(Key::CStack(0x9000), 0x7010, 8),
            Some(&7u64.to_le_bytes()[..])
        );
        assert_eq!(
            b.within(Key::CStack(0x9000), 0x7038, 8).map(<[u8]>::len),
            Some(8)
        );
        assert_eq!(b.within(Key::CStack(0x9000), 0x7039, 8), None);
        assert_eq!(b.within(Key::CStack(0x9000), 0x6ff8, 8), None);
        assert_eq!(b.within(Key::CStack(0xa000), 0x7010, 8), None);
    }

    #[test]
    fn data_stacks_are_copied_before_anything_else() {
        let mut b = ReadPlan::default();
        // Two moving threads and the shared group, pushed as `predict` does.
        b.shared_group();
        b.push(Key::Interp(0x100), 0x100, 64);
        for (t, stack) in [(0x9000u64, 0x7000_0000u64), (0xa000, 0x7100_0000)] {
            b.next_group();
            b.push(Key::Tstate(t), t, 256);
            b.push(Key::Region(stack), stack, 4096);
            b.push(Key::RegionTop(stack + 8192), stack + 8192, 4096);
            b.push(Key::Frame(0x7fff_0000 + t), 0x7fff_0000 + t, 80);
            b.push(Key::Entries(0x7ffe_0000 + t), 0x7ffe_0000 + t, 8192);
        }
        b.plan();
        let starts: Vec<u64> = b.phys.iter().map(|&(s, _)| s).collect();
        // Each thread's newest part, then its older part; then each thread's state, its
        // frames elsewhere and its C stack; the shared group last.
        assert_eq!(
            starts,
            [
                0x7000_2000,
                0x7000_0000,
                0x7100_2000,
                0x7100_0000,
                0x9000,
                0x7fff_9000,
                0x7ffe_9000,
                0xa000,
                0x7fff_a000,
                0x7ffe_a000,
                0x100,
            ]
        );
    }
}
