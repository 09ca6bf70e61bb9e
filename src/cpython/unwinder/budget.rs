//! What one sample may cost, whatever the target does: reads, syscalls, bytes, frames and
//! time, each a limit pyfleet sets. A sample over any of them fails as a counted `budget`
//! error; nothing a target controls makes a sample allocate or wait beyond them.

use super::*;

/// Most reads of a whole sample (see `Unwinder::sample`).
pub(super) const MAX_SAMPLE_READS: u32 = 3;

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

impl<M: RemoteMemory> Unwinder<M> {
    /// The sample under way has time and syscalls left ([`MAX_SAMPLE_TIME`],
    /// [`MAX_SAMPLE_SYSCALLS`]): checked before each read beyond the first of a thread, and
    /// before each thread and each load of code objects.
    pub(super) fn check_budget(&self) -> Result<(), UnwindError> {
        let reads = self
            .mem
            .stats()
            .reads()
            .saturating_sub(self.syscalls_before);
        if reads > MAX_SAMPLE_SYSCALLS {
            return Err(UnwindError::Budget("reads in one sample"));
        }
        // The batch and one read more are the steady state: the clock is read past them only,
        // and the time counts from then.
        if reads <= 2 {
            return Ok(());
        }
        let started = self.sample_started.get().unwrap_or_else(Instant::now);
        self.sample_started.set(Some(started));
        if started.elapsed() > MAX_SAMPLE_TIME {
            return Err(UnwindError::Budget("time for one sample"));
        }
        Ok(())
    }
}
