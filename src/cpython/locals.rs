//! A frame's local variables, read from outside for `dump --locals`: each name of the frame's
//! code object (`co_localsplusnames`) with the value in its slot (`localsplus`), formatted
//! from the value's memory.
//!
//! Contracts:
//! - Nothing of the target runs: no `__repr__`, no attribute lookup. Values of the
//!   interpreter's own types, told by their type object's address ([`BuiltinTypes`]), are
//!   shown by value: `None`, `True`/`False`, an `int` (up to [`MAX_INT_DIGITS`] digits of 30
//!   bits), a `float`, a `str` or `bytes` (their first [`MAX_VALUE_CHARS`], then `...`);
//!   a `tuple`, `list` or `dict` by its length; any other object as `<TYPE object at 0xADDR>`,
//!   TYPE its type's `tp_name` (at most [`MAX_TYPE_NAME`] bytes). A cell (a variable an inner
//!   function uses) shows what it holds.
//! - Bounded: at most [`MAX_LOCALS`] slots of a frame are read, in a handful of reads each;
//!   a value that cannot be read shows as `<not readable at 0xSLOT>`, the frame's other
//!   variables still shown.
//! - Unbound slots (a local not yet assigned) and hidden ones (3.12+: a comprehension's
//!   variables inlined into the function) are left out.
//! - Names and values are the target's, untrusted: bounded here, sanitised by the output.
//! - The frame must still run the code object its stack was read with (read again first);
//!   else [`FrameLocals::Gone`]: it returned, and its slots belong to another frame now.

use crate::binary::BuiltinTypes;
use crate::cpython::instances::type_name;
use crate::cpython::layout::Layout;
use crate::cpython::objects::read_unicode;
use crate::cpython::UnwindError;
use crate::memory::{Bytes, RemoteMemory};

/// Most slots of one frame read.
pub const MAX_LOCALS: usize = 256;
/// Most characters (of a `str`) or bytes (of a `bytes`) of one value shown.
pub const MAX_VALUE_CHARS: usize = 80;
/// Most 30-bit digits of an `int` shown by value (120 bits).
pub const MAX_INT_DIGITS: u64 = 4;
/// Most bytes of a type's name read.
pub const MAX_TYPE_NAME: usize = 64;

/// `CO_FAST_HIDDEN`, `CO_FAST_CELL`, `CO_FAST_FREE` (Include/internal/pycore_code.h; 3.11
/// has no hidden slots).
const FAST_HIDDEN: u8 = 0x10;
const FAST_CELL: u8 = 0x40;
const FAST_FREE: u8 = 0x80;

/// `PyObject.ob_type`, `PyVarObject.ob_size`, `PyFloatObject.ob_fval`, `PyDictObject.ma_used`,
/// `PyCellObject.ob_ref`, and where an `int`'s size (3.11: `ob_size`; 3.12+: `lv_tag`) and
/// digits are: the same in every supported default build.
const OB_TYPE: u64 = 8;
const OB_SIZE: u64 = 16;
const FLOAT_VALUE: u64 = 16;
const DICT_USED: u64 = 16;
const CELL_REF: u64 = 16;
const LONG_SIZE: u64 = 16;
const LONG_DIGITS: u64 = 24;
/// 3.14+: a `_PyStackRef`'s tag bits, and the tag of an integer kept in the reference itself.
const STACKREF_TAG_BITS: u64 = 3;
const STACKREF_INT_TAG: u64 = 3;

/// One local variable as shown.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Local {
    pub name: String,
    pub value: String,
}

/// A frame's locals, or why they are not shown.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum FrameLocals {
    Read(Vec<Local>),
    /// The frame returned between the read of its stack and this one.
    Gone,
    /// Its memory could not be read as a frame's locals (why).
    Unreadable(String),
}

/// Reads frames' locals out of one process.
pub struct LocalsReader<'a, M: RemoteMemory> {
    mem: &'a M,
    layout: &'a Layout,
    types: BuiltinTypes,
}

impl<'a, M: RemoteMemory> LocalsReader<'a, M> {
    pub fn new(mem: &'a M, layout: &'a Layout, types: BuiltinTypes) -> Self {
        LocalsReader { mem, layout, types }
    }

