"""Known time holding the GIL, for gil mode: the main thread cycles through three phases of
about 20 ms each and times them itself: `compute` (a busy loop: holds the GIL on its CPU),
`blocked` (a C call made with the GIL held, `usleep` through `ctypes.PyDLL`: holds the GIL
off its CPU) and `nap` (`time.sleep`: gives the GIL up). One more thread, `idle`, waits on an
event all along and never holds the GIL.

usage: gil_phases.py OUT [SECONDS]

Appends to OUT a line per phase, `NAME START END` (`time.monotonic()` seconds: the system's
CLOCK_MONOTONIC), flushed at least every 0.05 s; OUT exists once the idle thread runs. Exits
after SECONDS (default 300).
"""

import ctypes
import sys
import threading
import time

PHASE = 0.02
# Calls through PyDLL keep the GIL.
libc = ctypes.PyDLL("libc.so.6")
never = threading.Event()


def idle():
    never.wait()


def compute():
    t0 = time.monotonic()
    x = 0
    while time.monotonic() - t0 < PHASE:
        x += 1
    return x


def blocked():
    libc.usleep(int(PHASE * 1e6))


def nap():
    time.sleep(PHASE)


def main():
    out = sys.argv[1]
    lifetime = float(sys.argv[2]) if len(sys.argv) > 2 else 300.0
    threading.Thread(target=idle, daemon=True).start()
    log = open(out, "w")
    phases = (("compute", compute), ("blocked", blocked), ("nap", nap))
    start = last = time.monotonic()
    while time.monotonic() - start < lifetime:
        for name, phase in phases:
            t0 = time.monotonic()
            phase()
            log.write(f"{name} {t0:.6f} {time.monotonic():.6f}\n")
        if time.monotonic() - last > 0.05:
            last = time.monotonic()
            log.flush()


if __name__ == "__main__":
    main()
