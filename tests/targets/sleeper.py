"""Idle Python process for `pyfleet list` tests.

usage: sleeper.py READY_FILE MARKER...

Writes its Python version (like platform.python_version(): "3.12.1",
"3.15.0a1") to READY_FILE atomically, then sleeps until killed (or for
LIFETIME seconds, as a safety net).  MARKER arguments are only there to be
found in the command line.
"""

import os
import signal
import sys
import time

sys.dont_write_bytecode = True

LIFETIME = 600


def version_string():
    v = sys.version_info
    level = {"alpha": "a", "beta": "b", "candidate": "rc", "final": ""}[v.releaselevel]
    return "%d.%d.%d%s" % (v.major, v.minor, v.micro, level + str(v.serial) if level else "")


def main():
    signal.alarm(LIFETIME)
    if len(sys.argv) < 2:
        sys.exit("usage: sleeper.py READY_FILE MARKER...")
    ready = sys.argv[1]
    tmp = ready + ".tmp"
    with open(tmp, "w") as f:
        f.write(version_string() + "\n")
    os.replace(tmp, ready)
    while True:
        time.sleep(3600)


if __name__ == "__main__":
    main()
