#!/usr/bin/env python3
"""Read the _Py_DebugOffsets table that a built CPython (3.13+) carries at
offset 0 of its statically initialised `_PyRuntime`, straight from the ELF
file (libpython3.X.so, a static python3.X executable, or libpython3.X.a /
one of its .o members), and decode it with the field offsets printed by
derive.sh.

    read_runtime.py DERIVED.txt ELF-OR-AR-FILE

DERIVED.txt is the output of `derive.sh 3.X` (its `dbg.*` lines give where
each field sits in the table).  Prints `dbgval.<sub>.<field> = <value>` for
every field, then compares each value with the matching offsetof()/sizeof()
that offsets.c computed, where there is one.  Exit status 1 on a mismatch.

Only the standard library is used; the ELF/ar parsing below is minimal and
handles 64-bit little-endian files only.
"""
import struct
import sys


def parse_derived(path):
    vals = {}
    with open(path) as f:
        for line in f:
            line = line.strip()
            if not line or line.startswith("#") or " = " not in line:
                continue
            k, v = line.split(" = ", 1)
            vals[k] = v
    return vals


def add_synthetic(d):
    """Derived sums the debug table stores pre-added."""
    if "interp._gil" in d:
        g = int(d["interp._gil"])
        d["interp._gil+gil.locked"] = str(g + int(d["gil.locked"]))
        d["interp._gil+gil.last_holder"] = str(g + int(d["gil.last_holder"]))
    return d


