//! Built-in layout tables: whole layouts for 3.11 and 3.12 (which have no `_Py_DebugOffsets`),
//! and for 3.13+ the few facts the debug offsets leave out.
//!
//! How these numbers were derived (so they can be checked): `tools/offsets/derive.sh 3.X`
//! compiles a C program with `offsetof`/`sizeof` against that version's own internal headers
//! (`-DPy_BUILD_CORE`, x86_64, default GIL build) and prints each value under the name used
//! in the comments below; `tools/offsets/derived-3.X.txt` holds its output. 3.11 was derived
//! from pyenv's 3.11.7 headers and checked against Debian's 3.11.2 (same layout); 3.12 from
//! pyenv's 3.12.1. Internal layouts do not change within a minor release.

use super::layout::{
    BytesLayout, CodeLayout, CurrentFrame, FrameLayout, GilLayout, InterpLayout, Layout, Liveness,
    ThreadLayout, UnicodeLayout, Version,
};

/// Facts the 3.13+ debug offsets do not carry.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Extras {
    /// `sizeof(PyCompactUnicodeObject) - sizeof(PyASCIIObject)` (`utf8_length`, `utf8`).
    pub compact_extra: u64,
    /// Bit positions in `PyASCIIObject.state` of `kind` (3 bits), `compact` and `ascii`.
    pub kind_shift: u32,
    pub compact_bit: u32,
    pub ascii_bit: u32,
    /// `owner` values of shim frames: `FRAME_OWNED_BY_CSTACK` (3.12+) and
    /// `FRAME_OWNED_BY_INTERPRETER` (3.14+).
    pub shim_owners: &'static [u8],
    /// Tag bits of `_PyStackRef` to clear from `f_executable` (3.14+: `Py_TAG_BITS`).
    pub code_tag_mask: u64,
    /// 3.13: the frame's `int stacktop` follows `instr_ptr` (-1 while the frame runs). 3.14+
    /// have `_PyStackRef *stackpointer` there, set to NULL only in debug builds (liveness is
    /// then told by the cleared code object, see `Liveness::ClearedCode`).
    pub stacktop_after_instr: bool,
    /// Generator frame states (`gi_frame_state`, `enum _framestate`): `FRAME_CLEARED`, and the
    /// states of a generator suspended in `yield from` / `await` (3.15 adds a locked one).
    pub gen_cleared: i8,
    pub gen_yield_from: &'static [i8],
    /// The states of a generator that finished (`FRAME_STATE_FINISHED`).
    pub gen_finished: &'static [i8],
    /// How far below a suspended frame's `stackpointer` the object it awaits lies (slots:
    /// `_PyFrame_StackPeek` in `_PyGen_yf`).
    pub awaited_depth: u64,
}

/// Extras for 3.13+ (`None` for versions not known).
pub fn extras(minor: u32) -> Option<Extras> {
    match minor {
        // unicode.state.kind_mask = 0x1c, compact 0x20, ascii 0x40;
        // unicode.compact_sizeof - unicode.ascii_sizeof = 56 - 40; FRAME_OWNED_BY_CSTACK = 3.
        13 => Some(Extras {
            compact_extra: 16,
            kind_shift: 2,
            compact_bit: 5,
            ascii_bit: 6,
            shim_owners: &[3],
            code_tag_mask: 0,
            stacktop_after_instr: true,
            gen_cleared: 4,
            gen_yield_from: &[-1],
            gen_finished: &[1, 4],
            awaited_depth: 1,
        }),
        // Same unicode layout; FRAME_OWNED_BY_INTERPRETER = 3, FRAME_OWNED_BY_CSTACK = 4;
        // f_executable is a _PyStackRef whose low bits are tags (Py_TAG_BITS is 1 or 3
        // depending on the build; clearing 3 is always right for an aligned object).
        14 => Some(Extras {
            compact_extra: 16,
            kind_shift: 2,
            compact_bit: 5,
            ascii_bit: 6,
            shim_owners: &[3, 4],
            code_tag_mask: 3,
            stacktop_after_instr: false,
            // FRAME_SUSPENDED_YIELD_FROM = -1, FRAME_CLEARED = 4; `stackpointer[-1]`.
            gen_cleared: 4,
            gen_yield_from: &[-1],
            gen_finished: &[1, 4],
            awaited_depth: 1,
        }),
        // 3.15 has no FRAME_OWNED_BY_CSTACK: entry frames are FRAME_OWNED_BY_INTERPRETER = 3.
        15 => Some(Extras {
            compact_extra: 16,
            kind_shift: 2,
            compact_bit: 5,
            ascii_bit: 6,
            shim_owners: &[3],
            code_tag_mask: 3,
            stacktop_after_instr: false,
            // FRAME_SUSPENDED_YIELD_FROM = 2, FRAME_SUSPENDED_YIELD_FROM_LOCKED = 3,
            // FRAME_CLEARED = 5; `stackpointer[-2]`.
            gen_cleared: 5,
            gen_yield_from: &[2, 3],
            gen_finished: &[5],
            awaited_depth: 2,
        }),
        _ => None,
    }
}

