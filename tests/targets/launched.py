"""Target for `record -- COMMAND`: busy in `early_work` for its first 0.5 s, then in
`late_work` for 1.5 s, then exits with status 3. With `pool`, a multiprocessing pool (spawn)
of two workers runs `pool_work` for 1 s in between, once in each worker: a task waits at a
barrier for the other before it spins, so one worker cannot take both (as it did when the
other was slow to start).

usage: launched.py [pool]
"""

import sys
import time


def spin(seconds):
    until = time.monotonic() + seconds
    while time.monotonic() < until:
        pass


def early_work():
    spin(0.5)


def late_work():
    spin(1.5)


barrier = None


def join_pool(pool_barrier):
    global barrier
    barrier = pool_barrier


def pool_work(_):
    barrier.wait(timeout=60)
    spin(1.0)
    return 0


if __name__ == "__main__":
    early_work()
    if "pool" in sys.argv[1:]:
        import multiprocessing

        spawn = multiprocessing.get_context("spawn")
        with spawn.Pool(2, initializer=join_pool, initargs=(spawn.Barrier(2),)) as pool:
            pool.map(pool_work, range(2), chunksize=1)
    late_work()
    sys.exit(3)
