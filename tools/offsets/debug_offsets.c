/*
 * CPython 3.13+: layout of _Py_DebugOffsets, the table CPython keeps at
 * offset 0 of _PyRuntime for out-of-process debuggers/profilers.
 *
 * Prints
 *   dbg.sizeof            = sizeof(_Py_DebugOffsets)
 *   dbg.<sub>.<field>     = offsetof(_Py_DebugOffsets, <sub>.<field>)
 * i.e. WHERE inside the table each entry is stored.  Every member of the
 * struct is listed, written out by hand from each version's header;
 * derive.sh checks that the list tiles the whole struct (all members are
 * 8 bytes), so a member added by a later header cannot be missed silently.
 *
 * 3.14+: the initializer is the standalone macro _Py_DebugOffsets_INIT
 * (internal/pycore_debug_offsets.h), made only of offsetof/sizeof/constants,
 * so it is evaluated here too and each entry's VALUE is printed as
 *   dbgval.<sub>.<field>  = what the real _PyRuntime.debug_offsets holds
 * (3.13 embeds it in _PyRuntimeState_INIT, which needs libpython symbols;
 * read_runtime.py reads those values from the built binary instead.)
 */
#include "Python.h"

#if PY_VERSION_HEX < 0x030D0000
#  error "_Py_DebugOffsets exists from 3.13"
#endif
#ifdef Py_GIL_DISABLED
#  error "free-threaded headers: this tool derives the default (GIL) build"
#endif

#include "pycore_runtime.h"
#include "pycore_interp.h"
#include "pycore_frame.h"
#include "pycore_code.h"
#include "pycore_tstate.h"
#if PY_VERSION_HEX >= 0x030E0000
#  include "pycore_genobject.h"
#  include "pycore_llist.h"
#  include "pycore_debug_offsets.h"
#  define HAVE_INIT_MACRO 1
#endif

#include <stddef.h>
#include <stdio.h>
#include <stdint.h>
#include <string.h>

