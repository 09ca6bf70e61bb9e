//! The code-object cache: a bounded LRU (entries and bytes) keyed by address, loaded and
//! validated in batches. 3.14+ validate entries with the interpreter's
//! `code_object_generation`; older versions compare each object's fingerprint (name, file,
//! line-table pointers) every sample, prefetched with the sample's batch.

use super::*;

/// Code objects loaded after a sample because a frame of theirs stopped the search for a top.
pub(super) const MAX_CALLEE_CODES: usize = 4;

/// Addresses remembered as no code object's (so that they are not read again each sample).
pub(super) const MAX_NOT_CODE: usize = 64;

/// Failed samples in a row after which the cached code objects are dropped and loaded again:
/// an entry read while its object changed (or freed and reused with the same fingerprint)
/// would otherwise fail, or mislabel, every sample it is in for as long as it is cached.
pub(super) const FORGET_AFTER_FAILURES: u32 = 8;

/// Set in stamps that are epochs rather than code-object generations.
const EPOCH_STAMP: u64 = 1 << 63;

/// Most code objects loaded in one sample.
pub(super) const MAX_CODES_PER_SAMPLE: usize = 1024;

/// Most bytes of code objects (names, decoded line tables) one unwinder keeps.
pub(super) const MAX_CODE_CACHE_BYTES: usize = 8 << 20;

/// The cached code objects and what the cache knows besides. Invariant: `bytes` is the sum of
/// [`entry_bytes`] over the entries, at most [`MAX_CODE_CACHE_BYTES`] (the least recently used
/// leave first), and every way in or out of `entries` goes through the methods that keep it.
pub(super) struct CodeCache {
    entries: LruCache<u64, CodeEntry, FxBuildHasher>,
    bytes: usize,
    /// An entry was found stale (and dropped) during the sample under way.
    pub(super) changed: bool,
    /// The distinct code objects of the last sample: their validation fields are prefetched
    /// with the next sample's batch (before 3.14), so validating costs no syscall of its own.
    pub(super) previous: Vec<u64>,
    /// Code objects of frames that stopped the search for a top (see `walk`), loaded after
    /// the sample (at most [`MAX_CALLEE_CODES`]).
    pub(super) callees: Vec<u64>,
    /// Addresses found to be no code object's (the newest [`MAX_NOT_CODE`]).
    not_code: Vec<u64>,
    /// The stamp of the last sample: what an entry valid then has as `valid_at`.
    pub(super) stamp: u64,
}

impl CodeCache {
    /// An empty cache of at most `capacity` entries.
    pub(super) fn new(capacity: NonZeroUsize) -> CodeCache {
        CodeCache {
            entries: LruCache::with_hasher(capacity, FxBuildHasher),
            bytes: 0,
            changed: false,
            previous: Vec::new(),
            callees: Vec::new(),
            not_code: Vec::new(),
            stamp: 0,
        }
    }

    pub(super) fn peek(&self, addr: &u64) -> Option<&CodeEntry> {
        self.entries.peek(addr)
    }

    pub(super) fn peek_mut(&mut self, addr: &u64) -> Option<&mut CodeEntry> {
        self.entries.peek_mut(addr)
    }

    /// The entry, made the most recently used.
    pub(super) fn get(&mut self, addr: &u64) -> Option<&CodeEntry> {
        self.entries.get(addr)
    }

    /// Caches a code object, the least recently used ones leaving first when the cache would
    /// hold more than [`MAX_CODE_CACHE_BYTES`] (or its entry count).
    pub(super) fn insert(&mut self, addr: u64, entry: CodeEntry) {
        let size = entry_bytes(&entry);
        while self.bytes + size > MAX_CODE_CACHE_BYTES {
            match self.entries.pop_lru() {
                Some((_, old)) => self.bytes = self.bytes.saturating_sub(entry_bytes(&old)),
                None => break,
            }
        }
        self.bytes += size;
        if let Some((_, old)) = self.entries.push(addr, entry) {
            self.bytes = self.bytes.saturating_sub(entry_bytes(&old));
        }
    }

