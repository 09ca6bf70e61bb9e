"""A Python process whose code objects carry huge names (tests/it/hostile_processes.rs).

usage: name_bomb.py [FUNCTIONS [CHARS [TABLE]]]

Makes FUNCTIONS (default 300) functions whose code objects share one CHARS-character
(default 1,000,000) name, qualified name and file name, a 4-byte kind string (4 MB), calls
them one inside the other (every one of them on the stack at once), and spins at the top.
With TABLE (bytes), they also share one line table of that size in which every instruction
starts a new line. Writes `ready` to the file `ready` once the chain is up. Its own memory:
about 16 MB, and TABLE.
"""

import sys

functions = int(sys.argv[1]) if len(sys.argv) > 1 else 300
chars = int(sys.argv[2]) if len(sys.argv) > 2 else 1_000_000
table = int(sys.argv[3]) if len(sys.argv) > 3 else 0
# 0xd8: a one-line entry (code 11: next line) of one code unit.
TABLE = b"\xd8" * table
NAME = "\U00020000" * chars  # outside the BMP: 4 bytes a character


def spin():
    with open("ready.tmp", "w") as f:
        f.write("ready")
    import os

    os.replace("ready.tmp", "ready")
    x = 0
    while True:
        x = (x * 31 + 7) % 1000003


def make(callee):
    def link():
        callee()

    code = link.__code__.replace(co_name=NAME, co_qualname=NAME, co_filename=NAME)
    if TABLE:
        code = code.replace(co_linetable=TABLE)
    link.__code__ = code
    return link


top = spin
for _ in range(functions):
    top = make(top)
top()