#ifdef HAVE_INIT_MACRO
static const _Py_DebugOffsets V = _Py_DebugOffsets_INIT(_Py_Debug_Cookie);
#  define D(path)                                                           \
    do {                                                                    \
        printf("dbg." #path " = %zu\n",                                     \
               (size_t)offsetof(_Py_DebugOffsets, path));                   \
        printf("dbgval." #path " = %llu\n", (unsigned long long)V.path);    \
    } while (0)
#else
#  define D(path)                                                           \
    printf("dbg." #path " = %zu\n", (size_t)offsetof(_Py_DebugOffsets, path))
#endif

int
main(void)
{
    printf("dbg.sizeof = %zu\n", sizeof(_Py_DebugOffsets));
    printf("dbg.cookie = %zu\n", (size_t)offsetof(_Py_DebugOffsets, cookie));
#ifdef HAVE_INIT_MACRO
    printf("dbgval.cookie = %.8s\n", V.cookie);
    printf("dbg.version = %zu\n", (size_t)offsetof(_Py_DebugOffsets, version));
    printf("dbgval.version = 0x%llx\n", (unsigned long long)V.version);
#else
    printf("dbg.version = %zu\n", (size_t)offsetof(_Py_DebugOffsets, version));
#endif
    D(free_threaded);

    D(runtime_state.size);
    D(runtime_state.finalizing);
    D(runtime_state.interpreters_head);

    D(interpreter_state.size);
    D(interpreter_state.id);
    D(interpreter_state.next);
    D(interpreter_state.threads_head);
#if PY_VERSION_HEX >= 0x030E0000
    D(interpreter_state.threads_main);
#endif
    D(interpreter_state.gc);
    D(interpreter_state.imports_modules);
    D(interpreter_state.sysdict);
    D(interpreter_state.builtins);
    D(interpreter_state.ceval_gil);
    D(interpreter_state.gil_runtime_state);
    D(interpreter_state.gil_runtime_state_enabled);
    D(interpreter_state.gil_runtime_state_locked);
    D(interpreter_state.gil_runtime_state_holder);
#if PY_VERSION_HEX >= 0x030E0000
    D(interpreter_state.code_object_generation);
    D(interpreter_state.tlbc_generation);
#endif

    D(thread_state.size);
    D(thread_state.prev);
    D(thread_state.next);
    D(thread_state.interp);
    D(thread_state.current_frame);
#if PY_VERSION_HEX >= 0x030F0000
    D(thread_state.base_frame);
    D(thread_state.last_profiled_frame);
    D(thread_state.last_profiled_frame_seq);
#endif
    D(thread_state.thread_id);
    D(thread_state.native_thread_id);
    D(thread_state.datastack_chunk);
    D(thread_state.status);
#if PY_VERSION_HEX >= 0x030F0000
    D(thread_state.holds_gil);
    D(thread_state.gil_requested);
    D(thread_state.current_exception);
    D(thread_state.exc_state);

    D(err_stackitem.exc_value);
#endif

    D(interpreter_frame.size);
    D(interpreter_frame.previous);
    D(interpreter_frame.executable);
    D(interpreter_frame.instr_ptr);
    D(interpreter_frame.localsplus);
    D(interpreter_frame.owner);
#if PY_VERSION_HEX >= 0x030E0000
    D(interpreter_frame.stackpointer);
    D(interpreter_frame.tlbc_index);
#endif

    D(code_object.size);
    D(code_object.filename);
    D(code_object.name);
    D(code_object.qualname);
    D(code_object.linetable);
    D(code_object.firstlineno);
    D(code_object.argcount);
    D(code_object.localsplusnames);
    D(code_object.localspluskinds);
    D(code_object.co_code_adaptive);
#if PY_VERSION_HEX >= 0x030E0000
    D(code_object.co_tlbc);
#endif

    D(pyobject.size);
    D(pyobject.ob_type);

    D(type_object.size);
    D(type_object.tp_name);
    D(type_object.tp_repr);
    D(type_object.tp_flags);
#if PY_VERSION_HEX >= 0x030F0000
    D(type_object.tp_basicsize);
    D(type_object.tp_dictoffset);

    D(heap_type_object.size);
    D(heap_type_object.ht_cached_keys);
#endif

    D(tuple_object.size);
    D(tuple_object.ob_item);
    D(tuple_object.ob_size);

    D(list_object.size);
    D(list_object.ob_item);
    D(list_object.ob_size);

#if PY_VERSION_HEX >= 0x030E0000
    D(set_object.size);
    D(set_object.used);
    D(set_object.table);
    D(set_object.mask);
#endif

    D(dict_object.size);
    D(dict_object.ma_keys);
    D(dict_object.ma_values);

    D(float_object.size);
    D(float_object.ob_fval);

    D(long_object.size);
    D(long_object.lv_tag);
    D(long_object.ob_digit);

    D(bytes_object.size);
    D(bytes_object.ob_size);
    D(bytes_object.ob_sval);

    D(unicode_object.size);
    D(unicode_object.state);
    D(unicode_object.length);
    D(unicode_object.asciiobject_size);
#if PY_VERSION_HEX >= 0x030F0000
    D(unicode_object.compactunicodeobject_size);
#endif

    D(gc.size);
    D(gc.collecting);
#if PY_VERSION_HEX >= 0x030F0000
    D(gc.frame);
    D(gc.generation_stats_size);
    D(gc.generation_stats);
#endif

#if PY_VERSION_HEX >= 0x030E0000
    D(gen_object.size);
    D(gen_object.gi_name);
    D(gen_object.gi_iframe);
    D(gen_object.gi_frame_state);

    D(llist_node.next);
    D(llist_node.prev);

    D(debugger_support.eval_breaker);
    D(debugger_support.remote_debugger_support);
    D(debugger_support.remote_debugging_enabled);
    D(debugger_support.debugger_pending_call);
    D(debugger_support.debugger_script_path);
    D(debugger_support.debugger_script_path_size);
#endif
    return 0;
}
