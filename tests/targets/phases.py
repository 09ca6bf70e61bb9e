"""Known time off the CPU, for wall mode: the main thread cycles through four phases of about
20 ms each and times them itself: `compute` (a busy loop), `nap` (a sleep), `locked` (waiting
for a lock another thread holds) and `piped` (a blocking read of a pipe another thread writes
to after a while). Two more threads spin all along, contending for the CPU and the GIL.

usage: phases.py OUT [SECONDS]

Appends to OUT a line per phase, `NAME START END` (`time.monotonic()` seconds: the system's
CLOCK_MONOTONIC), flushed at least every 0.05 s; OUT exists once the helpers run (and "ready"
is printed). Exits after SECONDS (default 300).
"""

import os
import sys
import threading
import time

PHASE = 0.02
lock = threading.Lock()
hold = threading.Event()
held = threading.Event()
write = threading.Event()
pipe_r, pipe_w = os.pipe()


def spin():
    while True:
        pass


def holder():
    while True:
        hold.wait()
        hold.clear()
        with lock:
            held.set()
            time.sleep(PHASE)


def writer():
    while True:
        write.wait()
        write.clear()
        time.sleep(PHASE)
        os.write(pipe_w, b"x")


def compute():
    t0 = time.monotonic()
    x = 0
    while time.monotonic() - t0 < PHASE:
        x += 1
    return x


def nap():
    time.sleep(PHASE)


def locked():
    with lock:
        pass


def piped():
    os.read(pipe_r, 1)


def main():
    out = sys.argv[1]
    lifetime = float(sys.argv[2]) if len(sys.argv) > 2 else 300.0
    for f in (spin, spin, holder, writer):
        threading.Thread(target=f, daemon=True).start()
    log = open(out, "w")
    print("ready", flush=True)
    start = last = time.monotonic()
    while time.monotonic() - start < lifetime:
        for name, phase in (("compute", compute), ("nap", nap)):
            t0 = time.monotonic()
            phase()
            log.write(f"{name} {t0:.6f} {time.monotonic():.6f}\n")
        hold.set()
        held.wait()
        held.clear()
        t0 = time.monotonic()
        locked()
        log.write(f"locked {t0:.6f} {time.monotonic():.6f}\n")
        write.set()
        t0 = time.monotonic()
        piped()
        log.write(f"piped {t0:.6f} {time.monotonic():.6f}\n")
        if time.monotonic() - last > 0.05:
            last = time.monotonic()
            log.flush()


if __name__ == "__main__":
    main()
