//! Struct layouts of the CPython versions pyfleet reads: one [`Layout`] per target, built from
//! `_Py_DebugOffsets` (3.13+, see `debug_offsets`) or from the built-in tables of `tables`
//! (3.11, 3.12). The walker only ever uses a `Layout`; it never branches on a version number
//! except through the few semantic switches held here.

/// A CPython version, from `PY_VERSION_HEX`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub struct Version {
    pub major: u32,
    pub minor: u32,
    pub micro: u32,
    /// The full `PY_VERSION_HEX` (release level and serial in the low byte).
    pub hex: u64,
}

impl Version {
    pub fn from_hex(hex: u64) -> Self {
        Version {
            major: ((hex >> 24) & 0xff) as u32,
            minor: ((hex >> 16) & 0xff) as u32,
            micro: ((hex >> 8) & 0xff) as u32,
            hex,
        }
    }
}

impl std::fmt::Display for Version {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}.{}.{}", self.major, self.minor, self.micro)?;
        let level = (self.hex >> 4) & 0xf;
        let serial = self.hex & 0xf;
        match level {
            0xa => write!(f, "a{serial}"),
            0xb => write!(f, "b{serial}"),
            0xc => write!(f, "rc{serial}"),
            _ => Ok(()),
        }
    }
}

/// Where the thread that holds the GIL is recorded.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum GilLayout {
    /// 3.11: one GIL in `_PyRuntime.ceval.gil`; offsets from `_PyRuntime`.
    Runtime { locked: u64, holder: u64 },
    /// 3.12+: `interp->ceval.gil` points at the GIL the interpreter uses (its own or the main
    /// interpreter's); `locked` and `holder` are offsets inside `struct _gil_runtime_state`.
    InterpPointer { ptr: u64, locked: u64, holder: u64 },
}

/// How far past the GIL's `locked` its waiters' futex words lie: `struct _gil_runtime_state`
/// (3.11-3.15, with the GIL) goes on after `locked` with `switch_number`, the condition
/// variable and mutex a thread waiting to take the GIL sleeps on, and the pair a thread that
/// dropped it waits on until another took it (`FORCE_SWITCHING`): 4 + 4 (padding) + 8 + 48 +
/// 40 + 48 + 40 bytes on 64-bit glibc.
pub const GIL_WAIT_SPAN: u64 = 192;

/// How to get a thread's innermost frame.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CurrentFrame {
    /// 3.13+: `tstate->current_frame`.
    Direct(u64),
    /// 3.11, 3.12: `tstate->cframe->current_frame` (`current_frame` and `previous` lie side by
    /// side in a C frame). `root`: where the thread state holds
    /// its own C frame (`root_cframe`), the only one whose current frame is null while it is
    /// `tstate->cframe` (no Python code runs on the thread); an eval loop publishes its C
    /// frame a moment before setting its current frame.
    ViaCFrame {
        cframe: u64,
        current_frame: u64,
        /// `_PyCFrame.previous`: the C frame of the eval loop (or the thread state's own)
        /// that called this one's, through C.
        previous: u64,
        root: u64,
    },
}