def elf_symbol_bytes(blob, name, size):
    """Return `size` bytes of the initialiser of symbol `name`, or None."""
    if blob[:4] != b"\x7fELF" or blob[4] != 2 or blob[5] != 1:
        return None
    e_type = struct.unpack_from("<H", blob, 16)[0]
    e_shoff = struct.unpack_from("<Q", blob, 0x28)[0]
    e_shentsize, e_shnum, e_shstrndx = struct.unpack_from("<HHH", blob, 0x3A)
    secs = []
    for i in range(e_shnum):
        off = e_shoff + i * e_shentsize
        (sh_name, sh_type, sh_flags, sh_addr, sh_offset, sh_size,
         sh_link, sh_info, sh_addralign, sh_entsize) = struct.unpack_from(
            "<IIQQQQIIQQ", blob, off)
        secs.append(dict(name=sh_name, type=sh_type, addr=sh_addr,
                         offset=sh_offset, size=sh_size, link=sh_link,
                         entsize=sh_entsize))
    for sec in secs:
        if sec["type"] not in (2, 11):       # SHT_SYMTAB, SHT_DYNSYM
            continue
        strtab = secs[sec["link"]]
        for j in range(sec["size"] // 24):
            st = sec["offset"] + j * 24
            st_name, st_info, st_other, st_shndx, st_value, st_size = \
                struct.unpack_from("<IBBHQQ", blob, st)
            s = strtab["offset"] + st_name
            end = blob.index(b"\0", s)
            if blob[s:end] != name.encode():
                continue
            if st_shndx == 0 or st_shndx >= len(secs):
                continue                     # undefined / special
            tgt = secs[st_shndx]
            if tgt["type"] == 8:             # SHT_NOBITS: no initialiser
                return None
            if e_type == 1:                  # ET_REL: value is section offset
                fo = tgt["offset"] + st_value
            else:
                fo = tgt["offset"] + (st_value - tgt["addr"])
            return blob[fo:fo + size]
    return None


def elf_section_size(blob, want):
    """Size of the section named `want` (e.g. ".PyRuntime"), or None."""
    if blob[:4] != b"\x7fELF" or blob[4] != 2 or blob[5] != 1:
        return None
    e_shoff = struct.unpack_from("<Q", blob, 0x28)[0]
    e_shentsize, e_shnum, e_shstrndx = struct.unpack_from("<HHH", blob, 0x3A)
    def sh(i):
        return struct.unpack_from("<IIQQQQIIQQ", blob, e_shoff + i * e_shentsize)
    stroff = sh(e_shstrndx)[4]
    for i in range(e_shnum):
        name_off, _, _, _, _, size = sh(i)[:6]
        s = stroff + name_off
        if blob[s:blob.index(b"\0", s)] == want.encode():
            return size
    return None


def ar_members(blob):
    pos = 8
    names = b""
    while pos + 60 <= len(blob):
        hdr = blob[pos:pos + 60]
        name = hdr[:16].decode().strip()
        size = int(hdr[48:58].decode().strip())
        data = blob[pos + 60:pos + 60 + size]
        if name == "//":
            names = data
        elif name.startswith("/") and name[1:].isdigit():
            o = int(name[1:])
            name = names[o:names.index(b"/\n", o)].decode()
        name = name.rstrip("/") or name
        yield name, data
        pos += 60 + size + (size & 1)


def find_runtime(path, size):
    """(debug table bytes, .PyRuntime section size, ar member name)"""
    with open(path, "rb") as f:
        blob = f.read()
    if blob.startswith(b"!<arch>\n"):
        for mname, data in ar_members(blob):
            got = elf_symbol_bytes(data, "_PyRuntime", size)
            if got is not None:
                return got, elf_section_size(data, ".PyRuntime"), mname
        return None, None, None
    return (elf_symbol_bytes(blob, "_PyRuntime", size),
            elf_section_size(blob, ".PyRuntime"), None)


# dbg table field -> the derive.sh name that must hold the same number
CROSS = {
    "runtime_state.size": "runtime.sizeof",
    "runtime_state.interpreters_head": "runtime.interpreters_head",
    "interpreter_state.size": "interp.sizeof",
    "interpreter_state.id": "interp.id",
    "interpreter_state.next": "interp.next",
    "interpreter_state.threads_head": "interp.threads_head",
    "interpreter_state.ceval_gil": "interp.ceval_gil_ptr",
    "interpreter_state.gil_runtime_state": "interp._gil",
    "interpreter_state.code_object_generation":
        "interp.code_object_generation",
    # 3.13 stores sizeof(PyThreadState), 3.14+ sizeof(_PyThreadStateImpl)
    "thread_state.size": ("tstate.sizeof", "tstate_impl.sizeof"),
    "interpreter_state.gil_runtime_state_locked": "interp._gil+gil.locked",
    "interpreter_state.gil_runtime_state_holder":
        "interp._gil+gil.last_holder",
    "thread_state.prev": "tstate.prev",
    "thread_state.next": "tstate.next",
    "thread_state.interp": "tstate.interp",
    "thread_state.current_frame": "tstate.current_frame",
    "thread_state.base_frame": "tstate.base_frame",
    "thread_state.last_profiled_frame": "tstate.last_profiled_frame",
    "thread_state.last_profiled_frame_seq": "tstate.last_profiled_frame_seq",
    "thread_state.holds_gil": "tstate.holds_gil",
    "thread_state.gil_requested": "tstate.gil_requested",
    "thread_state.thread_id": "tstate.thread_id",
    "thread_state.native_thread_id": "tstate.native_thread_id",
    "thread_state.datastack_chunk": "tstate.datastack_chunk",
    "interpreter_frame.size": "frame.sizeof",
    "interpreter_frame.previous": "frame.previous",
    "interpreter_frame.executable": "frame.code",
    "interpreter_frame.instr_ptr": "frame.instr",
    "interpreter_frame.localsplus": "frame.localsplus",
    "interpreter_frame.owner": "frame.owner",
    "interpreter_frame.stackpointer": "frame.stackpointer",
    "code_object.size": "code.sizeof",
    "code_object.filename": "code.co_filename",
    "code_object.name": "code.co_name",
    "code_object.qualname": "code.co_qualname",
    "code_object.linetable": "code.co_linetable",
    "code_object.firstlineno": "code.co_firstlineno",
    "code_object.argcount": "code.co_argcount",
    "code_object.localsplusnames": "code.co_localsplusnames",
    "code_object.localspluskinds": "code.co_localspluskinds",
    "code_object.co_code_adaptive": "code.co_code_adaptive",
    "pyobject.ob_type": "code.ob_type",
    "pyobject.size": "object.sizeof",
    "type_object.tp_name": "type.tp_name",
    "bytes_object.ob_size": "bytes.ob_size",
    "bytes_object.ob_sval": "bytes.ob_sval",
    "unicode_object.size": "unicode.sizeof",
    "unicode_object.state": "unicode.state",
    "unicode_object.length": "unicode.length",
    "unicode_object.asciiobject_size": "unicode.ascii_sizeof",
    "unicode_object.compactunicodeobject_size": "unicode.compact_sizeof",
}


def main():
    if len(sys.argv) != 3:
        sys.exit(__doc__)
    derived = add_synthetic(parse_derived(sys.argv[1]))
    # 3.11/3.12 have no debug table: only the section-size check applies
    size = int(derived.get("dbg.sizeof", 8))
    raw, secsize, member = find_runtime(sys.argv[2], size)
    if raw is None or len(raw) != size:
        sys.exit("no initialised _PyRuntime found in %s" % sys.argv[2])
    bad = 0
    # _PyRuntime is alone in its ".PyRuntime" section, so the section size
    # is sizeof(_PyRuntimeState) as compiled into that binary.
    if secsize is None:
        print("# no .PyRuntime section")
    elif secsize == int(derived["runtime.sizeof"]):
        print("# .PyRuntime section size = %d   # == runtime.sizeof" % secsize)
    else:
        print("# .PyRuntime section size = %d   # MISMATCH runtime.sizeof = %s"
              % (secsize, derived["runtime.sizeof"]))
        bad += 1
    if "dbg.sizeof" not in derived:
        print("# %d mismatches" % bad)
        sys.exit(1 if bad else 0)
    print("# _PyRuntime.debug_offsets read from %s%s"
          % (sys.argv[2], " (member %s)" % member if member else ""))
    for key, off in derived.items():
        if not key.startswith("dbg.") or key == "dbg.sizeof":
            continue
        field = key[4:]
        off = int(off)
        if field == "cookie":
            print("dbgval.cookie = %r" % raw[off:off + 8].decode("latin-1"))
            continue
        v = struct.unpack_from("<Q", raw, off)[0]
        shown = hex(v) if field == "version" else str(v)
        note = ""
        if field == "version" and v != int(derived["PY_VERSION_HEX"], 16):
            note, bad = "   # MISMATCH header PY_VERSION_HEX", bad + 1
        if "dbgval." + field in derived and field not in ("cookie",):
            # 3.14+: value of _Py_DebugOffsets_INIT evaluated from the headers
            if int(derived["dbgval." + field], 0) != v:
                note += "   # MISMATCH dbgval (headers) = %s" % derived["dbgval." + field]
                bad += 1
        refs = CROSS.get(field, ())
        if isinstance(refs, str):
            refs = (refs,)
        refs = [r for r in refs if r in derived]
        same = [r for r in refs if int(derived[r]) == v]
        if same:
            note += "   # == %s" % same[0]
        elif refs:
            note += "   # MISMATCH " + ", ".join(
                "%s = %s" % (r, derived[r]) for r in refs)
            bad += 1
        print("dbgval.%s = %s%s" % (field, shown, note))
    print("# %d mismatches" % bad)
    sys.exit(1 if bad else 0)


if __name__ == "__main__":
    main()