    /// Drops an entry that may have been read torn: it is loaded again when next needed.
    pub(super) fn forget(&mut self, addr: u64) {
        if let Some(e) = self.entries.pop(&addr) {
            self.bytes = self.bytes.saturating_sub(entry_bytes(&e));
        }
    }

    /// Drops an entry found stale (its object is another one now), noting the change.
    pub(super) fn invalidate(&mut self, addr: u64) {
        self.changed = true;
        self.forget(addr);
    }

    /// Drops every entry and what was found to be no code object.
    pub(super) fn clear(&mut self) {
        self.entries.clear();
        self.bytes = 0;
        self.previous.clear();
        self.not_code.clear();
    }

    pub(super) fn is_not_code(&self, addr: u64) -> bool {
        self.not_code.contains(&addr)
    }

    /// Remembers an address as no code object's, the oldest forgotten past [`MAX_NOT_CODE`].
    pub(super) fn mark_not_code(&mut self, addr: u64) {
        if self.not_code.len() >= MAX_NOT_CODE {
            self.not_code.remove(0);
        }
        self.not_code.push(addr);
    }
}

pub(super) struct CodeEntry {
    pub(super) function: FunctionId,
    pub(super) info: Arc<CodeInfo>,
    pub(super) fingerprint: u64,
    /// Generation (3.14+) or sample epoch (older) when last known valid.
    pub(super) valid_at: u64,
}

impl<M: RemoteMemory> Unwinder<M> {
    /// Makes sure every code object walked this sample is cached and valid: one batch of
    /// validations, one batch of loads.
    /// `generation`: the interpreter's `code_object_generation` read with the sample (used on
    /// 3.14+; older versions compare fingerprints, once per sample).
    pub(super) fn resolve_codes(
        &mut self,
        b: &ReadPlan,
        generation: u64,
    ) -> Result<(), UnwindError> {
        self.codes.changed = false;
        let generation =
            Some(generation).filter(|_| self.layout.interp.code_object_generation.is_some());
        // Epoch stamps live apart from generations (top bit set), so that one never passes
        // for the other when both kinds of sample run on one unwinder.
        let stamp = generation.unwrap_or(self.epoch | EPOCH_STAMP);
        self.codes.stamp = stamp;
        let (fp_lo, fp_len) = fingerprint_span(&self.layout);

        // Distinct code objects of this sample, each counted once as a hit or a miss.
        let mut distinct = std::mem::take(&mut self.spare.codes);
        distinct.clear();
        distinct.extend(
            self.spare
                .raws
                .iter()
                .filter(|r| !r.shim && r.code != 0)
                .map(|r| r.code),
        );
        distinct.sort_unstable();
        distinct.dedup();
        let mut check = std::mem::take(&mut self.spare.check);
        let mut load = std::mem::take(&mut self.spare.load);
        check.clear();
        load.clear();
        for &a in &distinct {
            match self.codes.peek(&a) {
                Some(e) if e.valid_at == stamp => self.stats.code_cache_hits += 1,
                Some(_) => check.push(a),
                None => load.push(a),
            }
        }
        if !check.is_empty() {
            // Prefetched with the batch when the code object was in the last sample too.
            let mut buf = std::mem::take(&mut self.spare.fingerprints);
            buf.clear();
            buf.resize(fp_len * check.len(), 0);
            let mut unread = Vec::new();
            for (i, (&a, slot)) in check.iter().zip(buf.chunks_exact_mut(fp_len)).enumerate() {
                match b.get(Key::Code(a)) {
                    Some(v) if v.len() == fp_len => slot.copy_from_slice(v),
                    _ => unread.push(i),
                }
            }
            if !unread.is_empty() {
                let mut more = vec![0u8; fp_len * unread.len()];
                read_chunks(
                    &self.mem,
                    unread
                        .iter()
                        .map(|&i| (check[i].wrapping_add(fp_lo), fp_len)),
                    &mut more,
                )?;
                for (&i, v) in unread.iter().zip(more.chunks_exact(fp_len)) {
                    buf[i * fp_len..(i + 1) * fp_len].copy_from_slice(v);
                }
            }
            for (&a, fp) in check.iter().zip(buf.chunks_exact(fp_len)) {
                let fp = fingerprint(fp);
                let fresh = match self.codes.peek_mut(&a) {
                    Some(e) if e.fingerprint == fp => {
                        e.valid_at = stamp;
                        true
                    }
                    _ => false,
                };
                if fresh {
                    self.stats.code_cache_hits += 1;
                } else {
                    self.stats.stale_invalidations += 1;
                    self.codes.invalidate(a);
                    load.push(a);
                }
            }
            self.spare.fingerprints = buf;
        }
        self.stats.code_cache_misses += load.len() as u64;
        // Past the per-sample bound, the first ones are loaded and the sample fails: the
        // next samples load the rest.
        let over = load.len() > MAX_CODES_PER_SAMPLE;
        load.truncate(MAX_CODES_PER_SAMPLE);
        if !load.is_empty() {
            self.check_budget()?;
            let entries = self.read_code_entries(&load, stamp)?;
            for (&a, entry) in load.iter().zip(entries) {
                // Every frame but the interpreter's shims runs a code object: one that does
                // not was read while it changed (its bytes are another frame's, or none), and
                // the sample is read again or fails; it is never shortened.
                self.codes.insert(a, entry?);
            }
        }
        self.spare.codes = std::mem::replace(&mut self.codes.previous, distinct);
        self.spare.check = check;
        self.spare.load = load;
        match over {
            true => Err(UnwindError::Budget("new code objects in one sample")),
            false => Ok(()),
        }
    }

