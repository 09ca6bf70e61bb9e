"""A process that tries to blind a profiler through its mappings (tests/hostile_processes.rs).

usage: trap_fifo.py TOKEN

Maps a file named like a libpython (`libpython3.12.so.1.0`, 64 KiB of junk) from its working
directory, deletes it, and creates a FIFO where /proc/PID/maps now points
(`libpython3.12.so.1.0 (deleted)`): whoever opens the mapped path to read it blocks forever
(no writer ever comes). Then writes `ready` to the file `ready` and sleeps. TOKEN only puts
a marker in its command line, for `--match`.
"""

import mmap
import os
import sys
import time

NAME = "libpython3.12.so.1.0"

with open(NAME, "wb") as f:
    f.write(os.urandom(64 << 10))
with open(NAME, "rb") as f:
    mapped = mmap.mmap(f.fileno(), 0, prot=mmap.PROT_READ)
os.unlink(NAME)
os.mkfifo(NAME + " (deleted)")
with open("ready.tmp", "w") as f:
    f.write("ready")
os.replace("ready.tmp", "ready")
while True:
    time.sleep(1)
