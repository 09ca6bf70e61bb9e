"""Known holders of the GIL, for wall mode's blame of GIL waits: thread `holder` alternates two
C calls made with the GIL held (`usleep` through `ctypes.PyDLL`), `alpha_block` of 20 to 40 ms
and `beta_block` of 5 to 15 ms, at random (so that no sampling rate locks onto the cycle);
thread `waiter` runs Python all along, so it waits for the GIL whenever the holder is in one
of them (and holds it, for a switch interval, in between). The main thread waits on an event.

The holder cannot time a call from inside: returning from it may hand the GIL to the waiter
before the next timestamp. So the holder's time in each is the time it asked for, plus the
overshoot of such a call measured at start, before the waiter runs.

usage: gil_holders.py OUT

Writes OUT once both threads run, then rewrites it about every 0.1 s with the holder's
seconds in each call so far: `{"alpha_block": s, "beta_block": s}`.
"""

import ctypes
import json
import os
import random
import sys
import threading
import time

# Calls through PyDLL keep the GIL.
libc = ctypes.PyDLL("libc.so.6")
out = sys.argv[1]
spent = {"alpha_block": 0.0, "beta_block": 0.0}
started = threading.Barrier(3)
never = threading.Event()


def overshoot():
    """The mean time a GIL-holding usleep takes beyond what it asks, alone."""
    extra = 0.0
    for _ in range(20):
        t0 = time.perf_counter()
        libc.usleep(5000)
        extra += time.perf_counter() - t0 - 0.005
    return extra / 20


OVERSHOOT = overshoot()


def alpha_block(us):
    libc.usleep(us)


def beta_block(us):
    libc.usleep(us)


def holder():
    started.wait()
    rng = random.Random(7)
    while True:
        us = rng.randrange(20000, 40000)
        alpha_block(us)
        spent["alpha_block"] += us / 1e6 + OVERSHOOT
        us = rng.randrange(5000, 15000)
        beta_block(us)
        spent["beta_block"] += us / 1e6 + OVERSHOOT


def waiter():
    started.wait()
    x = 0
    while True:
        x = (x * 31 + 7) % 1000003


def write():
    tmp = out + ".tmp"
    with open(tmp, "w") as f:
        json.dump(spent, f)
    os.replace(tmp, out)


threading.Thread(target=holder, daemon=True).start()
threading.Thread(target=waiter, daemon=True).start()
started.wait()
write()
while not never.wait(0.1):
    write()
