"""A fleet member for examples/fleet/bench.py: one of several workload shapes, until killed.

    worker.py busy|idle|deep|threads|periodic|sleeper [TOKEN]
busy: one thread computing 3% of the time in short bursts; idle: blocked like a web worker
between requests; deep: a 300-frame stack that sleeps; threads: 6 threads, half of them busy like `busy`;
periodic: a 25-frame stack that does about 1 ms of work every 50 ms (a mostly idle worker);
sleeper: a 25-frame stack that sleeps for good."""
import math
import sys
import threading
import time

kind = sys.argv[1] if len(sys.argv) > 1 else "idle"


def crunch(n):
    return sum(math.sqrt(i) for i in range(n))


def busy_loop(duty=0.03):
    while True:
        t0 = time.monotonic()
        while time.monotonic() - t0 < 0.01 * duty:
            crunch(500)
        time.sleep(0.01 * (1 - duty))


def down(n, bottom=lambda: time.sleep(1)):
    if n == 0:
        while True:
            bottom()
    return down(n - 1, bottom)


def periodic_tick():
    t0 = time.monotonic()
    while time.monotonic() - t0 < 0.001:
        crunch(200)
    time.sleep(0.05)


if kind == "busy":
    target = busy_loop
elif kind == "deep":
    sys.setrecursionlimit(2000)
    target = lambda: down(300)  # noqa: E731
elif kind == "periodic":
    target = lambda: down(25, periodic_tick)  # noqa: E731
elif kind == "sleeper":
    target = lambda: down(25)  # noqa: E731
elif kind == "threads":
    for i in range(6):
        threading.Thread(target=busy_loop if i % 2 else lambda: time.sleep(1e9), daemon=True).start()
    target = lambda: time.sleep(1e9)  # noqa: E731
else:
    target = lambda: threading.Event().wait()  # noqa: E731
print("ready", flush=True)
target()
