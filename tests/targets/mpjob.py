"""A multiprocessing job: three worker processes burn CPU in `mp_burn` while the parent waits.

usage: mpjob.py READY_FILE START_METHOD SECONDS

START_METHOD is fork, spawn or forkserver. Writes the workers' pids, one per line, to
READY_FILE (atomically) once all three run, then waits for them.
"""

import multiprocessing
import os
import sys
import time

sys.dont_write_bytecode = True


def mp_burn(seconds, started):
    started.set()
    end = time.monotonic() + seconds
    n = 0
    while time.monotonic() < end:
        n += sum(i * i for i in range(200))
    return n


def main():
    ready, method, seconds = sys.argv[1], sys.argv[2], float(sys.argv[3])
    ctx = multiprocessing.get_context(method)
    workers = []
    for _ in range(3):
        started = ctx.Event()
        p = ctx.Process(target=mp_burn, args=(seconds, started))
        p.start()
        workers.append((p, started))
    for p, started in workers:
        started.wait(60)
    tmp = ready + ".tmp"
    with open(tmp, "w") as f:
        f.write("".join(f"{p.pid}\n" for p, _ in workers))
    os.rename(tmp, ready)
    for p, _ in workers:
        p.join()


if __name__ == "__main__":
    main()
