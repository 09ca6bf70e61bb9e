"""Target for the diff test in absolute terms: a request every 100 ms, each `handle` (10 ms on
a CPU) then `report` (as many ms as the file named by the second argument says, re-read every
0.2 s), then idle until the next request. The seconds spent in each so far, the time now and
the requests served go to the file named by the third, as `handle report now served`, after
each request. Writes the file named by
the first once running. Work is timed by the wall clock while it runs (perf_counter), as a
CPU's sampling clock counts it."""
import os
import sys
import time

ready, cost_file, times_file = sys.argv[1:4]
SLOT = 0.1
HANDLE = 0.010
spent = {"handle": 0.0, "report": 0.0}
served = 0


# Each burns in its own loop: the innermost frame of its samples is itself.
def handle():
    until = time.perf_counter() + HANDLE
    x = 0
    while time.perf_counter() < until:
        x = (x * 31 + 7) % 1000003
    return x


def report(seconds):
    until = time.perf_counter() + seconds
    x = 0
    while time.perf_counter() < until:
        x = (x * 17 + 3) % 1000033
    return x


def cost():
    try:
        with open(cost_file) as f:
            return min(max(float(f.read().strip()) / 1000.0, 0.0), 0.08)
    except (OSError, ValueError):
        return 0.05


def write_times():
    tmp = times_file + ".tmp"
    with open(tmp, "w") as f:
        f.write(f"{spent['handle']} {spent['report']} {time.perf_counter()} {served}\n")
    os.replace(tmp, times_file)


c = cost()
write_times()
with open(ready, "w") as f:
    f.write("ready\n")
next_slot = next_read = time.perf_counter()
while True:
    t0 = time.perf_counter()
    handle()
    t1 = time.perf_counter()
    report(c)
    t2 = time.perf_counter()
    spent["handle"] += t1 - t0
    spent["report"] += t2 - t1
    served += 1
    write_times()
    if t2 >= next_read:
        c = cost()
        next_read = t2 + 0.2
    next_slot += SLOT
    pause = next_slot - time.perf_counter()
    if pause > 0:
        time.sleep(pause)
    else:
        next_slot = time.perf_counter()