impl CurrentFrame {
    /// 3.11/3.12: the part of a C frame the unwinder reads (its current frame and previous
    /// pointers), as (offset, bytes).
    pub fn cframe_span(&self) -> Option<(u64, usize)> {
        match *self {
            CurrentFrame::ViaCFrame {
                current_frame,
                previous,
                ..
            } => {
                let lo = current_frame.min(previous);
                Some((lo, (current_frame.max(previous) + 8 - lo) as usize))
            }
            CurrentFrame::Direct(_) => None,
        }
    }
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct InterpLayout {
    pub next: u64,
    pub id: u64,
    pub threads_head: u64,
    /// 3.14+: bumped whenever code objects may have been freed and reused.
    pub code_object_generation: Option<u64>,
    /// `imports.modules` (3.11: `modules`), `sys.modules`: read only for the threading
    /// module's thread names (`threading_names`), never while sampling.
    pub modules: u64,
    /// `gc.collecting`, an `int` set while the collector runs.
    pub gc_collecting: u64,
    /// 3.15+: `gc.frame`, the frame that started the running collection (NULL when no Python
    /// frame did).
    pub gc_frame: Option<u64>,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ThreadLayout {
    /// Bytes to read to get every field below in one read.
    pub size: u64,
    pub next: u64,
    pub interp: u64,
    pub thread_id: u64,
    pub native_thread_id: u64,
    pub current_frame: CurrentFrame,
    pub datastack_chunk: Option<u64>,
    /// 3.15+: the frame-cache marker (`last_profiled_frame`) and its sequence number.
    pub frame_marker: Option<(u64, u64)>,
    /// 3.15+: `holds_gil`, an `int` set while the thread holds the GIL.
    pub holds_gil: Option<u64>,
    /// 3.15+: `gil_requested`, an `int` set while the thread waits to take the GIL.
    pub gil_requested: Option<u64>,
    /// 3.15+: the thread's base frame, a shim every chain ends at.
    pub base_frame: Option<BaseFrame>,
}

/// 3.15+: where a thread state names its base frame, and where that frame lies: embedded in
/// the thread state itself (`_PyThreadStateImpl.base_frame`, right after the public
/// `PyThreadState`). A live thread state's pointer is its own address plus `embedded`: memory
/// that does not say so is not a thread state.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct BaseFrame {
    /// Offset of the `base_frame` pointer.
    pub pointer: u64,
    /// Offset of the embedded frame (`sizeof(PyThreadState)`, rounded up to 8).
    pub embedded: u64,
}

/// `struct _PyStackChunk` (the same from 3.11 to 3.15): `previous`, `size` (bytes, header
/// included), `top` (slots used, kept for chunks that are not the current one), `data`.
pub const CHUNK_PREVIOUS: u64 = 0;
pub const CHUNK_SIZE: u64 = 8;
pub const CHUNK_TOP: u64 = 16;
pub const CHUNK_DATA: u64 = 24;

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FrameLayout {
    /// Bytes to read to get every field below (up to `localsplus`).
    pub size: u64,
    pub code: u64,
    pub previous: u64,
    pub instr: u64,
    pub owner: u64,
    /// Mask of tag bits to clear from `code` (3.14+: `_PyStackRef`), 0 before.
    pub code_tag_mask: u64,
    /// 3.11: `is_entry` (a bool), set on the first frame an eval loop runs; a thread's
    /// outermost frame is one. Later versions push shim frames instead.
    pub is_entry: Option<u64>,
    /// `owner` values of frames that are not Python functions (C-stack and interpreter
    /// shims); skipped.
    pub shim_owners: &'static [u8],
    /// Offset of `localsplus`: a frame of code object `c` takes this plus
    /// `8 * (c.co_nlocalsplus + c.co_stacksize)` bytes of the data stack, and the frame it
    /// calls starts right after it.
    pub localsplus: u64,
    /// What tells a frame that runs or waits on its callee from one that has returned.
    pub liveness: Liveness,
}

/// How a data-stack frame that is live (running, or waiting on the frame it called) is told
/// from one that returned (its bytes stay until a new frame overwrites them).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Liveness {
    /// 3.11-3.13: `stacktop`, the `int` at this offset, is -1 while the eval loop runs the
    /// frame (3.11: `SET_LOCALS_FROM_FRAME`; 3.12+: `_PyFrame_GetStackPointer`), and at least
    /// 0 while it waits on a Python callee and once it returned (`_PyFrame_SetStackPointer`).
    /// On 3.11 a frame that resumed a generator runs too (the generator is called from C).
    RunningStacktop(u64),
    /// 3.14+: a frame that returned has its `f_executable` cleared, and one being cleared (it
    /// was unlinked first) has `_PyStackRef *stackpointer`, at this offset, at its first
    /// local (`_PyFrame_ClearLocals`), where no live frame with locals has it. Every other
    /// frame of the chunk with a code object is live: running, waiting on its callee or in a
    /// C call; or linked to its caller and not yet the thread's current frame (pushed, its
    /// arguments being bound), a window only a stopped thread shows for long.
    ClearedCode(u64),
}

