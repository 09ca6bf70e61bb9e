"""Target for pyfleet's exact-stack tests.

usage: stacks.py OUT_DIR [--subinterp]

Builds known Python stacks in many threads, parks every one of them in a
blocking C call (so no frame or line ever changes again) and, once all of them
are really blocked, writes OUT_DIR/expected.json (atomically) describing every
thread's stack as the interpreter itself reports it:

  {"pid": int, "version": [major, minor, micro],
   "interpreters": {
      "<interpreter id>": {
          "exclude": [idents of threads whose stacks are not part of the
                      expectation (the reporters)],
          "threads": {"<threading.get_ident()>": [
              {"function": co_name, "qualname": co_qualname,
               "file": co_filename, "line": f_lineno}, ...innermost first]},
          "names": {"<ident>": thread name},
          "native_ids": {"<ident>": native thread id}}},
   "version_string": e.g. "3.12.1" or "3.15.0a1"}

With --subinterp (3.12+ only) two sub-interpreters are started from runner
threads; each runs subinterp_target.main(), which writes OUT_DIR/sub-<id>.json
in the same per-interpreter format; those are merged under their ids.

Runs unchanged on CPython 3.11 to 3.15.  Runs until killed (or for LIFETIME
seconds: SIGALRM, as a safety net if the test harness dies without killing it).
"""

import os
import sys

sys.dont_write_bytecode = True

TARGETS_DIR = os.path.dirname(os.path.abspath(__file__))
if sys.path[0] != TARGETS_DIR:
    sys.path.insert(0, TARGETS_DIR)

import asyncio  # noqa: E402
import json  # noqa: E402
import signal  # noqa: E402
import threading  # noqa: E402
import time  # noqa: E402

import parking  # noqa: E402
import módulo  # noqa: E402
import módulo_名前  # noqa: E402
import módulo_𠀀  # noqa: E402
from parking import park  # noqa: E402

SUBINTERPRETERS = 2
TIMEOUT = 40.0
LIFETIME = 600


# --- methods, nested classes, staticmethod, classmethod, closure -----------


class Outer:
    class Inner:
        def method(self):
            return Outer.Inner.static_method()

        @staticmethod
        def static_method():
            return Outer.class_method()

    @classmethod
    def class_method(cls):
        return make_closure()()


def make_closure():
    captured = []

    def inner():
        captured.append(park())

    return inner


def run_methods():
    Outer.Inner().method()


# --- non-ASCII names of every string kind ---------------------------------


def café():
    return 関数()


def 関数():
    return 𠀀𠀁()


def 𠀀𠀁():
    return módulo.ñandú(latin_next)


def latin_next():
    return módulo_名前.呼び出し(bmp_next)


def bmp_next():
    return módulo_𠀀.𠀂𠀃(park)


def run_unicode():
    café()


# --- generators -------------------------------------------------------------


def gen_body():
    yield 1
    park()
    yield 2


def run_gen_iter():
    for _ in gen_body():
        pass


def gen_send():
    received = yield "ready"
    park()
    yield received


def run_gen_send():
    g = gen_send()
    next(g)
    g.send(42)


def yf_inner():
    yield 1
    park()


def yf_middle():
    yield from yf_inner()


def yf_outer():
    yield from yf_middle()


def run_yield_from():
    for _ in yf_outer():
        pass


# --- coroutines ---------------------------------------------------------------


async def async_leaf():
    park()


async def async_middle():
    await async_leaf()


async def async_main():
    await async_middle()


def run_asyncio():
    asyncio.run(async_main())


# --- lambda and comprehensions -------------------------------------------------


def run_lambda():
    f = lambda: park()  # noqa: E731
    f()


def run_listcomp():
    return [park() for _ in [1]]


def run_genexpr():
    return sum(park() for _ in [1])


def run_dictcomp():
    return {k: park() for k in [1]}


def run_setcomp():
    return {park() for _ in [1]}


# --- deep recursion -------------------------------------------------------------


RECURSION_DEPTH = 300


def recurse(n):
    if n == 0:
        park()
    else:
        recurse(n - 1)


def run_recursion():
    recurse(RECURSION_DEPTH)


# --- class instantiation ------------------------------------------------------------
# A warmed-up class call is specialized (3.13+: CALL_ALLOC_AND_ENTER_INIT), which runs
# __init__ under the interpreter's own clean-up shim frame; a class with its own __new__
# runs __new__ and __init__ from C, under entry frames in the middle of the chain. The
# interpreter's own view (f_back) shows none of them, and neither may a dump.

