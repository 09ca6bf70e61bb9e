"""Parking helpers shared by stacks.py and subinterp_target.py.

A thread "parks" by calling park(): it records its own frame object and then
blocks forever in a C call (Lock.acquire on a lock that is never released), so
its Python stack and the line numbers in it never change again.

The expectation is taken from the interpreter itself: a reporter thread reads
the recorded frame objects (f_code, f_lineno, f_back) once every parked thread
is really blocked.  sys._current_frames() is deliberately not the primary
source: on 3.12+ it walks the thread states of *every* interpreter (thread ids
collide when one OS thread has a thread state in several interpreters, and it
creates frame objects for frames that belong to other interpreters).  When no
sub-interpreters exist, stacks.py cross-checks against sys._current_frames().

Each interpreter imports its own copy of this module, so the state below is
per interpreter.
"""

import json
import linecache
import os
import sys
import threading
import time

_NEVER = threading.Lock()
_NEVER.acquire()

# ident -> (frame object, line the frame must be on once the thread is blocked)
_watched = {}


def park():
    _watched[threading.get_ident()] = (sys._getframe(), PARK_LINE)
    _NEVER.acquire()
    raise AssertionError("unreachable: the parking lock is never released")


PARK_LINE = park.__code__.co_firstlineno + 2


def park_unwatched():
    """Block forever without being part of the expectation (reporters)."""
    _NEVER.acquire()
    raise AssertionError("unreachable: the parking lock is never released")


def watch_caller_next_line():
    """Register the caller's frame; its thread is considered settled once the
    caller is on the line right after the call to this function (which must
    be a blocking C call that never returns, e.g. running a sub-interpreter)."""
    frame = sys._getframe(1)
    _watched[threading.get_ident()] = (frame, frame.f_lineno + 1)


def fail(message):
    sys.stderr.write("TARGET FAILURE: %s\n" % message)
    sys.stderr.flush()
    os._exit(3)


def _check_source():
    text = linecache.getline(__file__, PARK_LINE).strip()
    if text != "_NEVER.acquire()":
        fail("PARK_LINE %d of %s is %r, not the blocking call" % (PARK_LINE, __file__, text))


_check_source()


def wait_until_settled(count, timeout, what):
    """Wait until `count` threads are registered and every registered frame is
    on its final line.  The caller holds the GIL while it looks, so a thread
    seen on its final line has released the GIL inside the blocking call (the
    only place on that line where it can)."""
    deadline = time.monotonic() + timeout
    while True:
        pending = [
            "%s (ident %d) at line %r, want %d" % (thread_name(ident), ident, frame.f_lineno, line)
            for ident, (frame, line) in list(_watched.items())
            if frame.f_lineno != line
        ]
        if len(_watched) >= count and not pending:
            if len(_watched) != count:
                fail("%s: %d threads parked, expected %d" % (what, len(_watched), count))
            return
        if time.monotonic() > deadline:
            fail(
                "%s: timed out after %ss: %d of %d threads registered; not settled: %s"
                % (what, timeout, len(_watched), count, pending)
            )
        time.sleep(0.01)


def thread_name(ident):
    for t in threading.enumerate():
        if t.ident == ident:
            return t.name
    return "?"


def frame_dict(frame):
    code = frame.f_code
    return {
        "function": code.co_name,
        "qualname": code.co_qualname,
        "file": code.co_filename,
        "line": frame.f_lineno,
    }


def stack_of(frame):
    """Frames innermost first, following f_back like the interpreter does."""
    out = []
    while frame is not None:
        out.append(frame_dict(frame))
        frame = frame.f_back
    return out


def snapshot(exclude, phantoms=()):
    """snapshot_once() twice, 50 ms apart: the two must be identical."""
    first = snapshot_once(exclude, phantoms)
    time.sleep(0.05)
    second = snapshot_once(exclude, phantoms)
    if first != second:
        fail("stacks changed while parked:\n%r\n%r" % (first, second))
    return second


def snapshot_once(exclude, phantoms=()):
    """Build {"exclude": [...], "threads": {...}, ...} for this interpreter.

    Every thread known to this interpreter's threading module must be either
    registered (parked) or excluded, except `phantoms`: idents that the
    threading module lists without the thread running in this interpreter
    (in a 3.13+ sub-interpreter, threading.main_thread() is the process's
    main thread)."""
    threads = {}
    for ident, (frame, line) in sorted(_watched.items()):
        stack = stack_of(frame)
        if stack[0]["line"] != line:
            fail("thread %d moved away from line %d: %r" % (ident, line, stack[0]))
        for f in stack:
            if not isinstance(f["line"], int):
                fail("thread %d has a frame without a line number: %r" % (ident, f))
        threads[str(ident)] = stack
    known = {t.ident for t in threading.enumerate()} - set(phantoms)
    accounted = set(_watched) | set(exclude)
    if known != accounted:
        fail(
            "threads of this interpreter %r != parked %r + excluded %r"
            % (sorted(known), sorted(_watched), sorted(exclude))
        )
    names = {}
    native_ids = {}
    for t in threading.enumerate():
        if t.ident in _watched:
            names[str(t.ident)] = t.name
            native_ids[str(t.ident)] = t.native_id
    return {
        "exclude": sorted(exclude),
        "threads": threads,
        "names": names,
        "native_ids": native_ids,
    }


def version_string():
    """Like platform.python_version(): 3.12.1, 3.15.0a1, 3.14.0rc2."""
    v = sys.version_info
    level = {"alpha": "a", "beta": "b", "candidate": "rc", "final": ""}[v.releaselevel]
    return "%d.%d.%d%s" % (v.major, v.minor, v.micro, level + str(v.serial) if level else "")


def write_json_atomic(path, obj):
    tmp = "%s.tmp.%d" % (path, os.getpid())
    with open(tmp, "w", encoding="utf-8") as f:
        json.dump(obj, f, ensure_ascii=False, indent=1, sort_keys=True)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)
