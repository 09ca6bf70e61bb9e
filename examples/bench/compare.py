"""pyfleet against CPython 3.15's own unwinder, side by side, on the same targets, in one run.

Run with CPython 3.15 (it needs `_remote_debugging`), as root, after `cargo build --release`:

    ~/.cache/pyfleet/pythons/3.15/usr/bin/python3.15 examples/bench/compare.py

For each workload (mixed.py, deep.py, threads.py in this folder) it starts the target under
3.15, then alternates, round after round: `pyfleet bench --json` for N seconds, and a loop over
`RemoteUnwinder(pid, all_threads=True, cache_frames=True).get_stack_trace()` for N seconds.
Each round also runs `pyfleet bench --no-skip-idle` (every thread read every sample, even one
the kernel says has not run: the memory path alone).
It reports the median of the rounds, the ratio, and the floor: one bare 8-byte
process_vm_readv on the same target (`pyfleet bench --floor`). With --all-versions it also
runs pyfleet alone on the same workloads under 3.11-3.14 (no reference unwinder there) and
reports time and syscalls per sample. Output: Markdown tables (BENCHMARKS.md's), and --json.
"""
import argparse
import json
import os
import pathlib
import statistics
import subprocess
import sys
import time

HERE = pathlib.Path(__file__).resolve().parent
ROOT = HERE.parent.parent
WORKLOADS = [
    # name, script, the goal for pyfleet / RemoteUnwinder
    ("mixed (1 busy thread: recursion, math, sleeps)", "mixed.py", 0.5),
    ("deep (900 frames that stay put)", "deep.py", 0.3),
    ("threads (20-60 threads coming and going)", "threads.py", 0.3),
]


def interpreters():
    home = pathlib.Path.home()
    pythons = pathlib.Path(os.environ.get("PYFLEET_PYTHONS", home / ".cache/pyfleet/pythons"))
    found = {"3.11": pathlib.Path("/usr/bin/python3.11")}
    for minor in ("3.12", "3.13"):
        cands = sorted((home / ".pyenv/versions").glob(f"{minor}.*/bin/python{minor}"))
        if cands:
            found[minor] = cands[-1]
    found["3.14"] = pythons / "3.14/usr/bin/python3.14"
    found["3.15"] = pathlib.Path(sys.executable)
    return {k: v for k, v in found.items() if v.exists()}


def start(python, script):
    p = subprocess.Popen([str(python), str(HERE / script)], stdout=subprocess.PIPE, text=True)
    line = p.stdout.readline()
    if "ready" not in line:
        p.kill()
        raise SystemExit(f"{script} did not start under {python}")
    time.sleep(0.5)
    return p


def pyfleet_bench(exe, pid, seconds, *extra):
    out = subprocess.run(
        [exe, "bench", "--pid", str(pid), "--duration", str(seconds), "--json", *extra],
        capture_output=True, text=True, check=True,
    )
    return json.loads(out.stdout)


