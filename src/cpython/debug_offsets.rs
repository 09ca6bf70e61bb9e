//! `_Py_DebugOffsets` (3.13+): the offsets table CPython keeps at the very start of
//! `_PyRuntime` for external debuggers.
//!
//! The struct is made only of 8-byte fields (after the 8-byte cookie), so a field's position
//! is 8 times its index. [`FIELDS_313`], [`FIELDS_314`] and [`FIELDS_315`] are the field
//! names in declaration order, transcribed from each version's header (3.13:
//! `Include/internal/pycore_runtime.h`; 3.14, 3.15: `Include/internal/pycore_debug_offsets.h`)
//! and checked with `offsetof` by `tools/offsets/derive.sh`. The values read from the target
//! are validated (cookie, version, sizes, offsets inside their struct) before use.
//!
//! What the table does not say (unicode bit layout, sizeof(PyCompactUnicodeObject), the shim
//! frame owners, stack-reference tag bits) comes from `tables::extras`.

use super::layout::{
    BaseFrame, BytesLayout, CodeLayout, CurrentFrame, FrameLayout, GilLayout, InterpLayout, Layout,
    Liveness, TaskObjectsLayout, ThreadLayout, UnicodeLayout, Version,
};
use super::tables;
use super::AttachError;
use crate::memory::RemoteMemory;

const COOKIE: &[u8; 8] = b"xdebugpy";
/// Largest size believed for any struct the table describes.
const MAX_STRUCT: u64 = 1 << 22; // PyInterpreterState is ~190 KiB in 3.13
/// Most bytes of one thread state, code object or frame the unwinder reads (the fields it
/// needs lie within the first KiB or two of each in every release): a table that puts them
/// further is refused, since each is read once per thread, code object or frame.
const MAX_READ_SPAN: u64 = 16 << 10;
/// Most bytes of one interpreter state read (its thread list sits ~7 KiB in on 3.13+).
const MAX_INTERP_SPAN: u64 = 256 << 10;

/// 3.13's `_Py_DebugOffsets`, in declaration order ("section.field").
pub const FIELDS_313: &[&str] = &[
    "cookie",
    "version",
    "free_threaded",
    "runtime_state.size",
    "runtime_state.finalizing",
    "runtime_state.interpreters_head",
    "interpreter_state.size",
    "interpreter_state.id",
    "interpreter_state.next",
    "interpreter_state.threads_head",
    "interpreter_state.gc",
    "interpreter_state.imports_modules",
    "interpreter_state.sysdict",
    "interpreter_state.builtins",
    "interpreter_state.ceval_gil",
    "interpreter_state.gil_runtime_state",
    "interpreter_state.gil_runtime_state_enabled",
    "interpreter_state.gil_runtime_state_locked",
    "interpreter_state.gil_runtime_state_holder",
    "thread_state.size",
    "thread_state.prev",
    "thread_state.next",
    "thread_state.interp",
    "thread_state.current_frame",
    "thread_state.thread_id",
    "thread_state.native_thread_id",
    "thread_state.datastack_chunk",
    "thread_state.status",
    "interpreter_frame.size",
    "interpreter_frame.previous",
    "interpreter_frame.executable",
    "interpreter_frame.instr_ptr",
    "interpreter_frame.localsplus",
    "interpreter_frame.owner",
    "code_object.size",
    "code_object.filename",
    "code_object.name",
    "code_object.qualname",
    "code_object.linetable",
    "code_object.firstlineno",
    "code_object.argcount",
    "code_object.localsplusnames",
    "code_object.localspluskinds",
    "code_object.co_code_adaptive",
    "pyobject.size",
    "pyobject.ob_type",
    "type_object.size",
    "type_object.tp_name",
    "type_object.tp_repr",
    "type_object.tp_flags",
    "tuple_object.size",
    "tuple_object.ob_item",
    "tuple_object.ob_size",
    "list_object.size",
    "list_object.ob_item",
    "list_object.ob_size",
    "dict_object.size",
    "dict_object.ma_keys",
    "dict_object.ma_values",
    "float_object.size",
    "float_object.ob_fval",
    "long_object.size",
    "long_object.lv_tag",
    "long_object.ob_digit",
    "bytes_object.size",
    "bytes_object.ob_size",
    "bytes_object.ob_sval",
    "unicode_object.size",
    "unicode_object.state",
    "unicode_object.length",
    "unicode_object.asciiobject_size",
    "gc.size",
    "gc.collecting",
];

