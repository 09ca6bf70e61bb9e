//! The root package's stack sources for the fleet's actors: [`UnwinderFactory`] attaches one
//! [`UnwinderSource`] (the unwinder of `cpython`) per process; [`Counted`] wraps a factory to
//! count the samples taken and failed across the fleet (for `record`'s progress line).
//!
//! Must not schedule anything (the actors decide when) nor format output (`output/` does).

use crate::cpython::{self, Unwinder, UnwinderOptions};
use crate::memory::ProcessMemory;
use pyfleet_actors::{
    FrameInfo, ProcessInfo, SampleError, SampleKind, SampledThread, SourceFactory, SourceStats,
    StackSource, ThreadStatus,
};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

/// Attaches the unwinder to each process.
#[derive(Debug, Clone, Copy, Default)]
pub struct UnwinderFactory {
    pub read_only: bool,
    /// Pause each target for its samples (`--blocking`).
    pub blocking: bool,
}

impl SourceFactory for UnwinderFactory {
    type Source = UnwinderSource;

    fn attach(&self, p: &ProcessInfo, needs_cpu_status: bool) -> Result<UnwinderSource, String> {
        let opts = UnwinderOptions {
            frame_cache: true,
            read_only: self.read_only,
            cpu_status: needs_cpu_status,
            blocking: self.blocking,
            ..Default::default()
        };
        let unwinder = cpython::attach(p.pid, opts).map_err(|e| e.to_string())?;
        Ok(UnwinderSource { unwinder })
    }
}

/// One process's unwinder, as the actors see it.
pub struct UnwinderSource {
    unwinder: Unwinder<ProcessMemory>,
}

impl StackSource for UnwinderSource {
    fn sample(&mut self, out: &mut Vec<SampledThread>) -> Result<SampleKind, SampleError> {
        // A target that changed its stack under the read (a torn frame chain, a frame freed
        // mid-read) usually reads fine a moment later: one immediate retry, so the profile
        // loses fewer samples. Both attempts count in the unwinder's own error stats.
        let first = self.unwinder.sample().map(|_| ());
        let result = match first {
            Err(e) if !e.is_process_gone() => self.unwinder.sample().map(|_| ()),
            other => other,
        };
        if let Err(e) = result {
            return Err(SampleError {
                kind: e.kind(),
                process_gone: e.is_process_gone(),
                message: e.to_string(),
            });
        }
        out.extend(self.unwinder.last_sample().iter().map(|t| SampledThread {
            thread_id: t.thread_id,
            status: ThreadStatus {
                on_cpu: t.on_cpu.unwrap_or(false),
                holds_gil: t.holds_gil,
            },
            stack: u64::from(t.stack),
        }));
        Ok(self.unwinder.last_kind())
    }

    fn resolve(&self, stack: u64) -> Option<Vec<FrameInfo>> {
        let frames = self.unwinder.stacks().resolve(u32::try_from(stack).ok()?)?;
        Some(
            frames
                .map(|f| FrameInfo {
                    function: f.function.qualname.clone(),
                    file: f.function.filename.clone(),
                    line: f.line,
                })
                .collect(),
        )
    }

    fn stats(&self) -> SourceStats {
        let s = self.unwinder.stats();
        SourceStats {
            samples: s.samples,
            errors: s.errors,
            frame_cache_hits: s.frame_cache_hits,
            frame_cache_partial_hits: s.frame_cache_partial_hits,
            frame_cache_misses: s.frame_cache_misses,
            code_cache_hits: s.code_cache_hits,
            code_cache_misses: s.code_cache_misses,
            remote_reads: s.remote_reads,
            remote_read_bytes: s.remote_read_bytes,
        }
    }
}

/// Samples taken and failed so far, across every source a [`Counted`] factory attached.
#[derive(Debug, Default)]
pub struct SampleCounters {
    samples: AtomicU64,
    errors: AtomicU64,
}

impl SampleCounters {
    /// Successful samples (one per process per tick).
    pub fn samples(&self) -> u64 {
        self.samples.load(Ordering::Relaxed)
    }

    /// Failed samples (not counting the one that finds a process gone).
    pub fn errors(&self) -> u64 {
        self.errors.load(Ordering::Relaxed)
    }
}

/// A factory whose sources count their samples and errors into shared [`SampleCounters`].
pub struct Counted<F> {
    pub inner: F,
    pub counters: Arc<SampleCounters>,
}

impl<F: SourceFactory> SourceFactory for Counted<F> {
    type Source = CountedSource<F::Source>;

    fn attach(&self, p: &ProcessInfo, needs_cpu_status: bool) -> Result<Self::Source, String> {
        Ok(CountedSource {
            inner: self.inner.attach(p, needs_cpu_status)?,
            counters: self.counters.clone(),
        })
    }
}

/// A source of a [`Counted`] factory.
pub struct CountedSource<S> {
    inner: S,
    counters: Arc<SampleCounters>,
}

impl<S: StackSource> StackSource for CountedSource<S> {
    fn sample(&mut self, out: &mut Vec<SampledThread>) -> Result<SampleKind, SampleError> {
        let r = self.inner.sample(out);
        match &r {
            Ok(_) => self.counters.samples.fetch_add(1, Ordering::Relaxed),
            // The process exiting is how a recording ends, not a failure.
            Err(e) if e.process_gone => 0,
            Err(_) => self.counters.errors.fetch_add(1, Ordering::Relaxed),
        };
        r
    }

    fn resolve(&self, stack: u64) -> Option<Vec<FrameInfo>> {
        self.inner.resolve(stack)
    }

    fn stats(&self) -> SourceStats {
        self.inner.stats()
    }
}
