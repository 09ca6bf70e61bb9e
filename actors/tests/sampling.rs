//! The fleet's shared sampling thread, driven by fakes (tests/common): one OS thread samples
//! every process on one tick grid, a panicking source ends only its own slot, and a removed
//! slot's final batch reaches the snapshot.

mod common;

use std::collections::{BTreeSet, HashMap};
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use common::*;
use pyfleet_actors::{FleetConfig, ProcessState};
use pyfleet_policies::RatePolicy;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_thread_samples_twenty_processes_on_one_grid() {
    let world = World::new();
    let procs: Vec<_> = (0..20)
        .map(|i| {
            world.add(FakeProc::new(
                1000 + i,
                &format!("p{i}"),
                vec![(CPU, i as u64 + 1)],
            ))
        })
        .collect();
    let config = FleetConfig {
        rate: RatePolicy::new(50.0, 100.0).unwrap(),
        ..fast_config()
    };
    let h = start(config, &world).await;
    assert!(eventually(|| procs.iter().all(|p| p.ok() >= 1)).await);

    let before: Vec<u64> = procs.iter().map(|p| p.ok()).collect();
    let t0 = Instant::now();
    tokio::time::sleep(Duration::from_secs(1)).await;
    let after: Vec<u64> = procs.iter().map(|p| p.ok()).collect();
    let elapsed = t0.elapsed().as_secs_f64();
    let deltas: Vec<u64> = after.iter().zip(&before).map(|(a, b)| a - b).collect();
    for (p, n) in procs.iter().zip(&deltas) {
        let hz = *n as f64 / elapsed;
        assert!(
            (25.0..=55.0).contains(&hz),
            "pid {}: {hz:.1} Hz at 50 Hz",
            p.info.pid
        );
    }
    // Every tick samples every process: over the same window they got the same number of
    // samples (give or take the tick that was running while the counts were read).
    let spread = deltas.iter().max().unwrap() - deltas.iter().min().unwrap();
    assert!(spread <= 2, "samples per process over 1 s: {deltas:?}");

    // One OS thread sampled them all, and no attach ran on it.
    let (ids, names) = world.sampling_threads();
    assert_eq!(ids.len(), 1, "sampling threads: {names:?}");
    assert_eq!(
        names,
        BTreeSet::from(["pyfleet-samp-0".to_string()])
            .into_iter()
            .collect()
    );
    for p in &procs {
        let attached_on = p.attach_thread_names.lock().unwrap().clone();
        assert!(
            attached_on.iter().all(|n| !n.starts_with("pyfleet-samp")),
            "attached on {attached_on:?}"
        );
    }

    h.fleet.shutdown().await.expect("final snapshot");
    let snaps = h.writer.snapshots();
    for p in &procs {
        assert_eq!(total(&snaps, p.info.pid), p.ok());
        assert_eq!(
            p.drop_count(),
            1,
            "pid {}'s source dropped once",
            p.info.pid
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_panicking_source_ends_only_its_slot_and_its_sampler_restarts() {
    let world = World::new();
    // Panics at every 15th sample: each life takes a few samples, then panics.
    let bad =
        world.add(FakeProc::new(2001, "bad", vec![(CPU, 9)]).failures(Failures::PanicEvery(15)));
    let good: Vec<_> = (0..2)
        .map(|i| world.add(FakeProc::new(2002 + i, "good", vec![(CPU, 1), (IDLE, 2)])))
        .collect();
    let h = start(fast_config(), &world).await;
    assert!(eventually(|| good.iter().all(|p| p.ok() >= 1) && bad.ok() >= 1).await);

    let before: Vec<u64> = good.iter().map(|p| p.ok()).collect();
    let t0 = Instant::now();
    let status = status_when(&h.fleet, |s| s.restarts >= 2)
        .await
        .expect("the panicking sampler is restarted by the policy");
    let elapsed = t0.elapsed().as_secs_f64();
    // A restart is counted when its attach is started, on the blocking pool: the third attach
    // may still be under way.
    assert!(eventually(|| bad.attach_count() >= 3).await);
    assert!(bad.calls() >= 30, "two panics happened");
    // The others went on at full rate through the panics, never restarted.
    for (p, b) in good.iter().zip(&before) {
        let hz = (p.ok() - b) as f64 / elapsed;
        assert!(hz > 60.0, "pid {}: {hz:.1} Hz at 200 Hz", p.info.pid);
        assert_eq!(p.attach_count(), 1);
        assert_eq!(state_of(&status, p.info.pid), Some(ProcessState::Sampling));
    }
    // Every life of every process was sampled by the same single thread.
    let (ids, names) = world.sampling_threads();
    assert_eq!(ids.len(), 1, "sampling threads: {names:?}");

    h.fleet.shutdown().await.expect("final snapshot");
    // Each ended life's source was dropped, and its final batch (the samples before the
    // panic) made it into the snapshot.
    assert_eq!(bad.drop_count(), bad.attach_count());
    let snaps = h.writer.snapshots();
    assert_eq!(total(&snaps, 2001), bad.ok());
    for p in &good {
        // Two threads per sample.
        assert_eq!(total(&snaps, p.info.pid), 2 * p.ok());
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stopped_sampler_has_its_final_batch_flushed_and_its_source_dropped() {
    let world = World::new();
    let leaving = world.add(FakeProc::new(3001, "leaving", vec![(CPU, 1), (GIL, 2)]));
    let staying = world.add(FakeProc::new(3002, "staying", vec![(CPU, 3)]));
    // No batch is due on its own: only removal (and shutdown) sends one.
    let config = FleetConfig {
        batch_interval: Duration::from_secs(3600),
        ..fast_config()
    };
    let h = start(config, &world).await;
    assert!(eventually(|| leaving.ok() >= 10 && staying.ok() >= 10).await);

    // Discovery no longer lists it: the supervisor stops its sampler, which has the slot
    // removed from the sampling thread.
    leaving.listed.store(false, Ordering::SeqCst);
    assert!(
        eventually(|| leaving.drop_count() == 1).await,
        "source dropped"
    );
    let n = leaving.ok();
    let kept = staying.ok();
    assert!(
        eventually(|| staying.ok() >= kept + 20).await,
        "the thread goes on"
    );
    assert_eq!(leaving.ok(), n, "no sample after removal");
    assert_eq!(staying.drop_count(), 0);

    h.fleet.shutdown().await.expect("final snapshot");
    let snaps = h.writer.snapshots();
    assert_eq!(snaps.len(), 1, "only the final snapshot");
    assert_eq!(
        counts(&snaps, 3001),
        [((CPU, "f1".to_string()), n), ((GIL, "f2".to_string()), n)]
            .into_iter()
            .collect()
    );
    assert_eq!(total(&snaps, 3002), staying.ok());
    assert_eq!(staying.drop_count(), 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn several_sampling_threads_share_the_processes() {
    let world = World::new();
    let procs: Vec<_> = (0..4)
        .map(|i| world.add(FakeProc::new(4001 + i, "shared", vec![(CPU, 1)])))
        .collect();
    let config = FleetConfig {
        sampling_threads: 2,
        ..fast_config()
    };
    let h = start(config, &world).await;
    assert!(eventually(|| procs.iter().all(|p| p.ok() >= 5)).await);
    let (ids, names) = world.sampling_threads();
    assert_eq!(ids.len(), 2, "sampling threads: {names:?}");
    assert_eq!(
        names,
        ["pyfleet-samp-0", "pyfleet-samp-1"]
            .map(String::from)
            .into_iter()
            .collect()
    );
    // Each process stays on the one thread it was placed on.
    let mut per_thread = HashMap::new();
    for p in &procs {
        let threads = p.sample_threads.lock().unwrap().clone();
        assert_eq!(threads.len(), 1);
        *per_thread
            .entry(*threads.iter().next().unwrap())
            .or_insert(0) += 1;
    }
    assert_eq!(per_thread.len(), 2);
    h.fleet.shutdown().await.expect("final snapshot");
    let snaps = h.writer.snapshots();
    for p in &procs {
        assert_eq!(total(&snaps, p.info.pid), p.ok());
    }
}
