//! `pyfleet bench`: what sampling one process costs, read by read, and the bare-read floor
//! of a fleet.

use anyhow::{Context, Result};
use pyfleet::cpython::{self, SampleKind};

/// How far up `consent` follows a target's parents.
const MAX_ANCESTORS: usize = 16;

/// `bench` samples flat out: on a process that serves users, that is a cost to them. Without
/// `--yes`, only a target that descends from pyfleet's parent (the shell that started both, or
/// a script's own target) is benchmarked; anything else gets one line saying what it would
/// cost and how to go ahead.
pub fn consent(pid: i32, duration: f64) -> Result<()> {
    let parent_of = |p: i32| pyfleet::process::parent_and_start(p).map(|(parent, _)| parent);
    let ours = std::os::unix::process::parent_id() as i32;
    // A descendant of pyfleet's parent (through `unshare`, `taskset`, a venv's launcher, ...).
    let mut p = pid;
    for _ in 0..MAX_ANCESTORS {
        match parent_of(p) {
            Some(q) if q == ours && ours > 1 => return Ok(()),
            Some(q) if q > 1 => p = q,
            _ => break,
        }
    }
    anyhow::bail!(
        "bench samples process {pid} as fast as it can for {duration} s (about a core of \
         pyfleet's CPU, tens of thousands of reads a second, and on 3.15 a write to the target \
         per sample); it was not started from this shell: give --yes to go ahead"
    )
}

pub fn run(
    pid: i32,
    duration: f64,
    rate: Option<f64>,
    switch_log: bool,
    opts: cpython::UnwinderOptions,
    floor: bool,
    json: bool,
) -> Result<()> {
    use pyfleet::memory::RemoteMemory;
    use pyfleet::process::own_thread_cpu_ns;
    use std::time::{Duration, Instant};

    if switch_log {
        super::fleet_runtime::start_switch_log();
    }
    let mut unwinder = cpython::attach(pid, opts)?;
    let version = unwinder.layout().version;
    let limit = Duration::from_secs_f64(duration);
    let (cpu0, start) = (own_thread_cpu_ns(), Instant::now());
    let mut iterations = 0u64;
    let mut threads = 0usize;
    let mut last_error = None;
    // Failed samples by reason (the message without its addresses), at most 32 reasons.
    let mut reasons: std::collections::BTreeMap<String, u64> = Default::default();
    // Successful samples by kind (kept, checked, read: see `pyfleet_sample_kinds_total`),
    // with the wall time they took.
    let mut kinds = [(0u64, 0f64); 3];
    // Time inside samples (without the pauses of --rate).
    let mut sampling_secs = 0f64;
    if floor {
        let addr = unwinder.runtime_address();
        let mem = unwinder.memory();
        while start.elapsed() < limit {
            for _ in 0..64 {
                mem.read_u64(addr)
                    .with_context(|| format!("reading process {pid}"))?;
            }
            iterations += 64;
        }
    } else {
        let period = rate.map(|r| Duration::from_secs_f64(1.0 / r));
        let mut next = start;
        while start.elapsed() < limit {
            if let Some(p) = period {
                next += p;
                std::thread::sleep(next.saturating_duration_since(Instant::now()));
            }
            let began = Instant::now();
            let result = unwinder.sample().map(|s| s.len());
            let took = began.elapsed().as_secs_f64();
            sampling_secs += took;
            if result.is_ok() {
                let k = match unwinder.last_kind() {
                    SampleKind::Kept => 0,
                    SampleKind::Checked => 1,
                    SampleKind::Read => 2,
                };
                kinds[k].0 += 1;
                kinds[k].1 += took;
            }
            match result {
                Ok(n) => threads = n,
                Err(e) if e.is_process_gone() => {
                    anyhow::bail!("process {pid} exited during the benchmark")
                }
                Err(e) => {
                    let msg = e.to_string();
                    let reason: String = msg
                        .split(' ')
                        .filter(|w| !w.starts_with("0x"))
                        .collect::<Vec<_>>()
                        .join(" ");
                    if reasons.len() < 32 || reasons.contains_key(&reason) {
                        *reasons.entry(reason).or_default() += 1;
                    }
                    last_error = Some(msg);
                }
            }
            iterations += 1;
        }
    }
    let wall = start.elapsed();
    let cpu_ns = match (cpu0, own_thread_cpu_ns()) {
        (Some(a), Some(b)) => b.saturating_sub(a),
        _ => 0,
    };
    let st = unwinder.stats();
    let n = iterations.max(1) as f64;
    let (functions, frames, stacks) = unwinder.stacks().len();
    let sample_kinds: serde_json::Map<String, serde_json::Value> = ["kept", "checked", "read"]
        .iter()
        .zip(kinds)
        .map(|(kind, (count, secs))| {
            let mean_us = if count == 0 {
                0.0
            } else {
                secs * 1e6 / count as f64
            };
            let v = serde_json::json!({ "samples": count, "mean_us": mean_us });
            (kind.to_string(), v)
        })
        .collect();
    let doc = serde_json::json!({
        "pid": pid,
        "python_version": version.to_string(),
        "mode": if floor { "floor" } else if opts.read_only { "read-only" }
                else if opts.frame_cache { "frame-cache" } else { "no-frame-cache" },
        "skip_idle": opts.skip_idle && !floor,
        "duration_s": wall.as_secs_f64(),
        "samples": if floor { iterations } else { st.samples },
        "errors": st.errors,
        "errors_by_reason": reasons,
        "mean_us": if floor { wall.as_secs_f64() } else { sampling_secs } * 1e6 / n,
        "cpu_us": cpu_ns as f64 / 1e3 / n,
        "threads": threads,
        "frame_cache_hits": st.frame_cache_hits,
        "frame_cache_partial_hits": st.frame_cache_partial_hits,
        "frame_cache_misses": st.frame_cache_misses,
        "frames_from_cache": st.frames_from_cache,
        "frames_from_memory": st.frames_from_memory,
        "code_cache_hits": st.code_cache_hits,
        "code_cache_misses": st.code_cache_misses,
        "stale_invalidations": st.stale_invalidations,
        "rereads": st.rereads,
        "resamples": st.resamples,
        "marker_writes": st.marker_writes,
        "table_resets": st.table_resets,
        "cache_drops": st.cache_drops,
        "threads_unchanged": st.threads_unchanged,
        "samples_unchanged": st.samples_unchanged,
        "sample_kinds": sample_kinds,
        "rate_hz": rate,
        "remote_reads": st.remote_reads,
        "remote_read_bytes": st.remote_read_bytes,
        "reads_per_sample": st.remote_reads as f64 / n,
        "functions": functions,
        "frames": frames,
        "stacks": stacks,
    });
    if json {
        outln!("{doc}");
    } else {
        outln!(
            "pyfleet bench: pid {pid}, Python {version}, {:.1} s",
            wall.as_secs_f64()
        );
        if let serde_json::Value::Object(map) = &doc {
            for (k, v) in map {
                outln!("  {k:<26} {v}");
            }
        }
        if !floor {
            let secs = wall.as_secs_f64();
            outln!(
                "what it cost: {} samples of process {pid} in {secs:.1} s ({:.0} a second), \
                 {:.0} MB read from its memory, {} writes to it (the 3.15 marker), {:.2} s of \
                 pyfleet's CPU. The target was never stopped, but reads back to back slow a \
                 busy one (measured: to about two thirds of its speed; docs/reference.md, \
                 \"What bench costs\")",
                st.samples,
                st.samples as f64 / secs.max(1e-9),
                st.remote_read_bytes as f64 / 1e6,
                st.marker_writes,
                cpu_ns as f64 / 1e9
            );
        }
    }
    if let Some(e) = last_error {
        eprintln!("pyfleet: last sampling error: {e}");
    }
    Ok(())
}

