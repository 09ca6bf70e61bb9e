"""Churn soak: pyfleet's daemon beside a stream of short-lived Python processes.

    python3 examples/fleet/churn_soak.py [--processes 10000] [--per-second 10]
        [--python /usr/bin/python3.11] [--metrics] [--pyfleet target/release/pyfleet]

Starts `pyfleet --match TOKEN` (snapshots every 10 s into a temporary directory, with
`--metrics-addr` on a free port when --metrics is given, never scraped until the end), then
starts --per-second Python processes a second, each living 0.2-1.5 s (seeded), with TOKEN in
its command line. Every 10% of the processes it prints the daemon's RSS (VmRSS) and open file
descriptors. At the end, with --metrics: scrapes /metrics once, counts the series that carry a
`pid` label, waits one idle timeout (10 s by default, plus a render interval) and counts
again. A bounded daemon shows RSS after the last process within a few MiB of RSS after the
first 10%, flat descriptors, and no `pid` series left after the wait.
"""

import argparse
import os
import random
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))


def rss_kib(pid):
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
    return 0


def fds(pid):
    return len(os.listdir(f"/proc/{pid}/fd"))


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def pid_series(port):
    text = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10).read().decode()
    return sum(1 for line in text.splitlines() if not line.startswith("#") and 'pid="' in line)


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--processes", type=int, default=10000)
    ap.add_argument("--per-second", type=float, default=10.0)
    ap.add_argument("--python", default="/usr/bin/python3.11")
    ap.add_argument("--metrics", action="store_true")
    ap.add_argument("--pyfleet", default=os.path.join(ROOT, "target/release/pyfleet"))
    args = ap.parse_args()

    token = f"churnsoak{os.getpid()}"
    out = tempfile.mkdtemp(prefix="pyfleet-churn-")
    cmd = [args.pyfleet, "--match", token, "--out", out, "--snapshot-interval", "10"]
    port = None
    if args.metrics:
        port = free_port()
        cmd += ["--metrics-addr", f"127.0.0.1:{port}"]
    daemon = subprocess.Popen(cmd, stderr=subprocess.PIPE, text=True)
    time.sleep(1)
    rng = random.Random(1)
    live = []
    step = max(1, args.processes // 10)
    print(f"daemon pid {daemon.pid}, metrics {'on' if port else 'off'}; {args.python}")
    print("| processes started | daemon RSS (MiB) | open fds |")
    print("|---|---|---|")
    gap = 1.0 / args.per_second
    start = time.monotonic()
    for i in range(1, args.processes + 1):
        life = rng.uniform(0.2, 1.5)
        live.append(
            subprocess.Popen(
                [args.python, "-c", f"import time; time.sleep({life:.3f})  # {token}"],
                stdin=subprocess.DEVNULL,
            )
        )
        live = [p for p in live if p.poll() is None]
        if i % step == 0:
            print(f"| {i} | {rss_kib(daemon.pid) / 1024:.1f} | {fds(daemon.pid)} |", flush=True)
        delay = start + i * gap - time.monotonic()
        if delay > 0:
            time.sleep(delay)
    for p in live:
        p.wait()
    time.sleep(3)
    print(f"after the last exit: RSS {rss_kib(daemon.pid) / 1024:.1f} MiB, {fds(daemon.pid)} fds")
    if port:
        print(f"series with a pid label, first scrape: {pid_series(port)}")
        time.sleep(16)
        print(f"series with a pid label, 16 s later: {pid_series(port)}")
    daemon.terminate()
    daemon.wait(timeout=10)
    print(daemon.stderr.read().strip().splitlines()[-1])


if __name__ == "__main__":
    sys.exit(main())
