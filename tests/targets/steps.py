"""Target for the idle-thread test: a worker thread whose stack changes only when told.

At step n the worker's stack is step(0) -> ... -> step(n), blocked reading one byte from
the FIFO ./go; each byte written there moves it one step deeper. Before blocking, step n
writes ./step-n. The main thread blocks on a lock. Between steps nothing of the process runs."""
import os
import threading

here = os.getcwd()
go = os.path.join(here, "go")
os.mkfifo(go)
# Read-write: opening does not wait for a writer, and reads never see end-of-file.
fifo = os.open(go, os.O_RDWR)


def step(n):
    with open(os.path.join(here, f"step-{n}"), "w") as f:
        f.write(str(threading.get_native_id()))
    os.read(fifo, 1)
    step(n + 1)


threading.Thread(target=step, args=(0,), name="stepper", daemon=True).start()
forever = threading.Lock()
forever.acquire()
forever.acquire()
