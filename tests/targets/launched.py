"""Target for `record -- COMMAND`: busy in `early_work` for its first 0.5 s, then in
`late_work` for 1.5 s, then exits with status 3. With `pool`, a multiprocessing pool (spawn)
of two workers runs `pool_work` for 1 s in between.

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


def pool_work(_):
    spin(1.0)
    return 0


if __name__ == "__main__":
    early_work()
    if "pool" in sys.argv[1:]:
        import multiprocessing

        with multiprocessing.get_context("spawn").Pool(2) as pool:
            pool.map(pool_work, range(2))
    late_work()
    sys.exit(3)