    /// Reads code objects (what a stack needs of them, and their fingerprints) into cache
    /// entries valid at `stamp`: one per address, or why it is no code object.
    pub(super) fn read_code_entries(
        &mut self,
        addrs: &[u64],
        stamp: u64,
    ) -> Result<Vec<Result<CodeEntry, UnwindError>>, UnwindError> {
        let codes = read_codes(&self.mem, &self.layout, self.code_type, addrs)?;
        Ok(codes
            .into_iter()
            .map(|code| {
                let LoadedCode { info, fingerprint } = code?;
                let info = Arc::new(info);
                Ok(CodeEntry {
                    function: self.table.function(info.function()),
                    info,
                    fingerprint,
                    valid_at: stamp,
                })
            })
            .collect())
    }

    /// Loads, best effort, the code objects of frames that stopped the search for a top
    /// (their size was unknown, see `walk`); what is no code object is remembered as such.
    pub(super) fn load_callee_codes(&mut self) {
        let mut pending = std::mem::take(&mut self.codes.callees);
        pending.retain(|c| self.codes.peek(c).is_none());
        if pending.is_empty() {
            self.codes.callees = pending;
            return;
        }
        // Stamped 0: validated as any cached one before its first use in a stack.
        let entries: Vec<Option<_>> = match self.read_code_entries(&pending, 0) {
            Ok(entries) => entries.into_iter().map(Some).collect(),
            Err(_) => pending.iter().map(|_| None).collect(),
        };
        for (&a, entry) in pending.iter().zip(entries) {
            match entry {
                Some(Ok(entry)) => self.codes.insert(a, entry),
                _ => self.codes.mark_not_code(a),
            }
        }
        pending.clear();
        self.codes.callees = pending;
    }

    /// Drops every cached code object (and what was found to be none), with the threads'
    /// caches that refer to them.
    pub(super) fn forget_codes(&mut self) {
        self.codes.clear();
        self.threads.clear();
    }
}

/// What a cached code object costs in memory (roughly: its strings and decoded line table).
pub(super) fn entry_bytes(e: &CodeEntry) -> usize {
    let i = &e.info;
    std::mem::size_of::<CodeEntry>()
        + std::mem::size_of::<CodeInfo>()
        + i.name.len()
        + i.qualname.len()
        + i.filename.len()
        + i.lines.len() * std::mem::size_of::<crate::cpython::linetable::LineRange>()
}
