//! The actors end to end, driven by fakes (tests/common): supervision, restarts, exits,
//! aggregation per mode, shutdown flushing and rate changes. The shared sampling thread itself
//! is tested in tests/sampling.rs.

mod common;

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use common::*;
use pyfleet_actors::{FleetConfig, ProcessState, PushSchedule, WindowPusher};
use pyfleet_policies::{Mode, RatePolicy, RestartPolicy};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn panicking_source_backs_off_then_is_given_up_while_others_run() {
    let world = World::new();
    let bad = world.add(FakeProc::new(101, "bad", vec![(CPU, 1)]).failures(Failures::Panic));
    let good = world.add(FakeProc::new(102, "good", vec![(CPU, 2)]));
    let h = start(fast_config(), &world).await;

    let status = status_when(&h.fleet, |s| {
        state_of(s, 101) == Some(ProcessState::GivenUp)
    })
    .await
    .expect("the panicking process is given up on");
    // max_restarts = 3: the first start and three restarts, then the fourth failure gives up.
    assert_eq!(bad.attach_count(), 4);
    assert_eq!(status.restarts, 3);
    assert_eq!(state_of(&status, 102), Some(ProcessState::Sampling));
    // Backoff: 20, 40, 80 ms (no jitter) at least between starts.
    let attaches = bad.attaches.lock().unwrap().clone();
    for (i, pair) in attaches.windows(2).enumerate() {
        let backoff = Duration::from_millis(20 << i);
        assert!(
            pair[1] - pair[0] >= backoff,
            "restart {} came after {:?}, before its backoff {backoff:?}",
            i + 1,
            pair[1] - pair[0]
        );
    }

    // Given up for good while listed; the healthy one keeps being sampled.
    let before = good.ok();
    let scans = world.scans.load(std::sync::atomic::Ordering::SeqCst);
    assert!(
        eventually(
            || world.scans.load(std::sync::atomic::Ordering::SeqCst) >= scans + 4
                && good.ok() > before + 10
        )
        .await
    );
    assert_eq!(bad.attach_count(), 4, "a given-up pid is never respawned");

    // The supervisor still works: a new process gets a sampler.
    let newcomer = world.add(FakeProc::new(103, "new", vec![(IDLE, 3)]));
    assert!(eventually(|| newcomer.attach_count() == 1).await);

    h.fleet.shutdown().await.expect("final snapshot");
    let snaps = h.writer.snapshots();
    assert_eq!(total(&snaps, 102), good.ok());
    assert_eq!(total(&snaps, 101), 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failing_attach_goes_through_the_restart_policy() {
    let world = World::new();
    let denied = world.add(FakeProc::new(111, "denied", vec![(CPU, 1)]).failures(Failures::Attach));
    let h = start(fast_config(), &world).await;
    let status = status_when(&h.fleet, |s| {
        state_of(s, 111) == Some(ProcessState::GivenUp)
    })
    .await
    .expect("given up after the cap");
    assert_eq!((denied.attach_count(), status.restarts), (4, 3));
    h.fleet.shutdown().await.expect("final snapshot");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_attach_that_finds_the_process_ending_is_an_exit_not_a_failure() {
    let world = World::new();
    let ending =
        world.add(FakeProc::new(112, "ending", vec![(CPU, 1)]).failures(Failures::AttachEnded));
    let h = start(fast_config(), &world).await;
    let status = status_when(&h.fleet, |s| state_of(s, 112) == Some(ProcessState::Exited))
        .await
        .expect("seen as exited");
    assert_eq!((status.exits, status.restarts), (1, 0));
    // Not attached again while discovery lists it.
    tokio::time::sleep(Duration::from_millis(200)).await;
    assert_eq!(ending.attach_count(), 1);
    h.fleet.shutdown().await.expect("final snapshot");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sample_errors_below_the_limit_are_counted_and_sampling_goes_on() {
    let world = World::new();
    let flaky =
        world.add(FakeProc::new(201, "flaky", vec![(CPU, 1)]).failures(Failures::EveryOther));
    let config = FleetConfig {
        max_consecutive_errors: 2,
        ..fast_config()
    };
    let h = start(config, &world).await;

    assert!(eventually(|| flaky.ok() >= 30).await);
    let status = h.fleet.status().await.unwrap();
    assert_eq!(state_of(&status, 201), Some(ProcessState::Sampling));
    assert_eq!(status.restarts, 0);
    assert_eq!(flaky.attach_count(), 1);

    h.fleet.shutdown().await.expect("final snapshot");
    // Every successful sample is in the snapshot, failed ones are not.
    let snaps = h.writer.snapshots();
    assert_eq!(total(&snaps, 201), flaky.ok());
    assert!(flaky.calls() >= 2 * flaky.ok() - 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn too_many_consecutive_errors_fail_the_sampler_and_it_restarts() {
    let world = World::new();
    let broken = world.add(FakeProc::new(202, "broken", vec![(CPU, 1)]).failures(Failures::Always));
    let config = FleetConfig {
        max_consecutive_errors: 5,
        restart: RestartPolicy {
            initial_backoff: Duration::from_millis(10),
            max_backoff: Duration::from_millis(20),
            max_restarts: 1000,
            ..fast_config().restart
        },
        ..fast_config()
    };
    let h = start(config, &world).await;

    let status = status_when(&h.fleet, |s| s.restarts >= 2)
        .await
        .expect("the failing sampler is restarted");
    assert!(status.restarts >= 2);
    h.fleet.shutdown().await.expect("final snapshot");
    // Each life ends after exactly five errors in a row. The last one may have been stopped
    // by the shutdown anywhere from before its first tick (a new slot joins the sampling
    // thread's grid at its next tick) to its fifth error.
    let lives = broken.attach_count() as u64;
    let calls = broken.calls();
    assert!(lives >= 3, "{lives} lives");
    assert!(
        calls <= 5 * lives && calls >= 5 * (lives - 1),
        "{calls} calls in {lives} lives"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_process_that_exits_ends_its_sampler_cleanly_without_restart() {
    let world = World::new();
    // Gone after 10 samples; discovery stops listing it at the same moment.
    let gone = world.add(
        FakeProc::new(301, "short", vec![(CPU, 1), (IDLE, 2)])
            .limit(10, AfterLimit::Gone { unlist: true }),
    );
    // Gone after 10 samples, but discovery still lists it for a while (a zombie).
    let zombie = world.add(
        FakeProc::new(302, "zombie", vec![(CPU, 1)]).limit(10, AfterLimit::Gone { unlist: false }),
    );
    // Discovery stops listing it while its source still works.
    let unlisted = world.add(FakeProc::new(303, "unlisted", vec![(GIL, 3)]));
    let h = start(fast_config(), &world).await;

    assert!(eventually(|| unlisted.ok() >= 5).await);
    unlisted
        .listed
        .store(false, std::sync::atomic::Ordering::SeqCst);

    let status = status_when(&h.fleet, |s| {
        state_of(s, 301).is_none()
            && state_of(s, 302) == Some(ProcessState::Exited)
            && state_of(s, 303).is_none()
    })
    .await
    .expect("all three end");
    assert_eq!(status.exits, 3);
    assert_eq!(status.restarts, 0);

    // Several scans later: nothing was restarted or counted twice.
    let scans = world.scans.load(std::sync::atomic::Ordering::SeqCst);
    assert!(
        eventually(|| world.scans.load(std::sync::atomic::Ordering::SeqCst) >= scans + 4).await
    );
    let status = h.fleet.status().await.unwrap();
    assert_eq!((status.exits, status.restarts), (3, 0));
    assert_eq!(state_of(&status, 302), Some(ProcessState::Exited));
    for p in [&gone, &zombie, &unlisted] {
        assert_eq!(p.attach_count(), 1, "pid {} attached again", p.info.pid);
    }

    h.fleet.shutdown().await.expect("final snapshot");
    let snaps = h.writer.snapshots();
    // The final batches of ended samplers made it into the snapshot.
    assert_eq!(total(&snaps, 301), 20);
    assert_eq!(total(&snaps, 302), 10);
    assert_eq!(total(&snaps, 303), unlisted.ok());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_new_process_gets_a_sampler_within_one_scan_interval() {
    let world = World::new();
    let first = world.add(FakeProc::new(401, "first", vec![(CPU, 1)]));
    let scan = Duration::from_millis(200);
    let config = FleetConfig {
        scan_interval: scan,
        ..fast_config()
    };
    let h = start(config, &world).await;
    assert!(eventually(|| first.attach_count() == 1).await);

    let appeared = Instant::now();
    let second = world.add(FakeProc::new(402, "second", vec![(CPU, 1)]));
    assert!(eventually(|| second.attach_count() == 1).await);
    let waited = second.attaches.lock().unwrap()[0] - appeared;
    // One scan interval, plus slack for a loaded machine.
    assert!(
        waited <= scan + Duration::from_millis(300),
        "sampler started {waited:?} after the process appeared"
    );
    h.fleet.shutdown().await.expect("final snapshot");
}

/// Four threads with every combination of on-CPU and GIL, 20 samples, then the process exits.
async fn run_mode(mode: Mode, pid: i32) -> (FakeProcHandle, Vec<pyfleet_actors::Snapshot>) {
    let world = World::new();
    let p = world.add(
        FakeProc::new(
            pid,
            "modes",
            vec![(CPU_GIL, 1), (IDLE, 2), (CPU, 3), (GIL, 4)],
        )
        .limit(20, AfterLimit::Gone { unlist: true }),
    );
    let config = FleetConfig {
        mode,
        ..fast_config()
    };
    let h = start(config, &world).await;
    assert!(status_when(&h.fleet, |s| s.exits == 1).await.is_some());
    h.fleet.shutdown().await.expect("final snapshot");
    (p, h.writer.snapshots())
}

type FakeProcHandle = std::sync::Arc<FakeProc>;

fn expect(
    entries: &[(pyfleet_actors::ThreadStatus, u64)],
) -> std::collections::BTreeMap<(pyfleet_actors::ThreadStatus, String), u64> {
    entries
        .iter()
        .map(|(status, stack)| ((*status, format!("f{stack}")), 20))
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn snapshots_count_per_stack_and_status_with_the_mode_applied() {
    let (p, snaps) = run_mode(Mode::Wall, 501).await;
    assert_eq!(
        counts(&snaps, 501),
        expect(&[(CPU_GIL, 1), (IDLE, 2), (CPU, 3), (GIL, 4)])
    );
    assert_eq!(*p.needs_cpu_status.lock().unwrap(), vec![false]);
    // Frames come through whole, innermost first, and each stack was resolved once.
    let profile = &snaps.last().unwrap().processes[0];
    assert_eq!((profile.pid, profile.name.as_str()), (501, "modes"));
    for (_, frames, _) in &profile.samples {
        let stack: u64 = frames[0].function[1..].parse().unwrap();
        assert_eq!(frames[..], frames_of(stack)[..]);
    }
    assert!(p.resolves.lock().unwrap().values().all(|n| *n == 1));

    let (p, snaps) = run_mode(Mode::Cpu, 502).await;
    assert_eq!(counts(&snaps, 502), expect(&[(CPU_GIL, 1), (CPU, 3)]));
    assert_eq!(*p.needs_cpu_status.lock().unwrap(), vec![true]);
    let resolved: Vec<u64> = p.resolves.lock().unwrap().keys().copied().collect();
    assert!(
        resolved.iter().all(|s| [1, 3].contains(s)),
        "resolved {resolved:?}"
    );

    let (_, snaps) = run_mode(Mode::Gil, 503).await;
    assert_eq!(counts(&snaps, 503), expect(&[(CPU_GIL, 1), (GIL, 4)]));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn shutdown_writes_a_final_snapshot_with_the_last_partial_batch() {
    let world = World::new();
    let p = world
        .add(FakeProc::new(601, "partial", vec![(CPU, 1), (IDLE, 2)]).limit(25, AfterLimit::Idle));
    // No batch is due before shutdown, and no periodic snapshot.
    let config = FleetConfig {
        batch_interval: Duration::from_secs(3600),
        ..fast_config()
    };
    let h = start(config, &world).await;
    assert!(eventually(|| p.ok() == 25).await);
    let path = h.fleet.shutdown().await.expect("final snapshot");
    assert_eq!(path, std::path::PathBuf::from("snapshot-1"));
    let snaps = h.writer.snapshots();
    assert_eq!(snaps.len(), 1);
    assert_eq!(
        counts(&snaps, 601),
        [
            ((CPU, "f1".to_string()), 25),
            ((IDLE, "f2".to_string()), 25)
        ]
        .into_iter()
        .collect()
    );
    assert_eq!(
        h.writer
            .retention_runs
            .load(std::sync::atomic::Ordering::SeqCst),
        1
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn periodic_snapshots_split_the_samples_without_losing_any() {
    let world = World::new();
    let p = world.add(FakeProc::new(701, "steady", vec![(CPU, 1)]));
    let config = FleetConfig {
        snapshot_interval: Duration::from_millis(150),
        batch_interval: Duration::from_millis(30),
        ..fast_config()
    };
    let h = start(config, &world).await;
    let writer = h.writer.clone();
    assert!(eventually(|| writer.snapshots().len() >= 3).await);
    h.fleet.shutdown().await.expect("final snapshot");
    let snaps = h.writer.snapshots();
    assert!(snaps.len() >= 4);
    assert!(snaps.windows(2).all(|w| w[0].taken_at <= w[1].taken_at));
    assert_eq!(total(&snaps, 701), p.ok());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_empty_window_still_writes_a_snapshot() {
    let world = World::new();
    let h = start(fast_config(), &world).await;
    h.fleet.shutdown().await.expect("final snapshot");
    let snaps = h.writer.snapshots();
    assert_eq!(snaps.len(), 1);
    assert!(snaps[0].processes.is_empty());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rate_changes_reach_the_samplers() {
    let world = World::new();
    let p = world.add(FakeProc::new(801, "rated", vec![(CPU, 1)]));
    // A budget no process can keep: the first measurement cuts the rate to the 1 Hz floor.
    let config = FleetConfig {
        rate: RatePolicy::new(200.0, 1e-9).unwrap(),
        rate_interval: Duration::from_millis(400),
        ..fast_config()
    };
    let h = start(config, &world).await;

    // Before the first measurement: about 200 Hz.
    assert!(eventually(|| p.ok() >= 1).await);
    let (start, n0) = (Instant::now(), p.ok());
    tokio::time::sleep(Duration::from_millis(150)).await;
    let fast = (p.ok() - n0) as f64 / start.elapsed().as_secs_f64();
    assert_eq!(h.fleet.status().await.unwrap().rate_hz, 200.0);
    assert!(fast > 60.0, "{fast:.1} Hz at 200 Hz");

    // After it: 1 Hz. The sampler picks it up at its next tick.
    status_when(&h.fleet, |s| s.rate_hz <= 1.0)
        .await
        .expect("the rate comes down");
    tokio::time::sleep(Duration::from_millis(50)).await;
    let (start, n0) = (Instant::now(), p.ok());
    tokio::time::sleep(Duration::from_millis(1500)).await;
    let slow = (p.ok() - n0) as f64 / start.elapsed().as_secs_f64();
    assert!(slow < 4.0, "{slow:.1} Hz at 1 Hz");
    h.fleet.shutdown().await.expect("final snapshot");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn invalid_configuration_is_refused() {
    let world = World::new();
    let config = FleetConfig {
        batch_interval: Duration::ZERO,
        ..fast_config()
    };
    let refused = pyfleet_actors::Fleet::start(
        config,
        FakeDiscovery(world.clone()),
        FakeFactory(world.clone()),
        FakeWriter::default(),
    )
    .await;
    assert!(matches!(
        refused,
        Err(pyfleet_actors::FleetError::Config(_))
    ));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_pid_reused_by_another_process_gets_a_sampler_of_its_own() {
    let world = World::new();
    let first = world.add(FakeProc::new(201, "first", vec![(CPU, 1)]).started(100));
    let h = start(fast_config(), &world).await;
    assert!(
        eventually(|| first.ok() > 5).await,
        "the first process is sampled"
    );
    // The first process exits and another takes its pid before the sampler notices.
    let second = world.add(FakeProc::new(201, "second", vec![(CPU, 2)]).started(200));
    assert!(
        eventually(|| second.attach_count() == 1 && second.ok() > 5).await,
        "the process now under pid 201 is sampled"
    );
    assert!(
        eventually(|| first.drop_count() == 1).await,
        "the first process's source is dropped"
    );
    let before = first.calls();
    assert!(eventually(|| second.ok() > 20).await);
    assert_eq!(
        first.calls(),
        before,
        "the first source is not sampled any more"
    );
    h.fleet.shutdown().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_role_change_restarts_the_sampler_under_the_new_role_without_an_exit() {
    use pyfleet_policies::Role;
    let world = World::new();
    let master = world.add(FakeProc::new(301, "web", vec![(CPU, 1)]));
    let h = start(fast_config(), &world).await;
    assert!(eventually(|| master.ok() > 5).await);
    assert_eq!(master.attach_count(), 1);
    // Its workers appeared: discovery calls it a master now.
    world.roles.lock().unwrap().insert(301, Role::Master);
    assert!(eventually(|| master.attach_count() == 2).await);
    let before = master.ok();
    assert!(eventually(|| master.ok() > before + 5).await);
    let status = h.fleet.status().await.unwrap();
    assert_eq!(status.exits, 0, "a relabel is not an exit");
    assert_eq!(status.restarts, 0, "nor a failure's restart");
    h.fleet.shutdown().await.expect("final snapshot");
    let snaps = h.writer.snapshots();
    let last_role = snaps
        .iter()
        .rev()
        .find_map(|s| s.processes.iter().find(|p| p.pid == 301).map(|p| p.role));
    assert_eq!(last_role, Some(Role::Master));
    assert_eq!(
        total(&snaps, 301),
        master.ok(),
        "no sample lost over the restart"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_sampler_stopped_while_it_attaches_ends_at_once_and_its_source_is_dropped() {
    let world = World::new();
    let attach = Duration::from_millis(400);
    let leaving = world.add(FakeProc::new(901, "leaving", vec![(CPU, 1)]).slow_attach(attach));
    let h = start(fast_config(), &world).await;
    assert!(eventually(|| leaving.attach_count() == 1).await);
    // Unlisted while its attach runs: an exit, and the entry goes without waiting for it.
    leaving
        .listed
        .store(false, std::sync::atomic::Ordering::SeqCst);
    let status = status_when(&h.fleet, |s| state_of(s, 901).is_none())
        .await
        .expect("the entry goes");
    assert_eq!((status.exits, status.restarts), (1, 0));
    // The source that arrives later is dropped, never sampled.
    assert!(eventually(|| leaving.drop_count() == 1).await);
    assert_eq!(leaving.calls(), 0);

    // Shut down while another attach runs: the late source is dropped all the same.
    let late = world.add(FakeProc::new(902, "late", vec![(CPU, 1)]).slow_attach(attach));
    assert!(eventually(|| late.attach_count() == 1).await);
    h.fleet.shutdown().await.expect("final snapshot");
    assert!(eventually(|| late.drop_count() == 1).await);
    assert_eq!(late.calls(), 0);
    let snaps = h.writer.snapshots();
    assert!(
        snaps.iter().all(|s| s.processes.is_empty()),
        "nothing was sampled"
    );
}

/// Collects the push windows it is handed.
#[derive(Default)]
struct Pushed(Mutex<Vec<pyfleet_actors::Snapshot>>);

impl WindowPusher for Pushed {
    fn push(&self, window: pyfleet_actors::Snapshot) {
        self.0.lock().unwrap().push(window);
    }
}

/// Push windows on the snapshot schedule are the snapshot windows, cut at the same
/// instants; on their own schedule they still split every sample, none lost, including the
/// final partial window.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn push_windows_are_cut_with_the_snapshots_and_lose_nothing() {
    for push_every in [150, 70] {
        let world = World::new();
        let p = world.add(FakeProc::new(901, "pushed", vec![(CPU, 1)]));
        let pushed = Arc::new(Pushed::default());
        let config = FleetConfig {
            snapshot_interval: Duration::from_millis(150),
            batch_interval: Duration::from_millis(30),
            push: Some(PushSchedule {
                interval: Duration::from_millis(push_every),
                pusher: pushed.clone(),
            }),
            ..fast_config()
        };
        let h = start(config, &world).await;
        let writer = h.writer.clone();
        assert!(eventually(|| writer.snapshots().len() >= 3).await);
        h.fleet.shutdown().await.expect("final snapshot");
        let snaps = h.writer.snapshots();
        let windows = pushed.0.lock().unwrap().clone();
        assert_eq!(total(&windows, 901), p.ok(), "push every {push_every} ms");
        assert_eq!(total(&snaps, 901), p.ok());
        if push_every == 150 {
            assert_eq!(windows.len(), snaps.len());
            for (w, s) in windows.iter().zip(&snaps) {
                assert_eq!((w.started_at, w.taken_at), (s.started_at, s.taken_at));
                assert_eq!(
                    total(std::slice::from_ref(w), 901),
                    total(std::slice::from_ref(s), 901)
                );
            }
        } else {
            assert!(windows.len() > snaps.len(), "{} windows", windows.len());
        }
    }
}
