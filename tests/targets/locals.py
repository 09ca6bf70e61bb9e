"""Target whose parked frames hold locals of every kind `dump --locals` shows.

usage: locals.py READY_FILE EXPECTED_FILE

Writes EXPECTED_FILE (JSON: each parked function's name -> {local: what dump should show},
computed here from the values themselves with repr() and id()), then READY_FILE
(atomically), then parks in `park` until killed (or for LIFETIME seconds).
"""

import json
import os
import signal
import sys
import time

sys.dont_write_bytecode = True

LIFETIME = 600
# As pyfleet bounds them (src/cpython/locals.rs).
MAX_VALUE_CHARS = 80


class Opaque:
    def __repr__(self):
        # Must never run: pyfleet reads memory, it does not call into the target.
        os._exit(99)


def shown(value):
    """What pyfleet shows for `value`: a repr for the simple types, else type and address."""
    t = type(value)
    if value is None or t in (bool, int, float):
        return repr(value)
    if t in (str, bytes):
        if len(value) > MAX_VALUE_CHARS:
            return repr(value[:MAX_VALUE_CHARS]) + "..."
        return repr(value)
    if t in (tuple, list, dict):
        return "<%s of %d items at %#x>" % (t.__name__, len(value), id(value))
    # The type's tp_name: a class's own name; a C type's as written in C, with its module.
    heap_type = t.__flags__ & (1 << 9)
    if heap_type or t.__module__ == "builtins":
        name = t.__name__
    else:
        name = "%s.%s" % (t.__module__, t.__qualname__)
    return "<%s object at %#x>" % (name, id(value))


def write_atomically(path, text):
    tmp = path + ".tmp"
    with open(tmp, "w") as f:
        f.write(text)
    os.replace(tmp, path)


def park(expected, ready):
    write_atomically(ready, "ready\n")
    while True:
        time.sleep(3600)


def holder(expected_path, ready):
    small = 42
    negative = -7
    big = 2**100 + 12345
    huge_negative = -(2**64)
    yes = True
    no = False
    nothing = None
    ratio = 3.25
    tiny = 1.5e-05
    large = 1e16
    text = "it's plain"
    hostile = "\x1b[31mred\n\ttab\u00e9\u4e2d"
    quoted = 'say "hi"'
    long_text = "x" * (MAX_VALUE_CHARS + 20)
    raw = b"\x00\x01ab'\"\\\n\xff"
    items = [1, 2, 3]
    pair = (1, "two")
    table = {"a": 1, "b": 2}
    opaque = Opaque()
    numbers = {1, 2}
    captured = "in a cell"

    def inner():
        return captured

    expected = {"holder": {name: shown(value) for name, value in locals().items()}}
    expected["holder"]["expected"] = shown(expected)
    write_atomically(expected_path, json.dumps(expected))
    park(expected, ready)
    # Never bound while parked: not shown.
    unbound = 1
    return unbound


def main():
    signal.alarm(LIFETIME)
    if len(sys.argv) != 3:
        sys.exit("usage: locals.py READY_FILE EXPECTED_FILE")
    holder(sys.argv[2], sys.argv[1])


if __name__ == "__main__":
    main()
