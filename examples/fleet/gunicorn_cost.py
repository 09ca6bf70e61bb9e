"""What the daemon costs on a gunicorn fleet: a master and N workers (3.11 by default, from
the venv `scripts/setup-venvs.sh` makes) serving `tests/targets/wsgi_app.py` under a paced
load (about --rps requests a second, half of them `/sleep`: 50 ms off the CPU), while
`pyfleet run --match` samples them, once per `--capture` given, alternating for --rounds.
Reports per run pyfleet's own CPU (percent of one core: in the steady state, from a few
seconds in to a second before the end, and over the whole run from its rusage, which counts
loading the capture), the kernel capture's programs' run time in the steady state (in the
workers' interrupts and at every context switch of the host, from the kernel's BPF
statistics), and the requests served. Run as root after
`cargo build --release`:

    python3 examples/fleet/gunicorn_cost.py --mode wall
    python3 examples/fleet/gunicorn_cost.py --mode cpu --captures kernel,reads --json

Not a test: figures go in BENCHMARKS.md.
"""
import argparse
import json
import os
import pathlib
import subprocess
import tempfile
import threading
import time
import urllib.request

from bench import BPF_STATS, bpf_run_ns, bpf_runs, cpu_ticks, free_port

HERE = pathlib.Path(__file__).resolve().parent
WARMUP = 4.0
ROOT = HERE.parent.parent


def serve(python, port, workers):
    """Starts gunicorn; returns it once every worker answers."""
    gunicorn = subprocess.Popen(
        [python, "-m", "gunicorn", "--workers", str(workers), "--bind", f"127.0.0.1:{port}",
         "--chdir", str(ROOT / "tests/targets"), "wsgi_app:app"],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        try:
            with open(f"/proc/{gunicorn.pid}/task/{gunicorn.pid}/children") as f:
                up = len(f.read().split()) >= workers
            urllib.request.urlopen(f"http://127.0.0.1:{port}/", timeout=2).read()
            if up:
                return gunicorn
        except OSError:
            pass
        time.sleep(0.2)
    gunicorn.kill()
    raise SystemExit("gunicorn did not start")


class Load:
    """Paced requests from a few threads, alternating `/` (CPU work) and `/sleep`."""

    def __init__(self, port, rps, threads=8):
        self.port, self.period, self.served = port, threads / rps, 0
        self.stop = threading.Event()
        self.lock = threading.Lock()
        self.threads = [threading.Thread(target=self.worker, args=(i,), daemon=True)
                        for i in range(threads)]
        for t in self.threads:
            t.start()

    def worker(self, i):
        path = "/sleep" if i % 2 else "/"
        next_at = time.monotonic()
        while not self.stop.is_set():
            try:
                urllib.request.urlopen(f"http://127.0.0.1:{self.port}{path}", timeout=5).read()
                with self.lock:
                    self.served += 1
            except OSError:
                pass
            next_at += self.period
            self.stop.wait(max(0.0, next_at - time.monotonic()))

    def take(self):
        with self.lock:
            n, self.served = self.served, 0
        return n

    def close(self):
        self.stop.set()
        for t in self.threads:
            t.join()


def one_run(args, port, capture):
    out = tempfile.mkdtemp(prefix="pyfleet-gunicorn-cost-")
    cmd = [args.pyfleet, "run", "--match", f"127.0.0.1:{port}", "--rate", str(args.rate),
           "--duration", str(args.duration), "--mode", args.mode, "--capture", capture,
           "--out", out]
    t0 = time.monotonic()
    daemon = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    # Steady state: from WARMUP seconds in (the capture loaded, the fleet attached) to about
    # a second before the end (before the final snapshot).
    time.sleep(WARMUP)
    c0, r0, s0 = cpu_ticks(daemon.pid), bpf_runs(daemon.pid), time.monotonic()
    time.sleep(max(1.0, args.duration - WARMUP - 1.0))
    c1, r1, s1 = cpu_ticks(daemon.pid), bpf_runs(daemon.pid), time.monotonic()
    _, status, usage = os.wait4(daemon.pid, 0)
    wall = time.monotonic() - t0
    if status != 0:
        raise SystemExit(f"pyfleet failed ({status}):\n{daemon.stderr.read()}")
    return {
        "capture": capture,
        "cpu_percent_whole_run": round(100 * (usage.ru_utime + usage.ru_stime) / wall, 2),
        "steady_cpu_percent": round(100 * (c1 - c0) / os.sysconf("SC_CLK_TCK") / (s1 - s0), 2),
        "steady_bpf_cpu_percent": round(100 * (bpf_run_ns(r1) - bpf_run_ns(r0)) / 1e9
                                        / (s1 - s0), 3),
        "peak_rss_mib": round(usage.ru_maxrss / 1024, 1),
    }


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--pyfleet", default=str(ROOT / "target/release/pyfleet"))
    ap.add_argument("--python", default=str(pathlib.Path.home()
                                            / ".cache/pyfleet/venvs/gunicorn-3.11/bin/python"))
    ap.add_argument("--workers", type=int, default=4)
    ap.add_argument("--rps", type=float, default=100)
    ap.add_argument("--rate", type=float, default=100)
    ap.add_argument("--duration", type=float, default=20)
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--mode", choices=["cpu", "wall", "gil"], default="wall")
    ap.add_argument("--captures", default="kernel,reads",
                    help="comma-separated --capture values, alternated each round")
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    stats_before = None
    if os.access(BPF_STATS, os.W_OK):
        with open(BPF_STATS) as f:
            stats_before = f.read().strip()
        with open(BPF_STATS, "w") as f:
            f.write("1")
    port = free_port()
    gunicorn = serve(args.python, port, args.workers)
    load = Load(port, args.rps)
    results = []
    try:
        time.sleep(2)
        for _ in range(args.rounds):
            for capture in args.captures.split(","):
                load.take()
                t0 = time.monotonic()
                r = one_run(args, port, capture)
                r["requests_per_s"] = round(load.take() / (time.monotonic() - t0), 1)
                results.append(r)
                if not args.json:
                    print(f"{capture:>6}: pyfleet {r['steady_cpu_percent']:.2f}% of a core "
                          f"steady ({r['cpu_percent_whole_run']:.2f}% the whole run), BPF "
                          f"{r['steady_bpf_cpu_percent']:.3f}%, peak RSS {r['peak_rss_mib']} "
                          f"MiB, {r['requests_per_s']} requests/s", flush=True)
    finally:
        load.close()
        gunicorn.terminate()  # the master stops its workers
        try:
            gunicorn.wait(timeout=30)
        except subprocess.TimeoutExpired:
            gunicorn.kill()
            gunicorn.wait()
        if stats_before is not None:
            with open(BPF_STATS, "w") as f:
                f.write(stats_before)
    if args.json:
        print(json.dumps({"mode": args.mode, "workers": args.workers, "runs": results}, indent=2))


if __name__ == "__main__":
    main()
