"""Target for the brief-wakes test: threads that sleep in one function, wake briefly, sleep
in another, and time themselves.

Each of THREADS threads calls itself DEPTH deep (a stack that costs more to read than to
check, as a web framework's does), then loops: long_nap() sleeps 45 ms, short_nap() sleeps
15 ms, each followed by a little work. Every thread adds up the time it spends inside each function
(perf_counter around the whole call); the main thread writes the totals to ./shares.json
twice a second (written to a temporary name, then renamed). ./ready appears once every thread
has started."""
import json
import os
import random
import threading
import time

THREADS = 6
DEPTH = 40
here = os.getcwd()
totals = {"long_nap": 0.0, "short_nap": 0.0}
lock = threading.Lock()


def work():
    return sum(i * i for i in range(50))


def long_nap():
    time.sleep(0.045)
    work()


def short_nap():
    time.sleep(0.015)
    work()


def timed(fn):
    t0 = time.perf_counter()
    fn()
    took = time.perf_counter() - t0
    with lock:
        totals[fn.__name__] += took


def loop(depth=DEPTH):
    if depth:
        return loop(depth - 1)
    # Threads out of phase with each other.
    time.sleep(random.random() * 0.06)
    while True:
        timed(long_nap)
        timed(short_nap)


for i in range(THREADS):
    threading.Thread(target=loop, name=f"napper-{i}", daemon=True).start()
open(os.path.join(here, "ready"), "w").close()
while True:
    time.sleep(0.5)
    with lock:
        doc = json.dumps(totals)
    tmp = os.path.join(here, "shares.json.tmp")
    with open(tmp, "w") as f:
        f.write(doc)
    os.replace(tmp, os.path.join(here, "shares.json"))
