"""Target for the diff test: one thread spins in `alpha` for a share of every 20 ms and in
`beta` for the rest. The share is read from the file named by the second argument (re-read
every 0.2 s); the seconds spent in each so far go to the file named by the third, as
`alpha beta`, every 0.1 s. Writes the file named by the first once running."""
import os
import sys
import time

ready, share_file, times_file = sys.argv[1:4]
PERIOD = 0.02
spent = {"alpha": 0.0, "beta": 0.0}


def alpha(until):
    x = 0
    while time.perf_counter() < until:
        x = (x * 31 + 7) % 1000003
    return x


def beta(until):
    x = 0
    while time.perf_counter() < until:
        x = (x * 17 + 3) % 1000033
    return x


def share():
    try:
        with open(share_file) as f:
            return min(max(float(f.read().strip()), 0.0), 1.0)
    except (OSError, ValueError):
        return 0.5


def write_times():
    tmp = times_file + ".tmp"
    with open(tmp, "w") as f:
        f.write(f"{spent['alpha']} {spent['beta']}\n")
    os.replace(tmp, times_file)


p = share()
write_times()
with open(ready, "w") as f:
    f.write("ready\n")
next_read = next_write = time.perf_counter()
while True:
    start = time.perf_counter()
    mid = start + p * PERIOD
    alpha(mid)
    after_alpha = time.perf_counter()
    beta(start + PERIOD)
    end = time.perf_counter()
    spent["alpha"] += after_alpha - start
    spent["beta"] += end - after_alpha
    if end >= next_read:
        p = share()
        next_read = end + 0.2
    if end >= next_write:
        write_times()
        next_write = end + 0.1