    /// The locals of the frame at `frame`, whose stack was read while it ran code object
    /// `code`.
    pub fn frame_locals(&self, frame: u64, code: u64) -> Result<FrameLocals, UnwindError> {
        let f = &self.layout.frame;
        let now = self.mem.read_u64(frame.wrapping_add(f.code))?;
        if now & !f.code_tag_mask != code {
            return Ok(FrameLocals::Gone);
        }
        let c = &self.layout.code;
        let head = self
            .mem
            .read_vec(code, c.size.max(c.localspluskinds + 8) as usize)?;
        let head = Bytes(&head);
        let n = usize::try_from(head.i32(c.nlocalsplus)?)
            .unwrap_or(0)
            .min(MAX_LOCALS);
        if n == 0 {
            return Ok(FrameLocals::Read(Vec::new()));
        }
        let names_tuple = head.u64(c.localsplusnames)?;
        let kinds_bytes = head.u64(c.localspluskinds)?;
        let names = self
            .mem
            .read_vec(names_tuple.wrapping_add(self.layout.tuple_items), 8 * n)?;
        let kinds = self
            .mem
            .read_vec(kinds_bytes.wrapping_add(self.layout.bytes.ob_sval), n)?;
        let slots = self.mem.read_vec(frame.wrapping_add(f.localsplus), 8 * n)?;
        let (names, slots) = (Bytes(&names), Bytes(&slots));
        let mut out = Vec::new();
        for (i, &kind) in kinds.iter().enumerate() {
            if kind & FAST_HIDDEN != 0 {
                continue;
            }
            let slot = slots.u64(8 * i as u64)?;
            // A value that cannot be read is that value's failure, not the frame's.
            let value = match self.slot_value(slot, kind & (FAST_CELL | FAST_FREE) != 0) {
                Ok(Some(value)) => value,
                Ok(None) => continue,
                Err(_) => format!("<not readable at {slot:#x}>"),
            };
            let name_at = names.u64(8 * i as u64)?;
            let name = read_unicode(self.mem, self.layout, name_at)
                .map(|n| bounded(&n, MAX_VALUE_CHARS))
                .unwrap_or_else(|_| format!("<name at {name_at:#x}>"));
            out.push(Local { name, value });
        }
        Ok(FrameLocals::Read(out))
    }

    /// A slot's value as shown; `None` when unbound. `cell`: the slot may hold a cell.
    fn slot_value(&self, slot: u64, cell: bool) -> Result<Option<String>, UnwindError> {
        let tagged = self.layout.frame.code_tag_mask != 0;
        if tagged && slot & STACKREF_TAG_BITS == STACKREF_INT_TAG {
            return Ok(Some(((slot as i64) >> 2).to_string()));
        }
        let mut obj = match tagged {
            true => slot & !STACKREF_TAG_BITS,
            false => slot,
        };
        if obj == 0 {
            return Ok(None);
        }
        if cell && Some(self.mem.read_u64(obj.wrapping_add(OB_TYPE))?) == self.types.cell {
            obj = self.mem.read_u64(obj.wrapping_add(CELL_REF))?;
            if obj == 0 {
                return Ok(None);
            }
        }
        self.value(obj).map(Some)
    }

    /// The object at `obj` as shown (see the module documentation).
    fn value(&self, obj: u64) -> Result<String, UnwindError> {
        let t = &self.types;
        let word = |off: u64| self.mem.read_u64(obj.wrapping_add(off));
        let type_addr = word(OB_TYPE)?;
        let ty = Some(type_addr);
        if ty == t.none {
            return Ok("None".into());
        }
        if ty == t.bool_ {
            return Ok(match self.int(obj)? {
                Some(0) => "False".into(),
                _ => "True".into(),
            });
        }
        if ty == t.int {
            return Ok(match self.int(obj)? {
                Some(v) => v.to_string(),
                None => "<int, too large to show>".into(),
            });
        }
        if ty == t.float {
            return Ok(float_repr(f64::from_bits(word(FLOAT_VALUE)?)));
        }
        if ty == t.str_ {
            let s = read_unicode(self.mem, self.layout, obj)?;
            return Ok(quoted(&s));
        }
        if ty == t.bytes {
            let len = word(self.layout.bytes.ob_size)? as i64;
            let shown = usize::try_from(len).unwrap_or(0).min(MAX_VALUE_CHARS);
            let data = self
                .mem
                .read_vec(obj.wrapping_add(self.layout.bytes.ob_sval), shown)?;
            let chars: Vec<char> = data.iter().map(|&b| char::from(b)).collect();
            let mut s = format!("b{}", python_quoted(&chars, true));
            if len as usize > shown {
                s.push_str("...");
            }
            return Ok(s);
        }
        for (is, what, off) in [
            (t.tuple, "tuple", OB_SIZE),
            (t.list, "list", OB_SIZE),
            (t.dict, "dict", DICT_USED),
        ] {
            if ty == is {
                let n = word(off)? as i64;
                return Ok(format!("<{what} of {n} items at {obj:#x}>"));
            }
        }
        let raw = type_name(self.mem, type_addr, MAX_TYPE_NAME)?;
        let name = String::from_utf8_lossy(&raw);
        Ok(format!("<{name} object at {obj:#x}>"))
    }

