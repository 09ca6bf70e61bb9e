"""Fleet benchmark: pyfleet profiling many Python processes at once, as a daemon would.

Starts N Python processes (default 32) of mixed workloads (worker.py: busy, idle, deep,
threads) spread over every interpreter found (3.11-3.15), runs `pyfleet run --match TOKEN`
(a token in those workers' command lines: every scan looks at every process of the host, as
a deployment's does) at --rate Hz for --duration seconds, and reports pyfleet's CPU (percent of one core, from
its rusage), its peak RSS, and samples taken, missed ticks and errors (from its /metrics just
before the end). Run as root after `cargo build --release`:

    python3 examples/fleet/bench.py                       # 32 processes, 100 Hz, 30 s
    python3 examples/fleet/bench.py --max-cpu 1           # show the budget holding
    python3 examples/fleet/bench.py --json
    python3 examples/fleet/bench.py --mode cpu,wall --rounds 3   # modes alternated, medians

Not a test: figures go in BENCHMARKS.md.
"""
import argparse
import json
import os
import pathlib
import re
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request

HERE = pathlib.Path(__file__).resolve().parent
ROOT = HERE.parent.parent
KINDS = ["busy", "idle", "deep", "threads", "periodic", "sleeper"]
DEFAULT_KINDS = ["busy", "idle", "deep", "threads"]


def interpreters():
    home = pathlib.Path.home()
    pythons = pathlib.Path(os.environ.get("PYFLEET_PYTHONS", home / ".cache/pyfleet/pythons"))
    found = [pathlib.Path("/usr/bin/python3.11")]
    for minor in ("3.12", "3.13"):
        found += sorted((home / ".pyenv/versions").glob(f"{minor}.*/bin/python{minor}"))[-1:]
    found += [pythons / "3.14/usr/bin/python3.14", pythons / "3.15/usr/bin/python3.15"]
    return [p for p in found if p.exists()]


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def scrape(port):
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as r:
        return r.read().decode()


def total(text, name):
    """Sum of every series of one metric in Prometheus text format."""
    pat = re.compile(rf"^{re.escape(name)}(?:{{[^}}]*}})? (\S+)$", re.M)
    return sum(float(v) for v in pat.findall(text))


def by_label(text, name, label):
    """Sums of every series of one metric, by the value of one of its labels."""
    pat = re.compile(rf'^{re.escape(name)}{{([^}}]*)}} (\S+)$', re.M)
    sums = {}
    for labels, value in pat.findall(text):
        m = re.search(rf'(?:^|,){re.escape(label)}="([^"]*)"', labels)
        if m:
            sums[m.group(1)] = sums.get(m.group(1), 0.0) + float(value)
    return sums


def cpu_ticks(pid):
    """utime + stime of a process, in clock ticks."""
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return int(fields[11]) + int(fields[12])


def bpf_runs(pid):
    """Per BPF program type `pid` holds (the kernel capture's: `7` the perf-event program, in
    the targets' interrupts; `17` the switch program, at every context switch of the host):
    nanoseconds run and runs, from /proc/PID/fdinfo; zeros without the kernel's BPF
    statistics."""
    runs = {}
    fdinfo = f"/proc/{pid}/fdinfo"
    for name in os.listdir(fdinfo):
        try:
            with open(os.path.join(fdinfo, name)) as f:
                fields = dict(line.split(":", 1) for line in f if ":" in line)
        except OSError:
            continue
        if "prog_type" in fields:
            kind = fields["prog_type"].strip()
            ns, n = runs.get(kind, (0, 0))
            runs[kind] = (ns + int(fields.get("run_time_ns", "0").strip() or 0),
                          n + int(fields.get("run_cnt", "0").strip() or 0))
    return runs


def bpf_run_ns(runs):
    return sum(ns for ns, _ in runs.values())


BPF_STATS = "/proc/sys/kernel/bpf_stats_enabled"


def run_pyspy(args, pids):
    """The alternative: one `py-spy record` per process at the same rate, for the same time.
    Returns their total CPU, percent of one core."""
    spies = []
    out = tempfile.mkdtemp(prefix="pyfleet-pyspy-")
    for pid in pids:
        spies.append(subprocess.Popen(
            [args.py_spy, "record", "--pid", pid, "--rate", str(int(args.rate)), "--duration",
             str(int(args.duration)), "--nonblocking", "--format", "raw", "-o",
             os.path.join(out, f"{pid}.txt")],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL))
    t0 = time.monotonic()
    cpu = 0.0
    for sp in spies:
        _, _, usage = os.wait4(sp.pid, 0)
        cpu += usage.ru_utime + usage.ru_stime
    return round(100 * cpu / (time.monotonic() - t0), 2)


