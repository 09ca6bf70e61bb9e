"""Target that spends a known share of its time in the garbage collector, and times it.

usage: gc_heavy.py READY_FILE STATS_FILE

One thread: `make_cycles` builds reference cycles (about 10 ms), then `collect_them` calls
`gc.collect()`, which frees them; automatic collections are off, so the collector runs only
there. `gc.callbacks` times every collection. Each second STATS_FILE is rewritten
(atomically) as JSON: {"gc": seconds in the collector so far, "elapsed": seconds since the
loop started}. READY_FILE is written once the loop runs. Runs until killed (or LIFETIME s).
"""

import gc
import json
import os
import signal
import sys
import time

sys.dont_write_bytecode = True

LIFETIME = 600
in_gc = 0.0
started_gc = None


def timing(phase, info):
    global in_gc, started_gc
    if phase == "start":
        started_gc = time.perf_counter()
    elif started_gc is not None:
        in_gc += time.perf_counter() - started_gc
        started_gc = None


class Node:
    def __init__(self):
        self.other = None
        self.payload = [self]


def make_cycles():
    until = time.perf_counter() + 0.01
    kept = []
    while time.perf_counter() < until:
        a, b = Node(), Node()
        a.other, b.other = b, a
        kept.append(a)
    return len(kept)


def collect_them():
    gc.collect()


def write_atomically(path, text):
    tmp = path + ".tmp"
    with open(tmp, "w") as f:
        f.write(text)
    os.replace(tmp, path)


def main():
    signal.alarm(LIFETIME)
    if len(sys.argv) != 3:
        sys.exit("usage: gc_heavy.py READY_FILE STATS_FILE")
    ready, stats = sys.argv[1], sys.argv[2]
    gc.disable()
    gc.callbacks.append(timing)
    start = time.perf_counter()
    next_write = start
    write_atomically(ready, "ready\n")
    while True:
        make_cycles()
        collect_them()
        now = time.perf_counter()
        if now >= next_write:
            write_atomically(stats, json.dumps({"gc": in_gc, "elapsed": now - start}))
            next_write = now + 1.0


if __name__ == "__main__":
    main()