/// The whole layout of 3.11 (no debug offsets).
pub fn layout_311(version: Version) -> Layout {
    Layout {
        version,
        runtime_interpreters_head: 40, // runtime.interpreters_head
        // runtime.gil_locked, runtime.gil_last_holder (`_PyRuntime.ceval.gil`)
        gil: GilLayout::Runtime {
            locked: 376,
            holder: 368,
        },
        interp: InterpLayout {
            next: 0,          // interp.next
            id: 48,           // interp.id
            threads_head: 16, // interp.threads_head
            code_object_generation: None,
            modules: 888,       // interp.imports_modules
            gc_collecting: 848, // interp.gc_collecting
            gc_frame: None,
        },
        tstate: ThreadLayout {
            size: 360,             // through root_cframe
            next: 8,               // tstate.next
            interp: 16,            // tstate.interp
            thread_id: 152,        // tstate.thread_id
            native_thread_id: 160, // tstate.native_thread_id
            // tstate.cframe, cframe.current_frame
            current_frame: CurrentFrame::ViaCFrame {
                cframe: 56,
                current_frame: 8,
                previous: 16, // cframe.previous
                root: 336,    // tstate.root_cframe
            },
            datastack_chunk: Some(296), // tstate.datastack_chunk
            frame_marker: None,
            holds_gil: None,
            gil_requested: None,
            base_frame: None,
        },
        frame: FrameLayout {
            size: 72,     // frame.localsplus
            code: 32,     // frame.code (f_code)
            previous: 48, // frame.previous
            instr: 56,    // frame.instr (prev_instr)
            owner: 69,    // frame.owner (char)
            code_tag_mask: 0,
            is_entry: Some(68), // frame.is_entry (bool)
            shim_owners: &[],   // 3.11 has no shim frames (entry frames carry is_entry)
            localsplus: 72,     // frame.localsplus
            // frame.stacktop (int): -1 while the eval loop runs the frame
            // (SET_LOCALS_FROM_FRAME in Python/ceval.c), as on 3.12 and 3.13.
            liveness: Liveness::RunningStacktop(64),
        },
        code: CodeLayout {
            size: 172,
            name: 120,            // code.co_name
            qualname: 128,        // code.co_qualname
            filename: 112,        // code.co_filename
            firstlineno: 72,      // code.co_firstlineno
            linetable: 136,       // code.co_linetable
            code_adaptive: 184,   // code.co_code_adaptive
            first_traceable: 168, // code._co_firsttraceable
            stacksize: 68,        // code.co_stacksize
            nlocalsplus: 76,      // code.co_nlocalsplus
            localsplusnames: 96,  // code.co_localsplusnames
            localspluskinds: 104, // code.co_localspluskinds
        },
        unicode: UnicodeLayout {
            length: 16,
            state: 32,
            ascii_size: 48,   // unicode.ascii_sizeof (3.11 still has wstr)
            compact_size: 72, // unicode.compact_sizeof
            data_any: 72,     // unicode.data_any
            kind_shift: 2,    // unicode.state.kind_mask = 0x1c
            compact_bit: 5,   // 0x20
            ascii_bit: 6,     // 0x40
        },
        bytes: BytesLayout {
            ob_size: 16,
            ob_sval: 32,
        },
        tuple_items: 24,
        task_objects: None,
    }
}

