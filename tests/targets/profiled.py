"""Target for the output-format and `record` tests: known, distinct function names.

usage: profiled.py READY_FILE [SECONDS]

The main thread spends most of its time in pyfleet_hot_leaf (under pyfleet_hot_outer) and
some in pyfleet_warm_leaf; a second thread sleeps in pyfleet_sleeping_worker. The function
pyfleet_never_called is defined but never runs: it must appear in no profile. Writes
READY_FILE (atomically) once the work has started, then exits by itself after SECONDS
(default: run until killed, or 600 s as a safety net).
"""

import os
import signal
import sys
import threading
import time

sys.dont_write_bytecode = True


def pyfleet_never_called():
    return sum(range(10))


def pyfleet_hot_leaf(n):
    total = 0
    for i in range(n):
        total += i * i
    return total


def pyfleet_warm_leaf(n):
    return sorted(str(i) for i in range(n))


def pyfleet_hot_outer(deadline):
    while time.monotonic() < deadline:
        for _ in range(8):
            pyfleet_hot_leaf(20000)
        pyfleet_warm_leaf(2000)


def pyfleet_sleeping_worker():
    while True:
        time.sleep(0.5)


def main():
    if len(sys.argv) < 2:
        sys.exit("usage: profiled.py READY_FILE [SECONDS]")
    seconds = float(sys.argv[2]) if len(sys.argv) > 2 else 0.0
    signal.alarm(600)
    threading.Thread(target=pyfleet_sleeping_worker, daemon=True).start()
    deadline = time.monotonic() + (seconds if seconds > 0 else 600)
    ready = sys.argv[1]
    with open(ready + ".tmp", "w") as f:
        f.write(str(os.getpid()))
    os.replace(ready + ".tmp", ready)
    pyfleet_hot_outer(deadline)


if __name__ == "__main__":
    main()