    /// An `int`'s value, `None` when it has more than [`MAX_INT_DIGITS`] digits.
    fn int(&self, obj: u64) -> Result<Option<i128>, UnwindError> {
        let size = self.mem.read_u64(obj.wrapping_add(LONG_SIZE))?;
        let (negative, digits) = match self.layout.version.minor {
            // `ob_size`: the number of digits, negative for a negative number.
            11 => ((size as i64) < 0, (size as i64).unsigned_abs()),
            // `lv_tag`: the number of digits above three bits, the sign below (2: negative).
            _ => (size & 3 == 2, size >> 3),
        };
        if digits > MAX_INT_DIGITS {
            return Ok(None);
        }
        let raw = self
            .mem
            .read_vec(obj.wrapping_add(LONG_DIGITS), 4 * digits as usize)?;
        let mut v: i128 = 0;
        for d in raw.chunks_exact(4).rev() {
            let d = u32::from_le_bytes([d[0], d[1], d[2], d[3]]) & ((1 << 30) - 1);
            v = (v << 30) | i128::from(d);
        }
        Ok(Some(if negative { -v } else { v }))
    }
}

/// `s`'s first `max` characters, then `...` when there are more.
fn bounded(s: &str, max: usize) -> String {
    let mut out: String = s.chars().take(max).collect();
    if s.chars().nth(max).is_some() {
        out.push_str("...");
    }
    out
}

/// A `str` as Python's `repr` writes it, its first [`MAX_VALUE_CHARS`] only, then `...`.
fn quoted(s: &str) -> String {
    let chars: Vec<char> = s.chars().take(MAX_VALUE_CHARS).collect();
    let mut out = python_quoted(&chars, false);
    if s.chars().nth(MAX_VALUE_CHARS).is_some() {
        out.push_str("...");
    }
    out
}

/// Characters quoted as Python's `repr` of a `str` (or, `bytes`, of a `bytes` whose bytes
/// they are) quotes them: in `'`, or in `"` when they hold a `'` and no `"`; the quote,
/// backslash and control characters escaped (and, in bytes, everything outside printable
/// ASCII).
fn python_quoted(chars: &[char], bytes: bool) -> String {
    let quote = match chars.contains(&'\'') && !chars.contains(&'"') {
        true => '"',
        false => '\'',
    };
    let mut out = String::from(quote);
    for &c in chars {
        match c {
            '\\' => out.push_str("\\\\"),
            '\n' => out.push_str("\\n"),
            '\r' => out.push_str("\\r"),
            '\t' => out.push_str("\\t"),
            c if c == quote => {
                out.push('\\');
                out.push(c);
            }
            c if (c as u32) < 0x20 || c as u32 == 0x7f || (bytes && c as u32 > 0x7f) => {
                out.push_str(&format!("\\x{:02x}", c as u32));
            }
            c if c.is_control() => match c as u32 {
                n if n <= 0xff => out.push_str(&format!("\\x{n:02x}")),
                n if n <= 0xffff => out.push_str(&format!("\\u{n:04x}")),
                n => out.push_str(&format!("\\U{n:08x}")),
            },
            c => out.push(c),
        }
    }
    out.push(quote);
    out
}

/// A `float` as Python's `repr` writes it: the shortest digits that read back the same
/// (Rust's `Debug` finds the same digits and switches to an exponent at the same
/// magnitudes), the exponent signed and of two digits at least.
fn float_repr(v: f64) -> String {
    if v.is_nan() {
        return "nan".into();
    }
    if v.is_infinite() {
        return if v > 0.0 { "inf" } else { "-inf" }.into();
    }
    let s = format!("{v:?}");
    match s.split_once('e') {
        Some((mantissa, exp)) => {
            let (sign, digits) = match exp.strip_prefix('-') {
                Some(d) => ('-', d),
                None => ('+', exp),
            };
            format!("{mantissa}e{sign}{digits:0>2}")
        }
        None => s,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn strings_are_quoted_escaped_and_bounded_as_python_does() {
        // Each expectation is Python's repr() of the same string.
        assert_eq!(quoted("it's"), r#""it's""#);
        assert_eq!(quoted("'\"'"), r#"'\'"\''"#);
        assert_eq!(quoted("a\nb\x1b[31m\u{85}é中"), r"'a\nb\x1b[31m\x85é中'");
        let long = "x".repeat(MAX_VALUE_CHARS + 5);
        assert_eq!(
            quoted(&long),
            format!("'{}'...", "x".repeat(MAX_VALUE_CHARS))
        );
        assert_eq!(quoted("..."), "'...'");
        let raw: Vec<char> = b"\x00ab'\"\\\n\xff"
            .iter()
            .map(|&b| char::from(b))
            .collect();
        assert_eq!(python_quoted(&raw, true), r#"'\x00ab\'"\\\n\xff'"#);
    }

    #[test]
    fn floats_read_as_python_writes_them() {
        for (v, python) in [
            (3.25, "3.25"),
            (1.0, "1.0"),
            (-0.5, "-0.5"),
            (1e16, "1e+16"),
            (1.5e-5, "1.5e-05"),
            (1e-4, "0.0001"),
            (1e15, "1000000000000000.0"),
            (f64::INFINITY, "inf"),
        ] {
            assert_eq!(float_repr(v), python, "{v}");
        }
    }
}