/// The whole layout of 3.12 (no debug offsets).
pub fn layout_312(version: Version) -> Layout {
    Layout {
        version,
        runtime_interpreters_head: 40, // runtime.interpreters_head
        // interp.ceval_gil (pointer), gil.locked, gil.last_holder
        gil: GilLayout::InterpPointer {
            ptr: 384,
            locked: 16,
            holder: 8,
        },
        interp: InterpLayout {
            next: 0,          // interp.next
            id: 8,            // interp.id
            threads_head: 72, // interp.threads_head
            code_object_generation: None,
            modules: 944,       // interp.imports_modules
            gc_collecting: 312, // interp.gc_collecting
            gc_frame: None,
        },
        tstate: ThreadLayout {
            size: 288,             // through root_cframe
            next: 8,               // tstate.next
            interp: 16,            // tstate.interp
            thread_id: 136,        // tstate.thread_id
            native_thread_id: 144, // tstate.native_thread_id
            // tstate.cframe, cframe.current_frame
            current_frame: CurrentFrame::ViaCFrame {
                cframe: 56,
                current_frame: 0,
                previous: 8, // cframe.previous
                root: 272,   // tstate.root_cframe
            },
            datastack_chunk: Some(232), // tstate.datastack_chunk
            frame_marker: None,
            holds_gil: None,
            gil_requested: None,
            base_frame: None,
        },
        frame: FrameLayout {
            size: 72,    // frame.localsplus
            code: 0,     // frame.code (f_code)
            previous: 8, // frame.previous
            instr: 56,   // frame.instr (prev_instr)
            owner: 70,   // frame.owner (char)
            code_tag_mask: 0,
            shim_owners: &[3], // FRAME_OWNED_BY_CSTACK
            is_entry: None,
            localsplus: 72,                          // frame.localsplus
            liveness: Liveness::RunningStacktop(64), // frame.stacktop (int)
        },
        code: CodeLayout {
            size: 180,
            name: 120,            // code.co_name
            qualname: 128,        // code.co_qualname
            filename: 112,        // code.co_filename
            firstlineno: 68,      // code.co_firstlineno
            linetable: 136,       // code.co_linetable
            code_adaptive: 192,   // code.co_code_adaptive
            first_traceable: 176, // code._co_firsttraceable
            stacksize: 64,        // code.co_stacksize
            nlocalsplus: 72,      // code.co_nlocalsplus
            localsplusnames: 96,  // code.co_localsplusnames
            localspluskinds: 104, // code.co_localspluskinds
        },
        unicode: UnicodeLayout {
            length: 16,
            state: 32,
            ascii_size: 40,   // unicode.ascii_sizeof
            compact_size: 56, // unicode.compact_sizeof
            data_any: 56,     // unicode.data_any
            kind_shift: 2,    // unicode.state.kind_mask = 0x1c
            compact_bit: 5,   // 0x20
            ascii_bit: 6,     // 0x40
        },
        bytes: BytesLayout {
            ob_size: 16,
            ob_sval: 32,
        },
        tuple_items: 24,
        task_objects: None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every read span must cover the fields read from it.
    fn check_spans(l: &Layout) {
        let t = &l.tstate;
        for f in [t.next, t.interp, t.thread_id, t.native_thread_id]
            .into_iter()
            .chain(t.datastack_chunk)
        {
            assert!(f + 8 <= t.size, "{:?}", l.version);
        }
        let fr = &l.frame;
        for f in [fr.code, fr.previous, fr.instr] {
            assert!(f + 8 <= fr.size);
        }
        assert!(fr.owner < fr.size);
        let c = &l.code;
        for f in [c.name, c.qualname, c.filename, c.linetable] {
            assert!(f + 8 <= c.size);
        }
        assert!(c.firstlineno + 4 <= c.size);
        assert!(l.unicode.compact_size > l.unicode.ascii_size);
    }

    #[test]
    fn legacy_tables_are_consistent() {
        check_spans(&layout_311(Version::from_hex(0x030b02f0)));
        check_spans(&layout_312(Version::from_hex(0x030c01f0)));
    }
}
