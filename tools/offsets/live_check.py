#!/usr/bin/env python3
"""Check a derived-3.X.txt table against a *running* interpreter of that
version by reading the interpreter's own memory with ctypes (the same reads
pyfleet does remotely, done in-process).

    python3.X tools/offsets/live_check.py tools/offsets/derived-3.X.txt

Walks _PyRuntime -> interpreters.head -> threads.head -> this thread's
PyThreadState -> current frame -> code object -> name/filename strings, and
checks GIL state, the data-stack chunk, bytes and str layouts against values
known from Python.  Prints one line per check; exit status 1 on any failure.
"""
import ctypes
import sys
import threading

PTR = ctypes.sizeof(ctypes.c_void_p)


def load(path):
    d = {}
    with open(path) as f:
        for line in f:
            line = line.strip()
            if " = " in line and not line.startswith("#"):
                k, v = line.split(" = ", 1)
                d[k] = v
    return d


O = load(sys.argv[1])


def o(name):
    return int(O[name], 0)


def u64(addr):
    return ctypes.c_uint64.from_address(addr).value


def i64(addr):
    return ctypes.c_int64.from_address(addr).value


def u32(addr):
    return ctypes.c_uint32.from_address(addr).value


def i32(addr):
    return ctypes.c_int32.from_address(addr).value


def u8(addr):
    return ctypes.c_uint8.from_address(addr).value


def ptr(addr):
    return u64(addr)


FAIL = 0


def check(what, got, want):
    global FAIL
    ok = got == want
    if not ok:
        FAIL += 1
    print("%-4s %s: got %r want %r" % ("ok" if ok else "FAIL", what, got, want))


def read_str(addr):
    """Decode a str object from memory with the unicode.* offsets."""
    length = i64(addr + o("unicode.length"))
    state = u32(addr + o("unicode.state"))
    kind = (state & o("unicode.state.kind_mask")) >> o("unicode.state.kind_shift")
    compact = state & o("unicode.state.compact_mask")
    ascii_ = state & o("unicode.state.ascii_mask")
    if compact and ascii_:
        data = addr + o("unicode.ascii_sizeof")
    elif compact:
        data = addr + o("unicode.compact_sizeof")
    else:
        data = ptr(addr + o("unicode.data_any"))
    raw = ctypes.string_at(data, length * kind)
    return raw.decode({1: "latin-1", 2: "utf-16-le", 4: "utf-32-le"}[kind])


def frame_code(faddr):
    c = ptr(faddr + o("frame.code"))
    if "stackref.Py_TAG_BITS" in O:
        c &= ~o("stackref.Py_TAG_BITS")
    return c