/// 3.14's `_Py_DebugOffsets`.
pub const FIELDS_314: &[&str] = &[
    "cookie",
    "version",
    "free_threaded",
    "runtime_state.size",
    "runtime_state.finalizing",
    "runtime_state.interpreters_head",
    "interpreter_state.size",
    "interpreter_state.id",
    "interpreter_state.next",
    "interpreter_state.threads_head",
    "interpreter_state.threads_main",
    "interpreter_state.gc",
    "interpreter_state.imports_modules",
    "interpreter_state.sysdict",
    "interpreter_state.builtins",
    "interpreter_state.ceval_gil",
    "interpreter_state.gil_runtime_state",
    "interpreter_state.gil_runtime_state_enabled",
    "interpreter_state.gil_runtime_state_locked",
    "interpreter_state.gil_runtime_state_holder",
    "interpreter_state.code_object_generation",
    "interpreter_state.tlbc_generation",
    "thread_state.size",
    "thread_state.prev",
    "thread_state.next",
    "thread_state.interp",
    "thread_state.current_frame",
    "thread_state.thread_id",
    "thread_state.native_thread_id",
    "thread_state.datastack_chunk",
    "thread_state.status",
    "interpreter_frame.size",
    "interpreter_frame.previous",
    "interpreter_frame.executable",
    "interpreter_frame.instr_ptr",
    "interpreter_frame.localsplus",
    "interpreter_frame.owner",
    "interpreter_frame.stackpointer",
    "interpreter_frame.tlbc_index",
    "code_object.size",
    "code_object.filename",
    "code_object.name",
    "code_object.qualname",
    "code_object.linetable",
    "code_object.firstlineno",
    "code_object.argcount",
    "code_object.localsplusnames",
    "code_object.localspluskinds",
    "code_object.co_code_adaptive",
    "code_object.co_tlbc",
    "pyobject.size",
    "pyobject.ob_type",
    "type_object.size",
    "type_object.tp_name",
    "type_object.tp_repr",
    "type_object.tp_flags",
    "tuple_object.size",
    "tuple_object.ob_item",
    "tuple_object.ob_size",
    "list_object.size",
    "list_object.ob_item",
    "list_object.ob_size",
    "set_object.size",
    "set_object.used",
    "set_object.table",
    "set_object.mask",
    "dict_object.size",
    "dict_object.ma_keys",
    "dict_object.ma_values",
    "float_object.size",
    "float_object.ob_fval",
    "long_object.size",
    "long_object.lv_tag",
    "long_object.ob_digit",
    "bytes_object.size",
    "bytes_object.ob_size",
    "bytes_object.ob_sval",
    "unicode_object.size",
    "unicode_object.state",
    "unicode_object.length",
    "unicode_object.asciiobject_size",
    "gc.size",
    "gc.collecting",
    "gen_object.size",
    "gen_object.gi_name",
    "gen_object.gi_iframe",
    "gen_object.gi_frame_state",
    "llist_node.next",
    "llist_node.prev",
    "debugger_support.eval_breaker",
    "debugger_support.remote_debugger_support",
    "debugger_support.remote_debugging_enabled",
    "debugger_support.debugger_pending_call",
    "debugger_support.debugger_script_path",
    "debugger_support.debugger_script_path_size",
];

