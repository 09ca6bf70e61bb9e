"""Target that runs each task on a thread of its own: a new thread spins in pure Python for
TASK_SECONDS in `task_body`, ends, and the next starts, while the main thread waits for it in
`wait_for_task` (off CPU). So every on-CPU sample is of a thread that did not exist a moment
before. Writes READY_FILE (atomically) once the first task runs. Runs until killed (or for
LIFETIME seconds, as a safety net)."""
import os
import sys
import threading
import time

TASK_SECONDS = 0.5
LIFETIME = 600

ready_file = sys.argv[1]


def task_body(started):
    started.set()
    end = time.monotonic() + TASK_SECONDS
    x = 0
    while time.monotonic() < end:
        for _ in range(1000):
            x = (x * 31 + 7) % 1000003


def wait_for_task(t):
    t.join()


first = True
deadline = time.monotonic() + LIFETIME
while time.monotonic() < deadline:
    started = threading.Event()
    t = threading.Thread(target=task_body, args=(started,))
    t.start()
    if first:
        started.wait()
        with open(ready_file + ".tmp", "w") as f:
            f.write("ready")
        os.replace(ready_file + ".tmp", ready_file)
        first = False
    wait_for_task(t)