SPECIALIZE_CALLS = 64


class Plain:
    pass


class WithInit:
    def __init__(self, now):
        if now:
            park()


class WithNew:
    def __new__(cls, now):
        if now:
            park()
        return super().__new__(cls)


class WithBoth:
    def __new__(cls, now):
        return super().__new__(cls)

    def __init__(self, now):
        if now:
            park()


class Derived(WithInit):
    pass


def run_class_init():
    for i in range(SPECIALIZE_CALLS + 1):
        Plain()
        WithInit(i == SPECIALIZE_CALLS)


def run_class_new():
    for i in range(SPECIALIZE_CALLS + 1):
        WithNew(i == SPECIALIZE_CALLS)


def run_class_both():
    for i in range(SPECIALIZE_CALLS + 1):
        WithBoth(i == SPECIALIZE_CALLS)


def run_class_inherited_init():
    for i in range(SPECIALIZE_CALLS + 1):
        Derived(i == SPECIALIZE_CALLS)


WORKERS = [
    ("methods", run_methods),
    ("unicode", run_unicode),
    ("gen-iter", run_gen_iter),
    ("gen-send", run_gen_send),
    ("yield-from", run_yield_from),
    ("asyncio", run_asyncio),
    ("lambda", run_lambda),
    ("listcomp", run_listcomp),
    ("genexpr", run_genexpr),
    ("dictcomp", run_dictcomp),
    ("setcomp", run_setcomp),
    ("recursion", run_recursion),
    ("class-init", run_class_init),
    ("class-new", run_class_new),
    ("class-both", run_class_both),
    ("class-inherited-init", run_class_inherited_init),
]


# --- sub-interpreters -------------------------------------------------------------


# Interpreter objects that must stay alive (3.12 and 3.14+ destroy an
# interpreter when the object that owns it dies).
_INTERPRETER_OBJECTS = {}


def _interp_api():
    """(create() -> id, run(id, code)) for this version's sub-interpreter API.

    run() must make the blocking C call itself, on the line right after
    parking.watch_caller_next_line(), so that its frame is the innermost
    frame of the runner thread in the main interpreter."""
    minor = sys.version_info[1]
    objs = _INTERPRETER_OBJECTS
    if minor == 12:
        import _xxsubinterpreters as api

        def create():
            # The interpreter is destroyed when its InterpreterID object dies.
            obj = api.create()
            objs[int(obj)] = obj
            return int(obj)

        def run(iid, code):
            obj = objs[iid]
            parking.watch_caller_next_line()
            api.run_string(obj, code)

        return create, run
    if minor == 13:
        import _interpreters as api

        def create():
            return int(api.create())

        def run(iid, code):
            parking.watch_caller_next_line()
            err = api.exec(iid, code)
            parking.fail("sub-interpreter %d returned: %r" % (iid, err))

        return create, run
    # 3.14+: concurrent.interpreters creates the interpreter (and owns it:
    # keep the object alive); Interpreter.exec() is a Python wrapper, so call
    # the C function it wraps directly.
    import _interpreters
    from concurrent import interpreters

    def create():
        interp = interpreters.create()
        objs[interp.id] = interp
        return int(interp.id)

    def run(iid, code):
        parking.watch_caller_next_line()
        err = _interpreters.exec(iid, code, restrict=True)
        parking.fail("sub-interpreter %d returned: %r" % (iid, err))

    return create, run


def run_subinterpreter(out_dir, ids, index):
    try:
        create, run = _interp_api()
        iid = create()
        ids[index] = iid
        code = (
            "import sys\n"
            "sys.dont_write_bytecode = True\n"
            "sys.path.insert(0, %r)\n"
            "import subinterp_target\n"
            "subinterp_target.main(%r, %d)\n" % (TARGETS_DIR, out_dir, iid)
        )
    except BaseException as e:  # noqa: BLE001
        parking.fail("creating sub-interpreter %d failed: %r" % (index, e))
    try:
        run(iid, code)
    except BaseException as e:  # noqa: BLE001
        parking.fail("sub-interpreter %d failed: %r" % (index, e))
    parking.fail("sub-interpreter %d returned" % index)


# --- checks and reporting -----------------------------------------------------------


