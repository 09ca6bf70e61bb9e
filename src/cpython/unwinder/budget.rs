//! What one sample may cost, whatever the target does: reads, syscalls, bytes, frames and
//! time, each a limit pyfleet sets. A sample over any of them fails as a counted `budget`
//! error; nothing a target controls makes a sample allocate or wait beyond them.

use super::*;

/// Most reads of a whole sample: the unwinder's one retry policy. A read that the target
/// changed under (`UnwindError::is_torn`: a torn frame chain, a frame freed mid-read) usually
/// reads whole a moment later, so it is made again at once, up to this many reads in all; no
/// other failure is read again (a budget spent, a target gone or refused would only be
/// spent again).
pub(super) const MAX_SAMPLE_READS: u32 = 6;

/// Most syscalls one sample makes, every read again included (a steady-state sample makes
/// one or two; 8,192 threads each read four times with their code objects stay far below).
pub(super) const MAX_SAMPLE_SYSCALLS: u64 = 65_536;

/// Longest one sample may take before it is given up as a counted `budget` error (a deep
/// stack of 65,536 frames reads in a few milliseconds): checked between reads, so that a
/// target whose reads are slow costs the fleet's one sampling thread this long at most per
/// sample, plus its first three reads (the clock starts after two, the steady state).
pub(super) const MAX_SAMPLE_TIME: Duration = Duration::from_millis(250);

/// Most bytes of stacks one sample reads, every thread and every read again together (a deep
/// stack of 65,536 frames is about 7 MiB).
pub(super) const MAX_SAMPLE_BYTES: usize = 64 << 20;

/// Most frames walked in one sample, every thread together.
pub(super) const MAX_SAMPLE_FRAMES: usize = 1 << 18;

/// Where the sample under way stands against its limits: bytes of stacks read, syscalls
/// made and time taken since it began ([`SampleBudget::begin`], at each sample, captured or
/// read).
#[derive(Debug, Default)]
pub(super) struct SampleBudget {
    bytes: usize,
    /// When the sample went past its first two reads (the steady state), and the syscalls
    /// made before it began.
    started: Cell<Option<Instant>>,
    syscalls_before: u64,
}

impl SampleBudget {
    /// A sample begins; `syscalls` is the count of the memory's reads so far.
    pub(super) fn begin(&mut self, syscalls: u64) {
        self.started.set(None);
        self.syscalls_before = syscalls;
        self.bytes = 0;
    }

    /// The sample's bytes of stacks read so far are `bytes` (its first batch).
    pub(super) fn set_bytes(&mut self, bytes: usize) {
        self.bytes = bytes;
    }

    /// A read of `bytes` more is about to be made: refused past [`MAX_SAMPLE_BYTES`].
    pub(super) fn add_bytes(&mut self, bytes: usize) -> Result<(), UnwindError> {
        self.bytes = self.bytes.saturating_add(bytes);
        match self.bytes > MAX_SAMPLE_BYTES {
            true => Err(UnwindError::Budget("bytes read in one sample")),
            false => Ok(()),
        }
    }

    /// The sample has time and syscalls left ([`MAX_SAMPLE_TIME`], [`MAX_SAMPLE_SYSCALLS`]);
    /// `syscalls` is the count of the memory's reads now.
    fn check(&self, syscalls: u64) -> Result<(), UnwindError> {
        let reads = syscalls.saturating_sub(self.syscalls_before);
        if reads > MAX_SAMPLE_SYSCALLS {
            return Err(UnwindError::Budget("reads in one sample"));
        }
        // The batch and one read more are the steady state: the clock is read past them only,
        // and the time counts from then.
        if reads <= 2 {
            return Ok(());
        }
        let started = self.started.get().unwrap_or_else(Instant::now);
        self.started.set(Some(started));
        if started.elapsed() > MAX_SAMPLE_TIME {
            return Err(UnwindError::Budget("time for one sample"));
        }
        Ok(())
    }
}

impl<M: RemoteMemory> Unwinder<M> {
    /// The sample under way has time and syscalls left: checked before each read beyond the
    /// first of a thread, and before each thread and each load of code objects.
    pub(super) fn check_budget(&self) -> Result<(), UnwindError> {
        self.budget.check(self.mem.stats().reads())
    }
}