def cost(r):
    """pyfleet's steady CPU and the capture's programs' run time, percent of one core."""
    return r["steady_cpu_percent_of_one_core"] + r["steady_bpf_cpu_percent_of_one_core"]


def run(args, pythons):
    """Starts the fleet, then measures pyfleet on it in each of `args.modes`, one after the
    other, `args.rounds` times over (the modes alternating, so that each round compares them
    on the machine as it was then). Returns one result per mode: the round of median cost,
    with every round's cost."""
    procs = []
    stats_before = None
    # In every worker's command line, for `--match` to find exactly this run's workers.
    token = f"fleet-bench-{os.getpid()}"
    try:
        for i in range(args.processes):
            py, kind = pythons[i % len(pythons)], args.kinds[i % len(args.kinds)]
            p = subprocess.Popen([str(py), str(HERE / "worker.py"), kind, token],
                                 stdout=subprocess.PIPE, text=True)
            procs.append(p)
        for p in procs:
            if "ready" not in p.stdout.readline():
                raise SystemExit("a worker did not start")
        pids = [str(p.pid) for p in procs]
        if args.capture != "reads" and os.access(BPF_STATS, os.W_OK):
            # The capture's program runs in the targets' interrupts: its time is counted too
            # (the statistics are switched back off at the end).
            with open(BPF_STATS) as f:
                stats_before = f.read().strip()
            with open(BPF_STATS, "w") as f:
                f.write("1")
        rounds = [{mode: measure(args, pythons, pids, token, mode) for mode in args.modes}
                  for _ in range(args.rounds)]
        # The floor of the whole sitting: every floor measured on this fleet, each mode's
        # before and after (the same processes all along), so that the modes' ratios share
        # one denominator and differ by pyfleet's cost only.
        floors = [f for measured in rounds for r in measured.values() for f in r.pop("floors")]
        sitting = sum(floors) / len(floors)
        first = args.modes[0]
        results = []
        for mode in args.modes:
            by_cost = sorted((measured[mode] for measured in rounds), key=cost)
            r = by_cost[(len(by_cost) - 1) // 2]
            r["sitting_floor_cpu_percent"] = round(sitting, 2)
            r["ratio_to_sitting_floor"] = round(cost(r) / max(1e-9, sitting), 3)
            r["cost_per_round"] = [round(cost(measured[mode]), 3) for measured in rounds]
            # Against the first mode of the same round: the machine as it was then.
            r["first_mode"] = first
            r["to_first_mode_per_round"] = [
                round(cost(measured[mode]) / max(1e-9, cost(measured[first])), 3)
                for measured in rounds]
            results.append(r)
        return results
    finally:
        for p in procs:
            p.kill()
            p.wait()
        if stats_before is not None:
            with open(BPF_STATS, "w") as f:
                f.write(stats_before)


def measure(args, pythons, pids, token, mode):
    """pyfleet in `mode` on the fleet `pids` for --duration, between two floor measurements."""
    def floor():
        """The machine's floor for this fleet: one bare 8-byte read per process per tick."""
        cmd = [args.pyfleet, "bench", "--floor", "--rate", str(args.rate), "--duration",
               str(args.floor_seconds), "--json"]
        for pid in pids:
            cmd += ["--pid", pid]
        return json.loads(subprocess.run(cmd, capture_output=True, text=True,
                                         check=True).stdout)

    floor_before = floor()
    port = free_port()
    out = tempfile.mkdtemp(prefix="pyfleet-fleet-bench-")
    cmd = [args.pyfleet, "run", "--rate", str(args.rate), "--duration", str(args.duration),
           "--snapshot-interval", str(args.snapshot_interval), "--out", out, "--metrics-addr", f"127.0.0.1:{port}",
           "--max-cpu", str(args.max_cpu), "--mode", mode]
    # Matched by a pattern, as a deployment matches: every scan looks at every process
    # of the host.
    cmd += ["--match", token]
    if args.switch_log:
        cmd += ["--switch-log"]
    cmd += ["--capture", args.capture]
    t0 = time.monotonic()
    daemon = subprocess.Popen(cmd, stderr=subprocess.PIPE, text=True)
    # Steady state, without attaching at the start and the final snapshot at the end:
    # pyfleet's CPU between two readings of /proc/PID/stat.
    warmup = min(5.0, args.duration / 4)
    time.sleep(warmup)
    c0, r0, s0 = cpu_ticks(daemon.pid), bpf_runs(daemon.pid), time.monotonic()
    time.sleep(max(1.0, args.duration - warmup - 1.5))
    c1, r1, s1 = cpu_ticks(daemon.pid), bpf_runs(daemon.pid), time.monotonic()
    b0, b1 = bpf_run_ns(r0), bpf_run_ns(r1)
    metrics = scrape(port)
    scraped = time.monotonic()
    _, status, usage = os.wait4(daemon.pid, 0)
    wall = time.monotonic() - t0
    err = daemon.stderr.read()
    if status != 0:
        raise SystemExit(f"pyfleet failed ({status}):\n{err}")
    cpu = usage.ru_utime + usage.ru_stime
    floor_after = floor()
    pyspy = run_pyspy(args, pids) if args.py_spy else None
    floor_us = (floor_before["cpu_us_per_read"] + floor_after["cpu_us_per_read"]) / 2
    steady_cpu_s = (c1 - c0) / os.sysconf("SC_CLK_TCK")
    steady_samples_per_s = total(metrics, "pyfleet_samples_total") / max(1e-9, scraped - t0)
    return {
        "processes": args.processes,
        "kinds": args.kinds,
        "interpreters": [p.name for p in pythons],
        "rate_hz": args.rate,
        "max_cpu_percent": args.max_cpu,
        "duration_s": round(wall, 2),
        "cpu_percent_of_one_core": round(100 * cpu / wall, 2),
        "steady_cpu_percent_of_one_core": round(
            100 * (c1 - c0) / os.sysconf("SC_CLK_TCK") / (s1 - s0), 2),
        # The kernel capture's program, in the targets' interrupts (0 without it).
        "steady_bpf_cpu_percent_of_one_core": round(100 * (b1 - b0) / 1e9 / (s1 - s0), 3),
        # By program: runs a second and nanoseconds a run.
        "bpf_programs": {
            {"7": "perf_event", "17": "raw_tracepoint"}.get(kind, kind): {
                "runs_per_s": round((n - r0.get(kind, (0, 0))[1]) / (s1 - s0)),
                "ns_per_run": round((ns - r0.get(kind, (0, 0))[0])
                                    / max(1, n - r0.get(kind, (0, 0))[1])),
            }
            for kind, (ns, n) in r1.items()
        },
        "peak_rss_mib": round(usage.ru_maxrss / 1024, 1),
        "cpu_us_per_sample": round(1e6 * steady_cpu_s / (s1 - s0) / max(1e-9, steady_samples_per_s), 2),
        "floor_cpu_us_per_read": round(floor_us, 2),
        "floor_cpu_percent_at_rate": round(
            (floor_before["cpu_percent_of_one_core"] + floor_after["cpu_percent_of_one_core"]) / 2, 2),
        "py_spy_cpu_percent_of_one_core": pyspy,
        "samples": int(total(metrics, "pyfleet_samples_total")),
        # What each kind of sample cost (see the README's "Metrics"): kept (a check found
        # nothing had run), checked (a check, then a read), read (no check).
        "sample_kinds": {
            kind: {
                "samples": int(n),
                "us_per_sample": round(
                    1e6 * by_label(metrics, "pyfleet_sample_kind_seconds_total", "kind")
                    .get(kind, 0.0) / n, 2) if n else None,
            }
            for kind, n in sorted(by_label(metrics, "pyfleet_sample_kinds_total", "kind").items())
        },
        "missed_ticks": int(total(metrics, "pyfleet_missed_ticks_total")),
        "errors": int(total(metrics, "pyfleet_sample_errors_total")),
        "sampled_processes": int(total(metrics, "pyfleet_processes")),
        "samples_per_process_per_s": round(
            total(metrics, "pyfleet_samples_total") / args.processes / max(1e-9, args.duration - 1.5), 1),
        "mode": mode,
        "floors": [floor_before["cpu_percent_of_one_core"], floor_after["cpu_percent_of_one_core"]],
    }


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--pyfleet", default=str(ROOT / "target/release/pyfleet"))
    ap.add_argument("--processes", type=int, default=32)
    ap.add_argument("--rate", type=float, default=100)
    ap.add_argument("--duration", type=float, default=30)
    ap.add_argument("--max-cpu", type=float, default=5)
    ap.add_argument("--snapshot-interval", type=float, default=10,
                    help="seconds between the daemon's snapshots (each renders every process)")
    ap.add_argument("--floor-seconds", type=float, default=8,
                    help="length of each floor measurement (before and after the run)")
    ap.add_argument("--kinds", default=",".join(DEFAULT_KINDS),
                    help=f"workload kinds to cycle through, of {','.join(KINDS)} "
                         f"(default {','.join(DEFAULT_KINDS)}; see worker.py)")
    ap.add_argument("--versions", default="",
                    help="CPython versions to spread the processes over, e.g. 3.11,3.15 "
                         "(default: every one found)")
    ap.add_argument("--py-spy", metavar="PATH",
                    help="also run one `py-spy record` per process (same rate and duration) "
                         "after pyfleet and report their CPU (pip install py-spy)")
    ap.add_argument("--switch-log", action="store_true",
                    help="run pyfleet with --switch-log (idle threads told by the kernel's "
                         "context-switch log; needs CAP_PERFMON)")
    ap.add_argument("--capture", choices=["auto", "reads", "kernel"], default="auto",
                    help="pyfleet's --capture (default auto, pyfleet's own default: the kernel "
                         "capture as root, cpu mode); with the capture, the program's run time "
                         "in the targets is reported beside pyfleet's CPU")
    ap.add_argument("--mode", default="cpu",
                    help="pyfleet's --mode, or several comma-separated (cpu,wall,gil): each "
                         "measured in turn on the same fleet, their ratios to one floor (every "
                         "floor of the sitting); default cpu")
    ap.add_argument("--rounds", type=int, default=1,
                    help="measure the modes this many times, alternating; each mode reports "
                         "its round of median cost, and every round's cost and ratio to the "
                         "first mode's in the same round")
    ap.add_argument("--capture-kernel", action="store_true",
                    help="the same as --capture kernel")
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    if not os.path.exists(args.pyfleet):
        raise SystemExit(f"{args.pyfleet} not found: run `cargo build --release` first")
    if args.capture_kernel:
        args.capture = "kernel"
    args.modes = [m for m in args.mode.split(",") if m]
    if not args.modes or any(m not in ("cpu", "wall", "gil") for m in args.modes):
        raise SystemExit("--mode takes cpu, wall or gil, or several comma-separated")
    if args.rounds < 1:
        raise SystemExit("--rounds takes a whole number of at least 1")
    args.kinds = [k for k in args.kinds.split(",") if k]
    if not args.kinds or any(k not in KINDS for k in args.kinds):
        raise SystemExit(f"--kinds takes a comma-separated list of {', '.join(KINDS)}")
    pythons = interpreters()
    if args.versions:
        wanted = [v for v in args.versions.split(",") if v]
        pythons = [p for p in pythons if any(p.name == f"python{v}" for v in wanted)]
    if not pythons:
        raise SystemExit("no Python interpreter found")
    results = run(args, pythons)
    if args.json:
        print(json.dumps(results[0] if len(results) == 1 else results))
        return
    for r in results:
        print_table(r)
        print()


def print_table(r):
    print(f"{r['mode']} mode: ratio to the sitting's floor ({r['sitting_floor_cpu_percent']}% "
          f"of a core) {r['ratio_to_sitting_floor']}, pyfleet {r['steady_cpu_percent_of_one_core']}%"
          f" + BPF {r['steady_bpf_cpu_percent_of_one_core']}% steady")
    if len(r["cost_per_round"]) > 1:
        print(f"rounds (pyfleet + BPF, % of a core): {r['cost_per_round']}; to {r['first_mode']} "
              f"mode in the same round: {r['to_first_mode_per_round']}")
    print("| processes | rate | budget | pyfleet CPU, whole run (% of one core) | steady state | "
          "CPU µs per sample / floor µs per bare read | floor at this rate | "
          "peak RSS | samples | per process per s | missed ticks | errors |")
    print("|---|---|---|---|---|---|---|---|---|---|---|---|")
    print(f"| {r['processes']} ({', '.join(r['interpreters'])}) | {r['rate_hz']:g} Hz | "
          f"{r['max_cpu_percent']:g}% | {r['cpu_percent_of_one_core']}% | "
          f"{r['steady_cpu_percent_of_one_core']}% | "
          f"{r['cpu_us_per_sample']} / {r['floor_cpu_us_per_read']} | "
          f"{r['floor_cpu_percent_at_rate']}% | {r['peak_rss_mib']} MiB | "
          f"{r['samples']} | {r['samples_per_process_per_s']} | {r['missed_ticks']} | {r['errors']} |")
    total_samples = sum(k["samples"] for k in r["sample_kinds"].values()) or 1
    print()
    print("| kind | share of samples | µs inside a sample |")
    print("|---|---|---|")
    for kind, k in r["sample_kinds"].items():
        print(f"| {kind} | {100 * k['samples'] / total_samples:.1f}% | {k['us_per_sample']} |")


if __name__ == "__main__":
    sys.exit(main())