/// `FRAME_OWNED_BY_GENERATOR`, the same on every supported version: a generator's or
/// coroutine's frame, which lives in the generator object.
pub const OWNED_BY_GENERATOR: u8 = 1;

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CodeLayout {
    /// Bytes to read to get every field below.
    pub size: u64,
    pub name: u64,
    pub qualname: u64,
    pub filename: u64,
    pub firstlineno: u64,
    pub linetable: u64,
    /// Offset of the bytecode (`co_code_adaptive`) from the start of the code object.
    pub code_adaptive: u64,
    /// Offset of `_co_firsttraceable` (an `int`): the index of the first instruction at
    /// which a frame of this code counts as started (see `FrameLayout`'s incomplete frames).
    pub first_traceable: u64,
    /// Offsets of `co_stacksize` and `co_nlocalsplus` (`int`s): with the frame's
    /// `localsplus`, the bytes a frame of this code takes in the data stack.
    pub stacksize: u64,
    pub nlocalsplus: u64,
    /// `co_localsplusnames` (a tuple of str) and `co_localspluskinds` (bytes, one kind per
    /// slot): read by `dump --locals` only, so not within `size`.
    pub localsplusnames: u64,
    pub localspluskinds: u64,
}

/// `PyASCIIObject` / `PyCompactUnicodeObject` / `PyUnicodeObject`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct UnicodeLayout {
    pub length: u64,
    pub state: u64,
    /// `sizeof(PyASCIIObject)`: compact ASCII data follows it.
    pub ascii_size: u64,
    /// `sizeof(PyCompactUnicodeObject)`: compact non-ASCII data follows it.
    pub compact_size: u64,
    /// `PyUnicodeObject.data.any` for legacy (non-compact) strings.
    pub data_any: u64,
    /// Bit positions inside the 32-bit state word.
    pub kind_shift: u32,
    pub compact_bit: u32,
    pub ascii_bit: u32,
}

/// 3.14+: the objects that reading asyncio tasks goes through besides the tasks themselves
/// (`_Py_DebugOffsets` describes them from 3.14 on), with the version's generator states.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TaskObjectsLayout {
    /// `PyObject.ob_type`, `PyTypeObject.tp_flags`.
    pub ob_type: u64,
    pub tp_flags: u64,
    /// Bytes of a generator read to get its state and its frame's fields (up to
    /// `gen_iframe` plus the frame's `size`).
    pub gen_size: u64,
    pub gen_iframe: u64,
    pub gen_frame_state: u64,
    /// `gi_frame_state` values: cleared, and suspended awaiting another object.
    pub gen_cleared: i8,
    pub gen_yield_from: &'static [i8],
    /// `gi_frame_state` values of a generator that finished.
    pub gen_finished: &'static [i8],
    /// A suspended frame's `_PyStackRef *stackpointer`, and how many slots below it the
    /// object it awaits lies.
    pub frame_stackpointer: u64,
    pub awaited_depth: u64,
    /// `PySetObject`: `used`, `mask`, `table` (entries of a key pointer and its hash).
    pub set_size: u64,
    pub set_used: u64,
    pub set_mask: u64,
    pub set_table: u64,
    /// `PyLongObject`: `lv_tag` and the first digit (`ob_digit`, 30-bit digits).
    pub long_lv_tag: u64,
    pub long_digit: u64,
    /// `struct llist_node.next`.
    pub llist_next: u64,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BytesLayout {
    pub ob_size: u64,
    pub ob_sval: u64,
}

/// Everything the walker needs to know about one target's CPython.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Layout {
    pub version: Version,
    /// Offset of `interpreters.head` in `_PyRuntime`.
    pub runtime_interpreters_head: u64,
    pub gil: GilLayout,
    pub interp: InterpLayout,
    pub tstate: ThreadLayout,
    pub frame: FrameLayout,
    pub code: CodeLayout,
    pub unicode: UnicodeLayout,
    pub bytes: BytesLayout,
    /// `PyTupleObject.ob_item` (3.14 put a cached hash before it).
    pub tuple_items: u64,
    /// 3.14+ (`None` before: no asyncio layout is published).
    pub task_objects: Option<TaskObjectsLayout>,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn version_strings() {
        assert_eq!(Version::from_hex(0x030c01f0).to_string(), "3.12.1");
        assert_eq!(Version::from_hex(0x030f00a3).to_string(), "3.15.0a3");
        assert_eq!(Version::from_hex(0x030e00c1).to_string(), "3.14.0rc1");
        assert_eq!(Version::from_hex(0x030b02f0).minor, 11);
    }
}