/// 3.15's `_Py_DebugOffsets`.
pub const FIELDS_315: &[&str] = &[
    "cookie",
    "version",
    "free_threaded",
    "runtime_state.size",
    "runtime_state.finalizing",
    "runtime_state.interpreters_head",
    "interpreter_state.size",
    "interpreter_state.id",
    "interpreter_state.next",
    "interpreter_state.threads_head",
    "interpreter_state.threads_main",
    "interpreter_state.gc",
    "interpreter_state.imports_modules",
    "interpreter_state.sysdict",
    "interpreter_state.builtins",
    "interpreter_state.ceval_gil",
    "interpreter_state.gil_runtime_state",
    "interpreter_state.gil_runtime_state_enabled",
    "interpreter_state.gil_runtime_state_locked",
    "interpreter_state.gil_runtime_state_holder",
    "interpreter_state.code_object_generation",
    "interpreter_state.tlbc_generation",
    "thread_state.size",
    "thread_state.prev",
    "thread_state.next",
    "thread_state.interp",
    "thread_state.current_frame",
    "thread_state.base_frame",
    "thread_state.last_profiled_frame",
    "thread_state.last_profiled_frame_seq",
    "thread_state.thread_id",
    "thread_state.native_thread_id",
    "thread_state.datastack_chunk",
    "thread_state.status",
    "thread_state.holds_gil",
    "thread_state.gil_requested",
    "thread_state.current_exception",
    "thread_state.exc_state",
    "err_stackitem.exc_value",
    "interpreter_frame.size",
    "interpreter_frame.previous",
    "interpreter_frame.executable",
    "interpreter_frame.instr_ptr",
    "interpreter_frame.localsplus",
    "interpreter_frame.owner",
    "interpreter_frame.stackpointer",
    "interpreter_frame.tlbc_index",
    "code_object.size",
    "code_object.filename",
    "code_object.name",
    "code_object.qualname",
    "code_object.linetable",
    "code_object.firstlineno",
    "code_object.argcount",
    "code_object.localsplusnames",
    "code_object.localspluskinds",
    "code_object.co_code_adaptive",
    "code_object.co_tlbc",
    "pyobject.size",
    "pyobject.ob_type",
    "type_object.size",
    "type_object.tp_name",
    "type_object.tp_repr",
    "type_object.tp_flags",
    "type_object.tp_basicsize",
    "type_object.tp_dictoffset",
    "heap_type_object.size",
    "heap_type_object.ht_cached_keys",
    "tuple_object.size",
    "tuple_object.ob_item",
    "tuple_object.ob_size",
    "list_object.size",
    "list_object.ob_item",
    "list_object.ob_size",
    "set_object.size",
    "set_object.used",
    "set_object.table",
    "set_object.mask",
    "dict_object.size",
    "dict_object.ma_keys",
    "dict_object.ma_values",
    "float_object.size",
    "float_object.ob_fval",
    "long_object.size",
    "long_object.lv_tag",
    "long_object.ob_digit",
    "bytes_object.size",
    "bytes_object.ob_size",
    "bytes_object.ob_sval",
    "unicode_object.size",
    "unicode_object.state",
    "unicode_object.length",
    "unicode_object.asciiobject_size",
    "unicode_object.compactunicodeobject_size",
    "gc.size",
    "gc.collecting",
    "gc.frame",
    "gc.generation_stats_size",
    "gc.generation_stats",
    "gen_object.size",
    "gen_object.gi_name",
    "gen_object.gi_iframe",
    "gen_object.gi_frame_state",
    "llist_node.next",
    "llist_node.prev",
    "debugger_support.eval_breaker",
    "debugger_support.remote_debugger_support",
    "debugger_support.remote_debugging_enabled",
    "debugger_support.debugger_pending_call",
    "debugger_support.debugger_script_path",
    "debugger_support.debugger_script_path_size",
];

/// The debug offsets as read from a target, addressable by field name.
pub struct DebugOffsets {
    names: &'static [&'static str],
    values: Vec<u64>,
}

impl DebugOffsets {
    /// Parses a copy of the start of `_PyRuntime`.
    pub fn parse(names: &'static [&'static str], raw: &[u8]) -> Result<Self, String> {
        if raw.len() < names.len() * 8 {
            return Err("table truncated".into());
        }
        if raw.get(..8) != Some(COOKIE.as_slice()) {
            return Err("cookie 'xdebugpy' not found at the start of _PyRuntime".into());
        }
        let values = raw
            .chunks_exact(8)
            .take(names.len())
            .map(|c| u64::from_le_bytes([c[0], c[1], c[2], c[3], c[4], c[5], c[6], c[7]]))
            .collect();
        Ok(DebugOffsets { names, values })
    }

    /// The value of a field; an error names a field the version's list lacks.
    pub fn get(&self, name: &str) -> Result<u64, String> {
        self.names
            .iter()
            .position(|n| *n == name)
            .and_then(|i| self.values.get(i).copied())
            .ok_or_else(|| format!("no field {name}"))
    }

    /// The value of an optional field (present in some versions only).
    pub fn opt(&self, name: &str) -> Option<u64> {
        self.get(name).ok()
    }

    /// An offset inside `section`, checked against that section's size.
    pub fn offset(&self, section: &str, field: &str) -> Result<u64, String> {
        let size = self.get(&format!("{section}.size"))?;
        if size == 0 || size > MAX_STRUCT {
            return Err(format!("{section}.size is {size}"));
        }
        let off = self.get(&format!("{section}.{field}"))?;
        if off.checked_add(1).is_none_or(|end| end > size) {
            return Err(format!(
                "{section}.{field} = {off} is outside the struct ({size} bytes)"
            ));
        }
        Ok(off)
    }
}

