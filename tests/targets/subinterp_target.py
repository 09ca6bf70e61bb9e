"""Runs inside a sub-interpreter started by stacks.py --subinterp.

main(out_dir, expected_id) is called by the runner thread (a thread of the main
interpreter that is executing code in this sub-interpreter).  It starts a
worker thread in this sub-interpreter that builds a small known stack and
parks, starts a reporter thread, and then parks itself (so the runner's stack
in this interpreter is part of the expectation too).  The reporter waits until
both are blocked and writes OUT_DIR/sub-<id>.json atomically:

  {"id": <this interpreter's id>, "exclude": [reporter ident],
   "threads": {...}, "names": {...}, "native_ids": {...}}

(same per-interpreter format as stacks.py's expected.json).
"""

import os
import sys
import threading

import parking

TIMEOUT = 40.0


def current_interpreter_id():
    minor = sys.version_info[1]
    if minor == 12:
        import _xxsubinterpreters

        return int(_xxsubinterpreters.get_current())
    if minor == 13:
        import _interpreters

        return int(_interpreters.get_current()[0])
    from concurrent import interpreters

    return int(interpreters.get_current().id)


class Träger:
    def 運ぶ(self):
        return deeper_𠀀()


def deeper_𠀀():
    parking.park()


def worker():
    Träger().運ぶ()


def reporter(out_dir, iid, n_parked, phantoms):
    try:
        parking.wait_until_settled(n_parked, TIMEOUT, "sub-interpreter %d" % iid)
        result = parking.snapshot([threading.get_ident()], phantoms)
        result["id"] = iid
        parking.write_json_atomic(os.path.join(out_dir, "sub-%d.json" % iid), result)
    except BaseException as e:  # noqa: BLE001
        import traceback

        traceback.print_exc()
        parking.fail("sub-interpreter %d reporter failed: %r" % (iid, e))
    parking.park_unwatched()


def main(out_dir, expected_id):
    iid = current_interpreter_id()
    if iid != expected_id or iid == 0:
        parking.fail("sub-interpreter reports id %r, expected %r" % (iid, expected_id))
    # On 3.13+ threading.main_thread() of a sub-interpreter is the process's
    # main thread, which never runs in this interpreter.
    phantoms = set()
    if threading.main_thread().ident != threading.get_ident():
        phantoms.add(threading.main_thread().ident)
    # Sub-interpreters (isolated config) allow threads but not daemon threads.
    threading.Thread(target=worker, name="sub-%d-worker" % iid).start()
    threading.Thread(target=reporter, args=(out_dir, iid, 2, phantoms), name="sub-%d-reporter" % iid).start()
    parking.park()
