/*
 * Prints the struct offsets/sizes pyfleet needs, computed by the C compiler
 * from one CPython version's own (internal) headers.  Build with
 * tools/offsets/derive.sh; output is "name = value" lines.
 *
 * Only offsetof()/sizeof() and bit tricks on zeroed local structs are used:
 * nothing from libpython is linked or called.
 */
#include "Python.h"

#if PY_VERSION_HEX < 0x030B0000
#  error "only CPython 3.11+ is handled"
#endif
#ifdef Py_GIL_DISABLED
#  error "free-threaded headers: this tool derives the default (GIL) build"
#endif
#ifdef Py_DEBUG
#  error "Py_DEBUG headers: this tool derives the release build"
#endif
#ifdef Py_TRACE_REFS
#  error "Py_TRACE_REFS changes PyObject_HEAD; not the default build"
#endif

#include "pycore_runtime.h"
#include "pycore_interp.h"
#include "pycore_frame.h"
#include "pycore_code.h"
#include "pycore_dict.h"
#include "pycore_moduleobject.h"
#if PY_VERSION_HEX >= 0x030D0000
#  include "pycore_tstate.h"
#endif
#if PY_VERSION_HEX >= 0x030E0000
#  include "pycore_stackref.h"
#endif

#include <stddef.h>
#include <stdio.h>
#include <string.h>

#define OFF(name, type, member) \
    printf("%s = %zu\n", name, (size_t)offsetof(type, member))
#define SZ(name, type) printf("%s = %zu\n", name, sizeof(type))
#define FSZ(name, type, member) \
    printf("%s = %zu\n", name, sizeof(((type *)0)->member))

/* Bitfield members of PyASCIIObject.state: set one member to all ones in a
 * zeroed object and read back the raw state word (little endian host). */
static void
print_state_bit(const char *field, const PyASCIIObject *o)
{
    unsigned char raw[sizeof(o->state)];
    unsigned long long word = 0;
    memcpy(raw, &o->state, sizeof(raw));
    for (size_t i = 0; i < sizeof(raw) && i < sizeof(word); i++) {
        word |= (unsigned long long)raw[i] << (8 * i);
    }
    int shift = word ? __builtin_ctzll(word) : -1;
    int width = __builtin_popcountll(word);
    printf("unicode.state.%s_mask = 0x%llx\n", field, word);
    printf("unicode.state.%s_shift = %d\n", field, shift);
    printf("unicode.state.%s_width = %d\n", field, width);
}

