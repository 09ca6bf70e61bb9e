"""Known time off the CPU, for wall mode: the main thread cycles through four phases of about
20 ms each and times them itself: `compute` (a busy loop), `nap` (a sleep), `locked` (waiting
for a lock another thread holds) and `piped` (a blocking read of a pipe another thread writes
to after a while). Two more threads spin all along, contending for the CPU and the GIL.

usage: phases.py OUT [SECONDS]

Writes OUT (JSON, replaced atomically every 0.2 s): the seconds spent in each phase so far
(`{"compute": s, "nap": s, "locked": s, "piped": s}`). Prints "ready" once the helpers run.
Exits after SECONDS (default 300).
"""

import json
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
    spent = {"compute": 0.0, "nap": 0.0, "locked": 0.0, "piped": 0.0}
    print("ready", flush=True)
    start = last = time.monotonic()
    while time.monotonic() - start < lifetime:
        for name, phase in (("compute", compute), ("nap", nap)):
            t0 = time.monotonic()
            phase()
            spent[name] += time.monotonic() - t0
        hold.set()
        held.wait()
        held.clear()
        t0 = time.monotonic()
        locked()
        spent["locked"] += time.monotonic() - t0
        write.set()
        t0 = time.monotonic()
        piped()
        spent["piped"] += time.monotonic() - t0
        if time.monotonic() - last > 0.2:
            last = time.monotonic()
            with open(out + ".tmp", "w") as f:
                json.dump(spent, f)
            os.replace(out + ".tmp", out)


if __name__ == "__main__":
    main()
