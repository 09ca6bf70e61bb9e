"""What the fleet page's requests cost the daemon: a fleet of N workers (worker.py, every
interpreter found) profiled by `pyfleet run --match TOKEN` with snapshots every 10 s, then each
of the page's requests timed (the median of --repeat, the client's wall time; `/api/fleet`
2 s apart as a viewer polls; a live window's second left out) with the size of its answer, and the daemon's RSS before and after it keeps
its last 8 live windows. Run as root after `cargo build --release`:

    python3 examples/fleet/page_cost.py --processes 200 --kinds sleeper,periodic

Not a test: figures go in BENCHMARKS.md.
"""
import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from bench import HERE, ROOT, free_port, interpreters  # noqa: E402

FORMATS = ["folded", "svg", "speedscope.json", "pb.gz"]


def get(port, path):
    t0 = time.monotonic()
    with urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=120) as r:
        body = r.read()
    return time.monotonic() - t0, body


def timed(port, path, repeat, gap=0.0):
    """The median time of `repeat` requests, `gap` seconds apart."""
    times, size = [], 0
    for _ in range(repeat):
        time.sleep(gap)
        t, body = get(port, path)
        times.append(t)
        size = len(body)
    return {"path": path, "ms": round(1000 * statistics.median(times), 1), "bytes": size}


def rss_kib(pid):
    with open(f"/proc/{pid}/status") as f:
        return next(int(l.split()[1]) for l in f if l.startswith("VmRSS:"))


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--pyfleet", default=str(ROOT / "target/release/pyfleet"))
    ap.add_argument("--processes", type=int, default=32)
    ap.add_argument("--kinds", default="periodic,sleeper")
    ap.add_argument("--repeat", type=int, default=5)
    args = ap.parse_args()
    kinds = args.kinds.split(",")
    pythons = interpreters()
    token = f"page-cost-{os.getpid()}"
    procs, daemon = [], None
    out = tempfile.mkdtemp(prefix="pyfleet-page-cost-")
    try:
        for i in range(args.processes):
            procs.append(subprocess.Popen(
                [str(pythons[i % len(pythons)]), str(HERE / "worker.py"), kinds[i % len(kinds)],
                 token], stdout=subprocess.PIPE, text=True))
        for p in procs:
            if "ready" not in p.stdout.readline():
                raise SystemExit("a worker did not start")
        port = free_port()
        daemon = subprocess.Popen(
            [args.pyfleet, "run", "--match", token, "--mode", "wall", "--snapshot-interval",
             "10s", "--out", os.path.join(out, "snapshots"), "--metrics-addr",
             f"127.0.0.1:{port}"], stderr=subprocess.DEVNULL)
        snapshots = []
        deadline = time.monotonic() + 120
        while len(snapshots) < 2 and time.monotonic() < deadline:
            time.sleep(1)
            try:
                snapshots = json.loads(get(port, "/api/snapshots")[1])
            except OSError:
                pass
        if len(snapshots) < 2:
            raise SystemExit("the daemon wrote fewer than two snapshots")
        new, base = snapshots[0]["name"], snapshots[1]["name"]
        pid = json.loads(get(port, "/api/fleet")[1])["processes"][0]["pid"]
        # /api/fleet as one viewer's polls are, 2 s apart: past its rendering's reuse.
        rows = [timed(port, "/metrics", args.repeat), timed(port, "/api/fleet", args.repeat, 2.0),
                timed(port, "/api/snapshots", args.repeat)]
        rss_before = rss_kib(daemon.pid)
        ids = []
        for _ in range(8):
            t, body = get(port, "/api/window?seconds=1")
            ids.append(json.loads(body)["id"])
        rows.append({"path": "/api/window?seconds=1 (beyond its second)", "ms": round(1000 * (t - 1), 1),
                     "bytes": len(body)})
        rss_after = rss_kib(daemon.pid)
        for f in FORMATS:
            rows.append(timed(port, f"/windows/{ids[-1]}/window.{f}", args.repeat))
        for f in FORMATS:
            rows.append(timed(port, f"/snapshots/{new}/window.{f}", args.repeat))
        rows.append(timed(port, f"/snapshots/{new}/window.svg?pid={pid}", args.repeat))
        rows.append(timed(port, f"/diff.svg?base={base}&new={new}", args.repeat))
        print(json.dumps({"processes": args.processes, "kinds": kinds,
                          "rss_kib_before_windows": rss_before,
                          "rss_kib_with_8_windows": rss_after, "requests": rows}, indent=1))
    finally:
        if daemon:
            daemon.terminate()
            daemon.wait()
        for p in procs:
            p.kill()
            p.wait()


if __name__ == "__main__":
    main()