/// The span to read to cover 8-byte fields at `offsets`.
fn span(offsets: &[u64]) -> u64 {
    offsets.iter().max().copied().unwrap_or(0) + 8
}

/// Builds a [`Layout`] from parsed debug offsets.
pub fn build(d: &DebugOffsets, version: Version) -> Result<Layout, String> {
    let extras = tables::extras(version.minor).ok_or("no built-in extras for this version")?;
    let table_version = Version::from_hex(d.get("version")?);
    if (table_version.major, table_version.minor) != (version.major, version.minor) {
        return Err(format!(
            "the table is for {table_version}, the binary says {version}"
        ));
    }
    let interp = |f| d.offset("interpreter_state", f);
    let ts = |f| d.offset("thread_state", f);
    let fr = |f| d.offset("interpreter_frame", f);
    let co = |f| d.offset("code_object", f);

    let gil_base = interp("gil_runtime_state")?;
    let gil_rel = |f| -> Result<u64, String> {
        interp(f)?
            .checked_sub(gil_base)
            .ok_or_else(|| format!("{f} lies before gil_runtime_state"))
    };
    let gil = GilLayout::InterpPointer {
        ptr: interp("ceval_gil")?,
        locked: gil_rel("gil_runtime_state_locked")?,
        holder: gil_rel("gil_runtime_state_holder")?,
    };
    let frame_marker = match (
        d.opt("thread_state.last_profiled_frame"),
        d.opt("thread_state.last_profiled_frame_seq"),
    ) {
        (Some(_), Some(_)) => Some((ts("last_profiled_frame")?, ts("last_profiled_frame_seq")?)),
        _ => None,
    };
    let holds_gil = match d.opt("thread_state.holds_gil") {
        Some(_) => Some(ts("holds_gil")?),
        None => None,
    };
    let gil_requested = match d.opt("thread_state.gil_requested") {
        Some(_) => Some(ts("gil_requested")?),
        None => None,
    };
    let datastack_chunk = ts("datastack_chunk")?;
    let mut tstate_fields = vec![
        ts("next")?,
        ts("interp")?,
        ts("thread_id")?,
        ts("native_thread_id")?,
        ts("current_frame")?,
        datastack_chunk,
    ];
    tstate_fields.extend(frame_marker.iter().flat_map(|&(m, s)| [m, s]));
    tstate_fields.extend(holds_gil);
    tstate_fields.extend(gil_requested);
    let base_frame = match d.opt("thread_state.base_frame") {
        Some(_) => Some(BaseFrame {
            pointer: ts("base_frame")?,
            embedded: d
                .get("thread_state.size")?
                .checked_next_multiple_of(8)
                .ok_or("thread_state.size overflows")?,
        }),
        None => None,
    };
    tstate_fields.extend(base_frame.map(|b| b.pointer));
    let liveness = match extras.stacktop_after_instr {
        true => Liveness::RunningStacktop(fr("instr_ptr")? + 8),
        false => Liveness::ClearedCode(fr("stackpointer")?),
    };
    let liveness_field = match liveness {
        Liveness::RunningStacktop(o) | Liveness::ClearedCode(o) => o,
    };
    let frame_fields = [
        fr("previous")?,
        fr("executable")?,
        fr("instr_ptr")?,
        fr("owner")?,
        liveness_field,
    ];
    // `co_stacksize` and `co_nlocalsplus` are not in the table: in every version they are the
    // `int`s right before and right after `co_firstlineno` (Include/cpython/code.h).
    let firstlineno = co("firstlineno")?;
    let stacksize = firstlineno
        .checked_sub(4)
        .ok_or("code_object.firstlineno is too small")?;
    let nlocalsplus = firstlineno + 4;
    // `_co_firsttraceable` is not in the table: in every default (GIL) build it is the `int`
    // before `co_extra`, the pointer right before `co_code_adaptive` (Include/cpython/code.h).
    let code_adaptive = co("co_code_adaptive")?;
    let first_traceable = code_adaptive
        .checked_sub(16)
        .ok_or("code_object.co_code_adaptive is too small")?;
    let code_fields = [
        co("name")?,
        co("qualname")?,
        co("filename")?,
        co("linetable")?,
        firstlineno,
        stacksize,
        nlocalsplus,
        first_traceable,
    ];
    let unicode_state = d.offset("unicode_object", "state")?;
    let ascii_size = d.get("unicode_object.asciiobject_size")?;
    // 3.15+ says sizeof(PyCompactUnicodeObject); before, it is a known distance further.
    let compact_size = d
        .opt("unicode_object.compactunicodeobject_size")
        .unwrap_or(ascii_size.saturating_add(extras.compact_extra));
    if ascii_size == 0 || compact_size <= ascii_size || compact_size > 256 {
        return Err(format!(
            "unicode object sizes {ascii_size} and {compact_size} are not believable"
        ));
    }
    for (what, fields, max) in [
        ("thread state", &tstate_fields[..], MAX_READ_SPAN),
        ("frame", &frame_fields[..], 256),
        ("code object", &code_fields[..], MAX_READ_SPAN),
    ] {
        if span(fields) > max {
            return Err(format!(
                "the {what} fields span {} bytes (at most {max} are read)",
                span(fields)
            ));
        }
    }
    let interp_fields = [interp("next")?, interp("id")?, interp("threads_head")?];
    let (lo, hi) = (
        interp_fields.iter().min().copied().unwrap_or(0),
        interp_fields.iter().max().copied().unwrap_or(0),
    );
    if hi - lo > MAX_INTERP_SPAN {
        return Err(format!(
            "the interpreter state fields span {} bytes (at most {MAX_INTERP_SPAN} are read)",
            hi - lo
        ));
    }
    Ok(Layout {
        version,
        runtime_interpreters_head: d.offset("runtime_state", "interpreters_head")?,
        gil,
        interp: InterpLayout {
            next: interp("next")?,
            id: interp("id")?,
            threads_head: interp("threads_head")?,
            code_object_generation: d
                .opt("interpreter_state.code_object_generation")
                .and_then(|_| interp("code_object_generation").ok()),
            modules: interp("imports_modules")?,
            gc_collecting: interp("gc")?
                .checked_add(d.offset("gc", "collecting")?)
                .ok_or("gc.collecting overflows")?,
            gc_frame: match d.opt("gc.frame") {
                Some(_) => Some(
                    interp("gc")?
                        .checked_add(d.offset("gc", "frame")?)
                        .ok_or("gc.frame overflows")?,
                ),
                None => None,
            },
        },
        tstate: ThreadLayout {
            size: span(&tstate_fields),
            next: ts("next")?,
            interp: ts("interp")?,
            thread_id: ts("thread_id")?,
            native_thread_id: ts("native_thread_id")?,
            current_frame: CurrentFrame::Direct(ts("current_frame")?),
            datastack_chunk: Some(datastack_chunk),
            frame_marker,
            holds_gil,
            gil_requested,
            base_frame,
        },
        frame: FrameLayout {
            size: span(&frame_fields),
            previous: fr("previous")?,
            code: fr("executable")?,
            instr: fr("instr_ptr")?,
            owner: fr("owner")?,
            code_tag_mask: extras.code_tag_mask,
            shim_owners: extras.shim_owners,
            is_entry: None,
            localsplus: fr("localsplus")?,
            liveness,
        },
        code: CodeLayout {
            size: span(&code_fields),
            name: co("name")?,
            qualname: co("qualname")?,
            filename: co("filename")?,
            firstlineno: co("firstlineno")?,
            linetable: co("linetable")?,
            code_adaptive,
            first_traceable,
            stacksize,
            nlocalsplus,
            localsplusnames: co("localsplusnames")?,
            localspluskinds: co("localspluskinds")?,
        },
        unicode: UnicodeLayout {
            length: d.offset("unicode_object", "length")?,
            state: unicode_state,
            ascii_size,
            compact_size,
            data_any: compact_size,
            kind_shift: extras.kind_shift,
            compact_bit: extras.compact_bit,
            ascii_bit: extras.ascii_bit,
        },
        bytes: BytesLayout {
            ob_size: d.offset("bytes_object", "ob_size")?,
            ob_sval: d.offset("bytes_object", "ob_sval")?,
        },
        tuple_items: d.offset("tuple_object", "ob_item")?,
        task_objects: task_objects(d, &extras)?,
    })
}