def remote_unwinder(pid, seconds):
    import _remote_debugging

    u = _remote_debugging.RemoteUnwinder(pid, all_threads=True, cache_frames=True)
    calls = errors = 0
    kinds = {}
    t0 = time.perf_counter()
    while time.perf_counter() - t0 < seconds:
        try:
            u.get_stack_trace()
        except Exception as e:
            errors += 1
            kinds[type(e).__name__] = kinds.get(type(e).__name__, 0) + 1
        calls += 1
    elapsed = time.perf_counter() - t0
    return {"mean_us": elapsed * 1e6 / calls, "calls": calls, "errors": errors,
            "per_success_us": elapsed * 1e6 / max(1, calls - errors), "error_kinds": kinds}


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--pyfleet", default=str(ROOT / "target/release/pyfleet"))
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--seconds", type=float, default=2.0)
    ap.add_argument("--all-versions", action="store_true")
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    if sys.version_info[:2] < (3, 15):
        raise SystemExit("run this with CPython 3.15 (it compares with 3.15's RemoteUnwinder)")
    if not os.path.exists(args.pyfleet):
        raise SystemExit(f"{args.pyfleet} not found: run `cargo build --release` first")

    results = []
    for name, script, goal in WORKLOADS:
        target = start(sys.executable, script)
        try:
            ours, reading, theirs = [], [], []
            for r in range(args.rounds):
                # Alternate which goes first, so none always sees a warmer target.
                runs = ["ours", "reading", "theirs"]
                if r % 2:
                    runs.reverse()
                for who in runs:
                    if who == "ours":
                        ours.append(pyfleet_bench(args.pyfleet, target.pid, args.seconds))
                    elif who == "reading":
                        reading.append(pyfleet_bench(args.pyfleet, target.pid, args.seconds,
                                                     "--no-skip-idle"))
                    else:
                        theirs.append(remote_unwinder(target.pid, args.seconds))
                print(f"  {script} round {r + 1}: pyfleet {ours[-1]['mean_us']:.2f} us "
                      f"(--no-skip-idle {reading[-1]['mean_us']:.2f} us), "
                      f"RemoteUnwinder {theirs[-1]['mean_us']:.2f} us", file=sys.stderr)
            floor = pyfleet_bench(args.pyfleet, target.pid, 1.0, "--floor")
        finally:
            target.kill()
            target.wait()
        o = statistics.median(x["mean_us"] for x in ours)
        t = statistics.median(x["mean_us"] for x in theirs)
        # Per sample actually delivered: a failed call gives the user nothing.
        o_ok = statistics.median(x["mean_us"] * max(1, x["samples"] + x["errors"]) / max(1, x["samples"])
                                 for x in ours)
        t_ok = statistics.median(x["per_success_us"] for x in theirs)
        o_read = statistics.median(x["mean_us"] for x in reading)
        o_read_ok = statistics.median(
            x["mean_us"] * max(1, x["samples"] + x["errors"]) / max(1, x["samples"])
            for x in reading)
        kinds = {}
        for x in theirs:
            for k, n in x["error_kinds"].items():
                kinds[k] = kinds.get(k, 0) + n
        results.append({
            "workload": name, "script": script, "goal": goal,
            "pyfleet_us": o, "remote_unwinder_us": t, "ratio": o / t,
            "pyfleet_per_success_us": o_ok, "remote_unwinder_per_success_us": t_ok,
            "ratio_per_success": o_ok / t_ok, "remote_unwinder_error_kinds": kinds,
            "pyfleet_no_skip_idle_us": o_read, "ratio_no_skip_idle": o_read / t,
            "ratio_per_success_no_skip_idle": o_read_ok / t_ok,
            "pyfleet_kept_samples": sum(x["samples_unchanged"] for x in ours),
            "pyfleet_cpu_us": statistics.median(x["cpu_us"] for x in ours),
            "pyfleet_syscalls": statistics.median(x["reads_per_sample"] for x in ours),
            "pyfleet_errors": sum(x["errors"] for x in ours),
            "pyfleet_samples": sum(x["samples"] for x in ours),
            "remote_unwinder_errors": sum(x["errors"] for x in theirs),
            "remote_unwinder_calls": sum(x["calls"] for x in theirs),
            "threads": ours[-1]["threads"],
            "floor_us": floor["mean_us"],
        })

    others = []
    if args.all_versions:
        for minor, python in interpreters().items():
            if minor == "3.15":
                continue
            for name, script, _ in WORKLOADS:
                target = start(python, script)
                try:
                    d = pyfleet_bench(args.pyfleet, target.pid, args.seconds)
                    n = pyfleet_bench(args.pyfleet, target.pid, args.seconds, "--no-skip-idle")
                finally:
                    target.kill()
                    target.wait()
                others.append({"python": minor, "script": script, "mean_us": d["mean_us"],
                               "syscalls": d["reads_per_sample"], "errors": d["errors"],
                               "samples": d["samples"], "no_skip_idle_us": n["mean_us"],
                               "no_skip_idle_syscalls": n["reads_per_sample"]})

    if args.json:
        print(json.dumps({"comparison": results, "other_versions": others}, indent=2))
        return
    print("| workload (CPython 3.15) | pyfleet µs/call | RemoteUnwinder µs/call | ratio per call "
          "| ratio per successful sample (goal) | --no-skip-idle: µs, ratio per call, per success "
          "| pyfleet syscalls/sample | floor µs (1 syscall) | failed calls pyfleet / CPython |")
    print("|---|---|---|---|---|---|---|---|---|")
    for r in results:
        print(f"| {r['workload']} | {r['pyfleet_us']:.2f} | {r['remote_unwinder_us']:.2f} | "
              f"{r['ratio']:.2f} | {r['ratio_per_success']:.2f} (≤ {r['goal']}) | "
              f"{r['pyfleet_no_skip_idle_us']:.2f}, {r['ratio_no_skip_idle']:.2f}, "
              f"{r['ratio_per_success_no_skip_idle']:.2f} | "
              f"{r['pyfleet_syscalls']:.2f} | {r['floor_us']:.2f} | "
              f"{100 * r['pyfleet_errors'] / max(1, r['pyfleet_samples']):.2f}% / "
              f"{100 * r['remote_unwinder_errors'] / max(1, r['remote_unwinder_calls']):.1f}% |")
    if others:
        print()
        print("| pyfleet alone | " + " | ".join(s for _, s, _ in WORKLOADS) + " |")
        print("|---|" + "---|" * len(WORKLOADS))
        for minor in sorted({o["python"] for o in others}):
            cells = []
            for _, script, _ in WORKLOADS:
                o = next(x for x in others if x["python"] == minor and x["script"] == script)
                cells.append(f"{o['mean_us']:.2f} µs, {o['syscalls']:.2f} syscalls "
                             f"(--no-skip-idle {o['no_skip_idle_us']:.2f} µs, "
                             f"{o['no_skip_idle_syscalls']:.2f})")
            print(f"| {minor} | " + " | ".join(cells) + " |")


if __name__ == "__main__":
    main()
