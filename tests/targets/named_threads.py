"""Threads with names and known work, for --threads, --idle and dump's thread names.

- "cruncher": busy computing in `crunch` (on its CPU);
- "napper": waits in the program's own `nap` (time.sleep: off its CPU, not idle by the rule);
- "waiter": waits on a threading.Event nobody sets (idle: threading's wait);
- a ThreadPoolExecutor's two workers, idle on their queue (idle: concurrent.futures' _worker),
  named "pool_0" and "pool_1" by thread_name_prefix;
- "renamer" renames itself once started, to "wörker-renamed-after-start" (the threading
  module's name then differs from the kernel's), and waits on an Event (idle);
- the main thread waits to be killed (Event.wait: idle).
Threads name themselves at the OS level too (3.14+ CPython does it from Thread.name; before,
the target does it with prctl), so each one's kernel name is its threading name.
Writes argv[1] once every thread runs.
"""
import concurrent.futures
import ctypes
import sys
import threading
import time

PR_SET_NAME = 15


def os_name(name):
    if sys.version_info < (3, 14):
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(PR_SET_NAME, name.encode()[:15], 0, 0, 0)


def crunch():
    total = 0
    for i in range(2000):
        total += i * i
    return total


def cruncher():
    os_name("cruncher")
    while True:
        crunch()


def nap():
    time.sleep(0.5)


def napper():
    os_name("napper")
    while True:
        nap()


def waiter():
    os_name("waiter")
    threading.Event().wait()


RENAMED = "wörker-renamed-after-start"


def renamer():
    os_name("renamer")
    threading.current_thread().name = RENAMED
    threading.Event().wait()


def pool_ready():
    os_name(threading.current_thread().name)


def main():
    for name, run in [
        ("cruncher", cruncher),
        ("napper", napper),
        ("waiter", waiter),
        ("renamer", renamer),
    ]:
        threading.Thread(target=run, name=name, daemon=True).start()
    pool = concurrent.futures.ThreadPoolExecutor(max_workers=2, thread_name_prefix="pool")
    # Two tasks that overlap, so that the pool starts both its workers.
    barrier = threading.Barrier(2)

    def task():
        pool_ready()
        barrier.wait()

    for f in [pool.submit(task), pool.submit(task)]:
        f.result()
    while not any(t.name == RENAMED for t in threading.enumerate()):
        time.sleep(0.01)
    time.sleep(0.2)
    with open(sys.argv[1], "w") as ready:
        ready.write("ready")
    threading.Event().wait()


main()
