"""Target for the thread-status test: one thread spins in pure Python (it holds the GIL and is
on CPU nearly all the time), the main thread waits on an Event (no GIL, asleep). Writes
OUT_DIR/threads.json with both idents once the spinner runs."""
import json
import os
import sys
import threading

out_dir = sys.argv[1]
started = threading.Event()
never = threading.Event()


def spin():
    started.set()
    x = 0
    while True:
        x = (x * 31 + 7) % 1000003


t = threading.Thread(target=spin, daemon=True)
t.start()
started.wait()
tmp = os.path.join(out_dir, "threads.json.tmp")
with open(tmp, "w") as f:
    json.dump({"busy": t.ident, "idle": threading.get_ident()}, f)
os.replace(tmp, os.path.join(out_dir, "threads.json"))
never.wait()
