"""Target whose Python stacks change all the time.

usage: churn.py READY_FILE

Threads recurse up and down to random depths (1..200), iterate nested
generators, run coroutines, and short-lived threads keep starting and ending.
READY_FILE is written (atomically) once every kind of churn is running.
Used to kill the process while pyfleet is reading it.  Runs until killed (or
for LIFETIME seconds, as a safety net if the test harness dies).
"""

import asyncio
import os
import random
import signal
import sys
import threading

sys.dont_write_bytecode = True

LIFETIME = 600
MAX_DEPTH = 200

_started = {}
_started_lock = threading.Lock()


def mark(kind):
    with _started_lock:
        _started[kind] = True


def recurse(n, leaf):
    if n <= 1:
        return leaf()
    return recurse(n - 1, leaf) + 1


def small_work():
    return sum(i * i for i in range(random.randint(1, 50)))


def recurser(kind):
    rnd = random.Random()
    mark(kind)
    while True:
        recurse(rnd.randint(1, MAX_DEPTH), small_work)


def gen_leaf(n):
    for i in range(n):
        yield i


def gen_middle(depth, n):
    if depth == 0:
        yield from gen_leaf(n)
    else:
        yield from gen_middle(depth - 1, n)


def generators():
    rnd = random.Random()
    mark("generators")
    while True:
        for _ in gen_middle(rnd.randint(0, 50), rnd.randint(1, 20)):
            recurse(rnd.randint(1, 20), small_work)


async def async_recurse(n):
    if n <= 1:
        await asyncio.sleep(0)
        return small_work()
    return await async_recurse(n - 1) + 1


async def async_main():
    rnd = random.Random()
    mark("asyncio")
    while True:
        await asyncio.gather(*(async_recurse(rnd.randint(1, 60)) for _ in range(rnd.randint(1, 5))))


def run_asyncio():
    asyncio.run(async_main())


def short_lived(depth):
    recurse(depth, small_work)


def spawner():
    rnd = random.Random()
    mark("spawner")
    while True:
        threads = [
            threading.Thread(target=short_lived, args=(rnd.randint(1, MAX_DEPTH),), daemon=True)
            for _ in range(rnd.randint(1, 4))
        ]
        for t in threads:
            t.start()
        for t in threads:
            t.join()


def main():
    signal.alarm(LIFETIME)
    if len(sys.argv) != 2:
        sys.exit("usage: churn.py READY_FILE")
    ready = sys.argv[1]
    kinds = ["recurse-1", "recurse-2", "recurse-3", "generators", "asyncio", "spawner"]
    targets = {
        "recurse-1": lambda: recurser("recurse-1"),
        "recurse-2": lambda: recurser("recurse-2"),
        "recurse-3": lambda: recurser("recurse-3"),
        "generators": generators,
        "asyncio": run_asyncio,
        "spawner": spawner,
    }
    for kind in kinds:
        threading.Thread(target=targets[kind], name=kind, daemon=True).start()
    import time

    deadline = time.monotonic() + 30
    while True:
        with _started_lock:
            if all(_started.get(k) for k in kinds):
                break
        if time.monotonic() > deadline:
            sys.stderr.write("churn: not all threads started: %r\n" % (_started,))
            os._exit(3)
        time.sleep(0.01)
    tmp = ready + ".tmp"
    with open(tmp, "w") as f:
        f.write("%d\n" % os.getpid())
    os.replace(tmp, ready)
    # The main thread churns too.
    recurser("main")


if __name__ == "__main__":
    main()