/// The objects reading asyncio tasks needs, from the tables that describe them (3.14+);
/// `None` for a table without generators.
fn task_objects(
    d: &DebugOffsets,
    extras: &tables::Extras,
) -> Result<Option<TaskObjectsLayout>, String> {
    if d.opt("gen_object.gi_iframe").is_none() {
        return Ok(None);
    }
    let gen = |f| d.offset("gen_object", f);
    let gen_iframe = gen("gi_iframe")?;
    let frame_size = d.get("interpreter_frame.size")?;
    let gen_size = gen_iframe
        .checked_add(frame_size)
        .filter(|&n| n <= MAX_READ_SPAN)
        .ok_or("a generator's frame lies too far in")?;
    let llist_next = d.get("llist_node.next")?;
    if llist_next > 8 {
        return Err(format!("llist_node.next = {llist_next}"));
    }
    Ok(Some(TaskObjectsLayout {
        ob_type: d.offset("pyobject", "ob_type")?,
        tp_flags: d.offset("type_object", "tp_flags")?,
        gen_size,
        gen_iframe,
        gen_frame_state: gen("gi_frame_state")?,
        gen_cleared: extras.gen_cleared,
        gen_yield_from: extras.gen_yield_from,
        gen_finished: extras.gen_finished,
        frame_stackpointer: d.offset("interpreter_frame", "stackpointer")?,
        awaited_depth: extras.awaited_depth,
        set_size: span(&[
            d.offset("set_object", "used")?,
            d.offset("set_object", "mask")?,
            d.offset("set_object", "table")?,
        ]),
        set_used: d.offset("set_object", "used")?,
        set_mask: d.offset("set_object", "mask")?,
        set_table: d.offset("set_object", "table")?,
        long_lv_tag: d.offset("long_object", "lv_tag")?,
        long_digit: d.offset("long_object", "ob_digit")?,
        llist_next,
    }))
}

