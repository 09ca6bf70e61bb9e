"""Target for the GIL metrics' test: two threads spin in pure Python and contend for the GIL
(each holds it about half the time and waits for it the rest), a third sleeps, and the main
thread waits on an Event (neither wants the GIL). Writes the file named by its first argument
once the spinners run."""
import sys
import threading
import time

ready = sys.argv[1]
started = threading.Barrier(3)
never = threading.Event()


def spin():
    started.wait()
    x = 0
    while True:
        x = (x * 31 + 7) % 1000003


def sleep():
    while True:
        time.sleep(3600)


for target in (spin, spin):
    threading.Thread(target=target, daemon=True).start()
threading.Thread(target=sleep, daemon=True).start()
started.wait()
with open(ready, "w") as f:
    f.write("ready\n")
never.wait()
