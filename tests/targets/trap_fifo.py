"""A process that tries to blind a profiler through its mappings (tests/it/hostile_processes.rs).

usage: trap_fifo.py TOKEN [fifo|zero|sparse]

Maps a file named like a libpython (`libpython3.12.so.1.0`, 64 KiB of junk) from its working
directory, deletes it, and plants at the path /proc/PID/maps now shows
(`libpython3.12.so.1.0 (deleted)`):
- fifo (the default): a FIFO, whoever opens it to read blocks forever (no writer comes);
- zero: a symlink to /dev/zero, endless zeros to whoever reads it;
- sparse: a sparse file of 1 TiB, a reader that trusts its size reads for hours.
Then writes `ready` to the file `ready` and sleeps. TOKEN only puts a marker in its command
line, for `--match`.
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
planted = NAME + " (deleted)"
mode = sys.argv[2] if len(sys.argv) > 2 else "fifo"
if mode == "fifo":
    os.mkfifo(planted)
elif mode == "zero":
    os.symlink("/dev/zero", planted)
elif mode == "sparse":
    with open(planted, "wb") as f:
        f.truncate(1 << 40)
else:
    sys.exit(f"unknown mode {mode!r}")
with open("ready.tmp", "w") as f:
    f.write("ready")
os.replace("ready.tmp", "ready")
while True:
    time.sleep(1)