def sample(arg_marker):
    local_marker = object()            # noqa: F841 (read through memory)
    me = sys._getframe()
    code = me.f_code

    rt = ctypes.addressof(ctypes.c_char.in_dll(ctypes.pythonapi, "_PyRuntime"))
    if "dbg.cookie" in O:
        check("_PyRuntime.debug_offsets.cookie", ctypes.string_at(rt, 8),
              b"xdebugpy")
        check("debug_offsets.version", u64(rt + o("dbg.version")),
              sys.hexversion)
    interp = ptr(rt + o("runtime.interpreters_head"))
    check("interp != NULL", interp != 0, True)
    # the main interpreter is last in the list; with one interpreter head==main
    check("interp.id (main)", i64(interp + o("interp.id")), 0)
    check("interp.next", ptr(interp + o("interp.next")), 0)

    ts = ptr(interp + o("interp.threads_head"))
    mine = None
    prev = 0
    n = 0
    while ts and n < 1000:
        check("tstate.interp", ptr(ts + o("tstate.interp")), interp)
        check("tstate.prev", ptr(ts + o("tstate.prev")), prev)
        if u64(ts + o("tstate.thread_id")) == threading.get_ident():
            mine = ts
        prev, ts, n = ts, ptr(ts + o("tstate.next")), n + 1
    check("found this thread's tstate by thread_id", mine is not None, True)
    ts = mine
    check("tstate.native_thread_id",
          u64(ts + o("tstate.native_thread_id")), threading.get_native_id())

    # GIL: we are running Python code, so we hold it.
    if "runtime.gil_locked" in O:
        locked = i32(rt + o("runtime.gil_locked"))
        holder = ptr(rt + o("runtime.gil_last_holder"))
    else:
        gil = ptr(interp + o("interp.ceval_gil_ptr"))
        check("interp.ceval.gil -> interp._gil (main interp, own GIL)",
              gil, interp + o("interp._gil"))
        locked = i32(gil + o("gil.locked"))
        holder = ptr(gil + o("gil.last_holder"))
    check("gil.locked", locked, 1)
    check("gil.last_holder == this tstate", holder, ts)

    # current frame
    # Read the current-frame pointer inline (no Python-level helper call), so
    # that the frame it names is this function's frame.
    rd = ctypes.c_uint64.from_address
    if "tstate.cframe" in O:
        f = rd(rd(ts + o("tstate.cframe")).value
               + o("cframe.current_frame")).value
    else:
        f = rd(ts + o("tstate.current_frame")).value
    # 3.12+: skip C-stack shim frames
    shims = [o(k) for k in ("frame.FRAME_OWNED_BY_CSTACK",
                            "frame.FRAME_OWNED_BY_INTERPRETER") if k in O]
    while f and u8(f + o("frame.owner")) in shims:
        f = ptr(f + o("frame.previous"))
    check("frame.code == this function's code", frame_code(f), id(code))
    check("frame.owner", u8(f + o("frame.owner")),
          o("frame.FRAME_OWNED_BY_THREAD"))
    if "frame.is_entry" in O:
        check("frame.is_entry (called from Python)", u8(f + o("frame.is_entry")), 0)
    lp = f + o("frame.localsplus")
    slot0 = ptr(lp)
    slot1 = ptr(lp + PTR)
    if "stackref.Py_TAG_BITS" in O:
        slot0 &= ~o("stackref.Py_TAG_BITS")
        slot1 &= ~o("stackref.Py_TAG_BITS")
    check("frame.localsplus[0] == arg", slot0, id(arg_marker))
    check("frame.localsplus[1] == local", slot1, id(local_marker))
    instr = ptr(f + o("frame.instr"))
    start = id(code) + o("code.co_code_adaptive")
    check("frame.instr inside co_code_adaptive",
          start <= instr < start + len(code.co_code) + 2, True)
    caller = ptr(f + o("frame.previous"))
    check("frame.previous.code == caller's code", frame_code(caller),
          id(me.f_back.f_code))

    if "tstate.holds_gil" in O:
        check("tstate.holds_gil", i32(ts + o("tstate.holds_gil")), 1)
    # walk to the bottom of this thread's frame chain
    chain = []
    g = f
    while g and len(chain) < 10000:
        chain.append(g)
        g = ptr(g + o("frame.previous"))
    bottom = chain[-1]
    if "tstate.base_frame" in O:
        check("tstate.base_frame == tstate + tstate_impl.base_frame",
              ptr(ts + o("tstate.base_frame")), ts + o("tstate_impl.base_frame"))
        check("bottom of frame chain is the base_frame", bottom,
              ts + o("tstate_impl.base_frame"))
        check("base_frame.owner", u8(bottom + o("frame.owner")),
              o("frame.FRAME_OWNED_BY_INTERPRETER"))
    if "tstate.last_profiled_frame" in O:
        print("info tstate.last_profiled_frame = 0x%x, seq = %d (0 unless a "
              "profiler asked for it)" % (ptr(ts + o("tstate.last_profiled_frame")),
                                          u64(ts + o("tstate.last_profiled_frame_seq"))))
    owners = [u8(x + o("frame.owner")) for x in chain]
    print("info frame chain owners (top->bottom): %s" % owners)
    if "interp.code_object_generation" in O:
        print("info interp._code_object_generation = %d"
              % u64(interp + o("interp.code_object_generation")))

    # data stack: the frame lives in the current chunk
    chunk = ptr(ts + o("tstate.datastack_chunk"))
    top = ptr(ts + o("tstate.datastack_top"))
    limit = ptr(ts + o("tstate.datastack_limit"))
    size = u64(chunk + o("chunk.size"))
    check("datastack_limit == chunk + size", limit, chunk + size)
    check("chunk.data <= frame < datastack_top",
          chunk + o("chunk.data") <= f < top, True)
    check("chunk.previous readable", isinstance(ptr(chunk + o("chunk.previous")), int), True)

    # code object
    c = id(code)
    check("code.ob_type", ptr(c + o("code.ob_type")), id(type(code)))
    check("type.tp_name", ctypes.string_at(ptr(id(type(code)) + o("type.tp_name"))), b"code")
    check("code.ob_size == code units", i64(c + o("code.ob_size")),
          len(code.co_code) // o("code.codeunit_sizeof"))
    check("code.co_name", ptr(c + o("code.co_name")), id(code.co_name))
    check("code.co_qualname", ptr(c + o("code.co_qualname")), id(code.co_qualname))
    check("code.co_filename", ptr(c + o("code.co_filename")), id(code.co_filename))
    check("code.co_linetable", ptr(c + o("code.co_linetable")), id(code.co_linetable))
    check("code.co_firstlineno", i32(c + o("code.co_firstlineno")), code.co_firstlineno)
    check("code.co_flags", i32(c + o("code.co_flags")), code.co_flags)
    check("code.co_argcount", i32(c + o("code.co_argcount")), code.co_argcount)
    check("code.co_stacksize", i32(c + o("code.co_stacksize")), code.co_stacksize)
    nlp = len(code.co_varnames) + len(code.co_cellvars) + len(code.co_freevars)
    check("code.co_nlocalsplus", i32(c + o("code.co_nlocalsplus")), nlp)
    if "code.co_framesize" in O:
        check("code.co_framesize", i32(c + o("code.co_framesize")),
              nlp + code.co_stacksize + o("frame.localsplus") // PTR)
    # PyCode_Type.tp_basicsize is offsetof(co_code_adaptive) rounded to the
    # code unit (the struct's trailing co_code_adaptive[1] is the var part)
    check("code.co_code_adaptive == type(code).__basicsize__",
          o("code.co_code_adaptive"), type(code).__basicsize__)
    # adjacent snapshots; only the few instructions run between the two reads
    # may have been re-specialized in between
    mem = ctypes.string_at(c + o("code.co_code_adaptive"), len(code.co_code))
    ref = code._co_code_adaptive
    differ = sum(mem[i:i + 2] != ref[i:i + 2] for i in range(0, len(ref), 2))
    check("co_code_adaptive memory ~= _co_code_adaptive (units differing <= 4)",
          differ <= 4, True)
    check("read_str(co_name)", read_str(ptr(c + o("code.co_name"))), "sample")
    check("read_str(co_filename)", read_str(ptr(c + o("code.co_filename"))),
          code.co_filename)

    # bytes
    b = b"pyfleet\x00bytes"
    check("bytes.ob_size", i64(id(b) + o("bytes.ob_size")), len(b))
    check("bytes.ob_sval", ctypes.string_at(id(b) + o("bytes.ob_sval"), len(b)), b)
    check("bytes.ob_sval == __basicsize__ - 1", o("bytes.ob_sval"),
          bytes.__basicsize__ - 1)

    # str: one of each kind, plus an interned one
    check("unicode.sizeof == str.__basicsize__", o("unicode.sizeof"),
          str.__basicsize__)
    for s in ("ascii text", "caf\xe9 latin1", "\u0416\u0416 ucs2",
              "\U0001F600 ucs4"):
        s = s + str(len(s))           # make a fresh, non-constant object
        check("str %r" % s, read_str(id(s)), s)
    s = sys.intern("pyfleet_interned_" + str(id(b)))
    st = u32(id(s) + o("unicode.state"))
    check("interned bits set", (st & o("unicode.state.interned_mask")) != 0, True)
    s2 = "".join(["pyfleet", "_not_interned"])
    st = u32(id(s2) + o("unicode.state"))
    check("interned bits clear", st & o("unicode.state.interned_mask"), 0)
    check("compact+ascii", ((st & o("unicode.state.compact_mask")) != 0,
                            (st & o("unicode.state.ascii_mask")) != 0),
          (True, True))


def caller():
    sample(object())


print("# live check of %s on %s" % (sys.argv[1], sys.version.split()[0]))
check("PY_VERSION_HEX", o("PY_VERSION_HEX"), sys.hexversion)
caller()
print("# %d failures" % FAIL)
sys.exit(1 if FAIL else 0)
