"""Target for the pause (--blocking) tests.

usage: pausable.py OUT_DIR

One thread spins in Python, calling short functions (its stack moves all the
time); the main thread waits for signals. Each SIGUSR1
appends a line to OUT_DIR/usr1. Writes OUT_DIR/ready once the spinner runs.
Exits after LIFETIME seconds as a safety net.
"""

import os
import signal
import sys
import threading
import time

LIFETIME = 300
out_dir = sys.argv[1]
started = threading.Event()


def leaf(x):
    return (x * 31 + 7) % 1000003


def middle(x):
    return leaf(leaf(x))


def spin():
    started.set()
    x = 0
    while True:
        x = middle(x)


def on_usr1(signum, frame):
    with open(os.path.join(out_dir, "usr1"), "a") as f:
        f.write("usr1\n")


signal.signal(signal.SIGUSR1, on_usr1)
threading.Thread(target=spin, daemon=True).start()
started.wait()
tmp = os.path.join(out_dir, "ready.tmp")
with open(tmp, "w") as f:
    f.write(str(os.getpid()))
os.replace(tmp, os.path.join(out_dir, "ready"))
deadline = time.monotonic() + LIFETIME
while time.monotonic() < deadline:
    time.sleep(0.05)