#define STATE_BIT(field)                         \
    do {                                         \
        PyASCIIObject o;                         \
        memset(&o, 0, sizeof(o));                \
        o.state.field = ~0u;                     \
        print_state_bit(#field, &o);             \
    } while (0)

int
main(void)
{
    printf("PY_VERSION_HEX = 0x%lx\n", (unsigned long)PY_VERSION_HEX);
    printf("PY_VERSION = %s\n", PY_VERSION);

    /* ---- _PyRuntimeState ---- */
    SZ("runtime.sizeof", _PyRuntimeState);
    OFF("runtime.interpreters_head", _PyRuntimeState, interpreters.head);
#if PY_VERSION_HEX < 0x030C0000
    /* 3.11: one GIL, embedded in the runtime (ceval.gil). */
    OFF("runtime.gil_locked", _PyRuntimeState, ceval.gil.locked);
    OFF("runtime.gil_last_holder", _PyRuntimeState, ceval.gil.last_holder);
#endif

    /* ---- PyInterpreterState ---- */
    OFF("interp.next", PyInterpreterState, next);
    OFF("interp.id", PyInterpreterState, id);
    OFF("interp.threads_head", PyInterpreterState, threads.head);
    /* The collector's state: whether a collection runs (and, 3.15+, the frame that started
     * it). */
    OFF("interp.gc_collecting", PyInterpreterState, gc.collecting);
#if PY_VERSION_HEX >= 0x030F0000
    OFF("interp.gc_frame", PyInterpreterState, gc.frame);
#endif
    SZ("interp.sizeof", PyInterpreterState);
#if PY_VERSION_HEX >= 0x030C0000
    /* ceval.gil is a pointer (struct _gil_runtime_state *); _gil is the
     * interpreter's own embedded GIL struct. */
    OFF("interp.ceval_gil_ptr", PyInterpreterState, ceval.gil);
    OFF("interp._gil", PyInterpreterState, _gil);
#endif
#ifdef PYFLEET_HAVE_CODE_OBJECT_GENERATION
    OFF("interp.code_object_generation", PyInterpreterState,
        _code_object_generation);
#endif

    /* ---- struct _gil_runtime_state (offsets inside the GIL struct) ---- */
    OFF("gil.last_holder", struct _gil_runtime_state, last_holder);
    FSZ("gil.last_holder_sizeof", struct _gil_runtime_state, last_holder);
    OFF("gil.locked", struct _gil_runtime_state, locked);
    FSZ("gil.locked_sizeof", struct _gil_runtime_state, locked);
    SZ("gil.sizeof", struct _gil_runtime_state);

    /* ---- PyThreadState ---- */
    OFF("tstate.prev", PyThreadState, prev);
    OFF("tstate.next", PyThreadState, next);
    OFF("tstate.interp", PyThreadState, interp);
    OFF("tstate.thread_id", PyThreadState, thread_id);
    OFF("tstate.native_thread_id", PyThreadState, native_thread_id);
    OFF("tstate.datastack_chunk", PyThreadState, datastack_chunk);
    OFF("tstate.datastack_top", PyThreadState, datastack_top);
    OFF("tstate.datastack_limit", PyThreadState, datastack_limit);
    SZ("tstate.sizeof", PyThreadState);
#if PY_VERSION_HEX < 0x030D0000
    OFF("tstate.cframe", PyThreadState, cframe);
    OFF("tstate.root_cframe", PyThreadState, root_cframe);
    OFF("cframe.current_frame", _PyCFrame, current_frame);
    OFF("cframe.previous", _PyCFrame, previous);
    SZ("cframe.sizeof", _PyCFrame);
#else
    OFF("tstate.current_frame", PyThreadState, current_frame);
    SZ("tstate_impl.sizeof", _PyThreadStateImpl);
#endif
#ifdef PYFLEET_HAVE_TSTATE_BASE_FRAME
    /* 3.15: pointer to the sentinel frame embedded in _PyThreadStateImpl */
    OFF("tstate.base_frame", PyThreadState, base_frame);
#endif
#ifdef PYFLEET_HAVE_TSTATE_IMPL_BASE_FRAME
    OFF("tstate_impl.base_frame", _PyThreadStateImpl, base_frame);
#endif
#ifdef PYFLEET_HAVE_TSTATE_HOLDS_GIL
    OFF("tstate.holds_gil", PyThreadState, holds_gil);
    FSZ("tstate.holds_gil_sizeof", PyThreadState, holds_gil);
#endif
#ifdef PYFLEET_HAVE_TSTATE_GIL_REQUESTED
    OFF("tstate.gil_requested", PyThreadState, gil_requested);
#endif
#ifdef PYFLEET_HAVE_LAST_PROFILED_FRAME
    OFF("tstate.last_profiled_frame", PyThreadState, last_profiled_frame);
#endif
#ifdef PYFLEET_HAVE_LAST_PROFILED_FRAME_SEQ
    OFF("tstate.last_profiled_frame_seq", PyThreadState,
        last_profiled_frame_seq);
#endif

    /* ---- _PyStackChunk ---- */
    OFF("chunk.previous", _PyStackChunk, previous);
    OFF("chunk.size", _PyStackChunk, size);
    OFF("chunk.top", _PyStackChunk, top);
    OFF("chunk.data", _PyStackChunk, data);

    /* ---- _PyInterpreterFrame ---- */
#if PY_VERSION_HEX < 0x030D0000
    OFF("frame.code", _PyInterpreterFrame, f_code);
    FSZ("frame.code_sizeof", _PyInterpreterFrame, f_code);
    OFF("frame.instr", _PyInterpreterFrame, prev_instr);
#else
    OFF("frame.code", _PyInterpreterFrame, f_executable);
    FSZ("frame.code_sizeof", _PyInterpreterFrame, f_executable);
    OFF("frame.instr", _PyInterpreterFrame, instr_ptr);
#endif
    OFF("frame.previous", _PyInterpreterFrame, previous);
    OFF("frame.owner", _PyInterpreterFrame, owner);
    FSZ("frame.owner_sizeof", _PyInterpreterFrame, owner);
#if PY_VERSION_HEX < 0x030E0000
    /* int: number of slots from localsplus to top of stack */
    OFF("frame.stacktop", _PyInterpreterFrame, stacktop);
    FSZ("frame.stacktop_sizeof", _PyInterpreterFrame, stacktop);
#else
    /* _PyStackRef *: pointer to top of stack */
    OFF("frame.stackpointer", _PyInterpreterFrame, stackpointer);
    FSZ("frame.stackpointer_sizeof", _PyInterpreterFrame, stackpointer);
#endif
#if PY_VERSION_HEX < 0x030C0000
    OFF("frame.is_entry", _PyInterpreterFrame, is_entry);
#endif
#if PY_VERSION_HEX >= 0x030C0000
    OFF("frame.return_offset", _PyInterpreterFrame, return_offset);
#endif
#if PY_VERSION_HEX >= 0x030E0000
    OFF("frame.visited", _PyInterpreterFrame, visited);
#endif
    OFF("frame.localsplus", _PyInterpreterFrame, localsplus);
    SZ("frame.sizeof", _PyInterpreterFrame);
    printf("frame.FRAME_OWNED_BY_THREAD = %d\n", (int)FRAME_OWNED_BY_THREAD);
    printf("frame.FRAME_OWNED_BY_GENERATOR = %d\n",
           (int)FRAME_OWNED_BY_GENERATOR);
    printf("frame.FRAME_OWNED_BY_FRAME_OBJECT = %d\n",
           (int)FRAME_OWNED_BY_FRAME_OBJECT);
#ifdef PYFLEET_HAVE_FRAME_OWNED_BY_CSTACK
    printf("frame.FRAME_OWNED_BY_CSTACK = %d\n", (int)FRAME_OWNED_BY_CSTACK);
#endif
#ifdef PYFLEET_HAVE_FRAME_OWNED_BY_INTERPRETER
    printf("frame.FRAME_OWNED_BY_INTERPRETER = %d\n",
           (int)FRAME_OWNED_BY_INTERPRETER);
#endif
#if PY_VERSION_HEX >= 0x030E0000
    /* _PyStackRef: low bits of .bits are tags; mask them off to get the
     * PyObject * (default build). */
    SZ("stackref.sizeof", _PyStackRef);
    printf("stackref.Py_TAG_BITS = 0x%llx\n", (unsigned long long)Py_TAG_BITS);
#  ifdef Py_TAG_REFCNT
    printf("stackref.Py_TAG_REFCNT = 0x%llx\n",
           (unsigned long long)Py_TAG_REFCNT);
#  endif
#  ifdef Py_INT_TAG
    printf("stackref.Py_INT_TAG = 0x%llx\n", (unsigned long long)Py_INT_TAG);
#  endif
#  ifdef Py_TAG_INVALID
    printf("stackref.Py_TAG_INVALID = 0x%llx\n",
           (unsigned long long)Py_TAG_INVALID);
#  endif
#  ifdef Py_TAGGED_SHIFT
    printf("stackref.Py_TAGGED_SHIFT = %d\n", (int)Py_TAGGED_SHIFT);
#  endif
#endif

    /* ---- PyCodeObject ---- */
    OFF("code.ob_type", PyObject, ob_type);
    /* PyVarObject: Py_SIZE(code) = number of _Py_CODEUNITs of bytecode */
    OFF("code.ob_size", PyCodeObject, ob_base.ob_size);
    OFF("code.co_name", PyCodeObject, co_name);
    OFF("code.co_qualname", PyCodeObject, co_qualname);
    OFF("code.co_filename", PyCodeObject, co_filename);
    OFF("code.co_firstlineno", PyCodeObject, co_firstlineno);
    OFF("code.co_linetable", PyCodeObject, co_linetable);
    OFF("code.co_code_adaptive", PyCodeObject, co_code_adaptive);
    SZ("code.sizeof", PyCodeObject);
    OFF("code.co_flags", PyCodeObject, co_flags);
    OFF("code.co_argcount", PyCodeObject, co_argcount);
    OFF("code.co_nlocalsplus", PyCodeObject, co_nlocalsplus);
#if PY_VERSION_HEX >= 0x030C0000
    OFF("code.co_framesize", PyCodeObject, co_framesize);
#endif
    OFF("code.co_stacksize", PyCodeObject, co_stacksize);
    OFF("code.co_localsplusnames", PyCodeObject, co_localsplusnames);
    OFF("code.co_localspluskinds", PyCodeObject, co_localspluskinds);
    SZ("code.codeunit_sizeof", _Py_CODEUNIT);

    /* ---- PyTupleObject (3.14 put a cached hash before the items) ---- */
    OFF("tuple.ob_item", PyTupleObject, ob_item);

    /* ---- PyBytesObject ---- */
    OFF("bytes.ob_size", PyBytesObject, ob_base.ob_size);
    OFF("bytes.ob_sval", PyBytesObject, ob_sval);

    /* ---- str (PEP 393) ---- */
    OFF("unicode.length", PyASCIIObject, length);
    OFF("unicode.state", PyASCIIObject, state);
    FSZ("unicode.state_sizeof", PyASCIIObject, state);
    SZ("unicode.ascii_sizeof", PyASCIIObject);
    SZ("unicode.compact_sizeof", PyCompactUnicodeObject);
    OFF("unicode.data_any", PyUnicodeObject, data);
    SZ("unicode.sizeof", PyUnicodeObject);
    STATE_BIT(interned);
    STATE_BIT(kind);
    STATE_BIT(compact);
    STATE_BIT(ascii);
#if PY_VERSION_HEX < 0x030C0000
    STATE_BIT(ready);
#else
    STATE_BIT(statically_allocated);
#endif

    /* ---- PyTypeObject (sanity) ---- */
    OFF("type.tp_name", PyTypeObject, tp_name);
    SZ("object.sizeof", PyObject);

    /* ---- the threading module's names (src/cpython/threading_names.rs) ---- */
#if PY_VERSION_HEX >= 0x030C0000
    OFF("interp.imports_modules", PyInterpreterState, imports.modules);
#else
    OFF("interp.imports_modules", PyInterpreterState, modules);
#endif
    OFF("type.tp_basicsize", PyTypeObject, tp_basicsize);
    OFF("type.tp_flags", PyTypeObject, tp_flags);
    OFF("heap_type.ht_cached_keys", PyHeapTypeObject, ht_cached_keys);
    OFF("module.md_dict", PyModuleObject, md_dict);
    OFF("dict.ma_keys", PyDictObject, ma_keys);
    OFF("dict.ma_values", PyDictObject, ma_values);
    OFF("dict_keys.dk_log2_size", PyDictKeysObject, dk_log2_size);
    OFF("dict_keys.dk_log2_index_bytes", PyDictKeysObject, dk_log2_index_bytes);
    OFF("dict_keys.dk_kind", PyDictKeysObject, dk_kind);
    OFF("dict_keys.dk_nentries", PyDictKeysObject, dk_nentries);
    OFF("dict_keys.dk_indices", PyDictKeysObject, dk_indices);
    SZ("dict_keys.entry_sizeof", PyDictKeyEntry);
    SZ("dict_keys.unicode_entry_sizeof", PyDictUnicodeEntry);
    OFF("dict_values.values", PyDictValues, values);
#if PY_VERSION_HEX >= 0x030D0000
    OFF("dict_values.valid", PyDictValues, valid);
    printf("tpflags.inline_values = %lu\n", (unsigned long)Py_TPFLAGS_INLINE_VALUES);
#endif
    printf("tpflags.managed_dict = %lu\n", (unsigned long)Py_TPFLAGS_MANAGED_DICT);
#if PY_VERSION_HEX >= 0x030C0000
    OFF("long.lv_tag", PyLongObject, long_value.lv_tag);
    OFF("long.ob_digit", PyLongObject, long_value.ob_digit);
#else
    OFF("long.ob_size", PyLongObject, ob_base.ob_size);
    OFF("long.ob_digit", PyLongObject, ob_digit);
#endif
    printf("long.shift = %d\n", PyLong_SHIFT);
    return 0;
}