/// The fleet floor: one bare 8-byte `process_vm_readv` per target per round, rounds paced at
/// `rate` on one thread (as the daemon's sampling thread paces its samples). What any
/// profiler reading these targets at this rate must at least spend on this machine.
pub fn fleet_floor(pids: &[i32], rate: f64, duration: f64, json: bool) -> Result<()> {
    use pyfleet::memory::{ProcessMemory, RemoteMemory};
    use std::time::{Duration, Instant};
    if !(rate.is_finite() && rate > 0.0 && rate <= 10_000.0) {
        anyhow::bail!("--rate must be a positive number of rounds per second, at most 10000");
    }
    let mut targets = Vec::new();
    for &pid in pids {
        let unwinder = cpython::attach(
            pid,
            cpython::UnwinderOptions {
                read_only: true,
                ..Default::default()
            },
        )?;
        targets.push((ProcessMemory::new(pid), unwinder.runtime_address()));
    }
    let period = Duration::from_secs_f64(1.0 / rate);
    let limit = Duration::from_secs_f64(duration);
    let cpu0 = pyfleet::process::own_thread_cpu_ns();
    let start = Instant::now();
    let (mut next, mut rounds, mut reads) = (start, 0u64, 0u64);
    while start.elapsed() < limit {
        for (mem, addr) in &targets {
            if mem.read_u64(*addr).is_ok() {
                reads += 1;
            }
        }
        rounds += 1;
        next += period;
        let now = Instant::now();
        if next > now {
            std::thread::sleep(next - now);
        } else {
            next = now;
        }
    }
    let wall = start.elapsed().as_secs_f64();
    let cpu_ns = match (cpu0, pyfleet::process::own_thread_cpu_ns()) {
        (Some(a), Some(b)) => b.saturating_sub(a),
        _ => 0,
    };
    let doc = serde_json::json!({
        "mode": "fleet-floor",
        "processes": targets.len(),
        "rate_hz": rate,
        "duration_s": wall,
        "rounds": rounds,
        "reads": reads,
        "cpu_percent_of_one_core": cpu_ns as f64 / 1e9 / wall * 100.0,
        "cpu_us_per_read": cpu_ns as f64 / 1e3 / reads.max(1) as f64,
    });
    if json {
        outln!("{doc}");
    } else {
        outln!(
            "fleet floor: {} processes at {rate} Hz: {:.2}% of one core ({:.2} µs per read)",
            targets.len(),
            doc["cpu_percent_of_one_core"].as_f64().unwrap_or(0.0),
            doc["cpu_us_per_read"].as_f64().unwrap_or(0.0)
        );
    }
    Ok(())
}
