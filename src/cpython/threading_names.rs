//! The names the `threading` module gives a process's threads (`Thread.name`: "MainThread",
//! "Thread-1 (work)", a pool's "pool_0"), read from outside for `dump`: in each interpreter,
//! `sys.modules["threading"]._active` maps `threading.get_ident()` to the `Thread`, whose
//! `_name` is the name. Read on demand, never while sampling: it walks three dicts and an
//! instance's attributes, a few hundred small reads.
//!
//! The dicts and the instance's attribute are read through `instances` (layouts there).
//!
//! Target memory is hostile: every count is bounded, every string read through the str
//! reader's bounds, and a thread whose name cannot be read has none (the dump says the
//! kernel's name only).

use super::instances::{ObjectReader, MODULE_MD_DICT};
use super::layout::Layout;
use super::UnwindError;
use crate::memory::RemoteMemory;
use std::collections::HashMap;

/// Most interpreters looked at.
const MAX_INTERPRETERS: usize = 256;
/// Longest name kept, in characters.
const MAX_NAME_CHARS: usize = 256;

/// `threading.get_ident()` to `Thread.name`, for every thread the `threading` module of any
/// interpreter knows. Empty when no interpreter imported `threading`.
pub fn read<M: RemoteMemory>(
    mem: &M,
    layout: &Layout,
    runtime: u64,
) -> Result<HashMap<u64, String>, UnwindError> {
    let Some(reader) = ObjectReader::new(mem, layout) else {
        return Ok(HashMap::new());
    };
    let mut names = HashMap::new();
    let mut interp = mem.read_u64(runtime + layout.runtime_interpreters_head)?;
    let mut seen = 0;
    while interp != 0 {
        seen += 1;
        if seen > MAX_INTERPRETERS {
            return Err(UnwindError::TooLong("interpreter list", MAX_INTERPRETERS));
        }
        interpreter(mem, layout, &reader, interp, &mut names)?;
        interp = mem.read_u64(interp + layout.interp.next)?;
    }
    Ok(names)
}

fn interpreter<M: RemoteMemory>(
    mem: &M,
    layout: &Layout,
    reader: &ObjectReader<'_, M>,
    interp: u64,
    names: &mut HashMap<u64, String>,
) -> Result<(), UnwindError> {
    let modules = mem.read_u64(interp + layout.interp.modules)?;
    if modules == 0 {
        return Ok(());
    }
    let Some(threading) = reader.str_keyed(&reader.dict(modules)?, "threading")? else {
        return Ok(());
    };
    let globals = mem.read_u64(threading.value + MODULE_MD_DICT)?;
    let Some(active) = reader.str_keyed(&reader.dict(globals)?, "_active")? else {
        return Ok(());
    };
    for e in reader.dict(active.value)? {
        if e.value == 0 {
            continue;
        }
        let Some(ident) = reader.int(e.key)? else {
            continue;
        };
        // A thread whose name cannot be read (being torn down) keeps the others'.
        if let Ok(Some(name)) = reader.str_attribute(e.value, "_name") {
            names.insert(ident, name.chars().take(MAX_NAME_CHARS).collect());
        }
    }
    Ok(())
}