def check_string_kinds():
    def kind(s):
        m = max(map(ord, s))
        return 1 if m < 0x100 else 2 if m < 0x10000 else 4

    checks = [
        ("co_name of café", café.__code__.co_name, 1),
        ("co_name of 関数", 関数.__code__.co_name, 2),
        ("co_name of 𠀀𠀁", 𠀀𠀁.__code__.co_name, 4),
        ("co_name of ñandú", módulo.ñandú.__code__.co_name, 1),
        ("co_filename of módulo", módulo.ñandú.__code__.co_filename, 1),
        ("co_filename of módulo_名前", módulo_名前.呼び出し.__code__.co_filename, 2),
        ("co_filename of módulo_𠀀", módulo_𠀀.𠀂𠀃.__code__.co_filename, 4),
    ]
    for what, s, want in checks:
        if kind(s) != want or s.isascii():
            parking.fail("%s = %r: kind %d, want non-ASCII kind %d" % (what, s, kind(s), want))


def check_against_current_frames(interp0, exclude):
    """Only valid without sub-interpreters (see parking.py)."""
    frames = sys._current_frames()
    idents = {str(i) for i in frames} - {str(i) for i in exclude}
    if idents != set(interp0["threads"]):
        parking.fail(
            "sys._current_frames() threads %r != parked %r" % (sorted(idents), sorted(interp0["threads"]))
        )
    for ident, frame in frames.items():
        if str(ident) in interp0["threads"]:
            got = parking.stack_of(frame)
            if got != interp0["threads"][str(ident)]:
                parking.fail(
                    "thread %d: sys._current_frames() gives %r, recorded frame gives %r"
                    % (ident, got, interp0["threads"][str(ident)])
                )


def report(out_dir, n_parked, sub_ids):
    try:
        if sub_ids is not None:
            deadline = time.monotonic() + TIMEOUT
            while True:
                missing = [
                    i
                    for i, iid in enumerate(sub_ids)
                    if iid is None or not os.path.exists(os.path.join(out_dir, "sub-%d.json" % iid))
                ]
                if not missing:
                    break
                if time.monotonic() > deadline:
                    parking.fail("sub-interpreters %r never reported (ids %r)" % (missing, sub_ids))
                time.sleep(0.01)
        parking.wait_until_settled(n_parked, TIMEOUT, "main interpreter")
        me = threading.get_ident()
        interp0 = parking.snapshot([me])
        if sub_ids is None:
            check_against_current_frames(interp0, [me])
        result = {
            "pid": os.getpid(),
            "version": list(sys.version_info[:3]),
            "version_string": parking.version_string(),
            "interpreters": {"0": interp0},
        }
        if sub_ids is not None:
            for iid in sub_ids:
                with open(os.path.join(out_dir, "sub-%d.json" % iid), encoding="utf-8") as f:
                    sub = json.load(f)
                if sub.get("id") != iid:
                    parking.fail("sub-%d.json reports id %r" % (iid, sub.get("id")))
                del sub["id"]
                result["interpreters"][str(iid)] = sub
        parking.write_json_atomic(os.path.join(out_dir, "expected.json"), result)
    except BaseException as e:  # noqa: BLE001
        import traceback

        traceback.print_exc()
        parking.fail("reporter failed: %r" % (e,))
    parking.park_unwatched()


def main():
    # Safety net if the test harness dies without killing us: SIGALRM's
    # default action terminates the process (no extra thread needed).
    signal.alarm(LIFETIME)
    args = sys.argv[1:]
    subinterp = "--subinterp" in args
    args = [a for a in args if a != "--subinterp"]
    if len(args) != 1:
        parking.fail("usage: stacks.py OUT_DIR [--subinterp]")
    out_dir = os.path.abspath(args[0])
    if subinterp and sys.version_info < (3, 12):
        parking.fail("--subinterp needs Python 3.12+ (this is %s)" % sys.version.split()[0])
    if len(set(WORKERS)) < 6:
        parking.fail("too few threads")
    check_string_kinds()
    if sys.getrecursionlimit() < RECURSION_DEPTH + 100:
        sys.setrecursionlimit(RECURSION_DEPTH + 100)

    for name, fn in WORKERS:
        threading.Thread(target=fn, name=name, daemon=True).start()
    sub_ids = None
    n_parked = len(WORKERS) + 1  # + the main thread
    if subinterp:
        sub_ids = [None] * SUBINTERPRETERS
        for i in range(SUBINTERPRETERS):
            threading.Thread(
                target=run_subinterpreter, args=(out_dir, sub_ids, i), name="runner-%d" % i, daemon=True
            ).start()
        n_parked += SUBINTERPRETERS
    threading.Thread(target=report, args=(out_dir, n_parked, sub_ids), name="reporter", daemon=True).start()
    park()


if __name__ == "__main__":
    main()