/// Reads and validates the target's debug offsets (`names`: its version's field list, from
/// the table of supported versions) and builds its layout.
pub fn layout<M: RemoteMemory>(
    mem: &M,
    runtime: u64,
    version: Version,
    names: &'static [&'static str],
) -> Result<Layout, AttachError> {
    let raw = mem.read_vec(runtime, names.len() * 8)?;
    let d = DebugOffsets::parse(names, &raw).map_err(AttachError::BadDebugOffsets)?;
    if d.get("free_threaded")
        .map_err(AttachError::BadDebugOffsets)?
        != 0
    {
        return Err(AttachError::FreeThreaded(version.to_string()));
    }
    build(&d, version).map_err(AttachError::BadDebugOffsets)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cpython::synthetic::{offsets, raw_offsets};

    /// Every minor version the table may claim: the synthetic table builds for one of them.
    fn builds(raw: &[u8]) -> Vec<Result<Layout, String>> {
        let d = DebugOffsets::parse(FIELDS_313, raw).expect("a table with its cookie");
        (13..=15)
            .map(|minor| build(&d, Version::from_hex(0x0300_00f0 | (minor << 16))))
            .collect()
    }

    #[test]
    fn a_code_object_read_past_its_bound_is_refused() {
        let mut raw = raw_offsets(&offsets());
        assert!(builds(&raw).iter().any(|b| b.is_ok()));
        // Found by fuzzing: a large struct whose `co_code_adaptive` lies far in made the read
        // of `_co_firsttraceable` (16 bytes before it) 126 KB long.
        let mut set = |field: &str, value: u64| {
            let i = FIELDS_313
                .iter()
                .position(|&f| f == field)
                .expect("a field");
            raw[i * 8..i * 8 + 8].copy_from_slice(&value.to_le_bytes());
        };
        set("code_object.size", 1 << 20);
        set("code_object.co_code_adaptive", 126_208);
        for b in builds(&raw) {
            match b {
                Ok(layout) => panic!("built, reading {} bytes of code object", layout.code.size),
                Err(e) => assert!(
                    e.contains("code object") || e.contains("table is for"),
                    "{e}"
                ),
            }
        }
    }
}
