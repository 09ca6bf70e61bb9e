//! Reading CPython objects out of target memory: unicode strings (compact ASCII, 1-, 2- and
//! 4-byte kinds, legacy), bytes, and code objects (names, file, first line, line table).
//!
//! A code object costs three syscalls whatever its size: its header; the headers of its three
//! strings and its line table together; then their data together. Everything read is
//! validated before use: lengths are capped, kinds checked, and the object's type compared
//! with `PyCode_Type` when the binary exports it. What is read is bounded by pyfleet, not by
//! the target: a name or file name is its first [`MAX_NAME_CHARS`] characters (then `…`), a
//! line table its first [`MAX_LINETABLE_READ`] bytes (later lines unknown), and one batch of
//! code objects reads at most [`MAX_BATCH_BYTES`] of text and tables (the objects past it
//! fail with [`UnwindError::Budget`] and are read by later samples).

use super::layout::Layout;
use super::linetable::{self, LineRange, MAX_LINETABLE_LEN};

/// Characters of a name or file name kept; a longer one is cut and ends in `…`.
pub const MAX_NAME_CHARS: usize = 256;
/// Bytes of a line table read: lines of instructions past it are unknown (real tables are a
/// few KiB; of 146,000 code objects of SymPy, Jinja2, pyparsing and the standard library only
/// two generated functions have more, 184 and 710 KiB).
pub const MAX_LINETABLE_READ: usize = 256 << 10;
/// Most bytes of strings and line tables one batch of code objects reads.
pub const MAX_BATCH_BYTES: usize = 4 << 20;
use super::UnwindError;
use crate::memory::{Bytes, ReadRequest, RemoteMemory};

/// Largest `_co_firsttraceable` believed (code units before `RESUME`: cell set-up, at most
/// one per local).
const MAX_FIRST_TRACEABLE: u32 = 1 << 16;
/// Longest string believed (characters).
const MAX_STR_CHARS: u64 = 1 << 20;

/// What pyfleet keeps of a code object.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CodeInfo {
    pub name: String,
    pub qualname: String,
    pub filename: String,
    pub first_line: i32,
    pub lines: Vec<LineRange>,
    /// Index (in code units) of the first instruction at which a frame of this code has
    /// started: a frame whose instruction pointer is before it is incomplete, and hidden
    /// (as `frame.f_back` and `sys._current_frames()` hide it).
    pub first_traceable: u32,
    /// Bytes a frame of this code takes in the data stack (0: not believable); the frame it
    /// calls starts right after.
    pub frame_bytes: u32,
    /// Whether its frames have local, cell or free variable slots (`co_nlocalsplus > 0`):
    /// a 3.14+ frame being cleared then has its stack pointer at the first of them, where no
    /// live frame of this code has it (see `Liveness::ClearedCode`).
    pub has_locals: bool,
}

impl CodeInfo {
    /// The function this code object is, for interning (its names only: a function outlives
    /// the code object's cache entry, and its line table is not needed to print it).
    pub fn function(&self) -> crate::stacks::Function {
        crate::stacks::Function {
            name: self.name.as_str().into(),
            qualname: self.qualname.as_str().into(),
            filename: self.filename.as_str().into(),
            first_line: self.first_line,
        }
    }

    /// The line for an instruction pointer into this code object (see `linetable`).
    pub fn line_at(&self, code_addr: u64, code_adaptive: u64, instr: u64) -> Option<i32> {
        let start = code_addr.wrapping_add(code_adaptive);
        let offset = (instr as i64).wrapping_sub(start as i64);
        linetable::line_for_offset(&self.lines, self.first_line, offset)
    }

    /// Whether a frame of this code at `instr` has started (reached its first traceable
    /// instruction). One that has not is pushed but not yet running: CPython hides it from
    /// `f_back`, `sys._current_frames()` and tracebacks (`_PyFrame_IsIncomplete`), and so do
    /// we. Its own shims are such frames: the 3.13+ `__init__` clean-up frame of a class call,
    /// the 3.12 interpreter trampoline. Generator frames are always complete.
    pub fn started(&self, code_addr: u64, code_adaptive: u64, instr: u64) -> bool {
        instr >= self.first_traceable_at(code_addr.wrapping_add(code_adaptive))
    }

    /// Where its first traceable instruction is, for bytecode starting at `start`.
    fn first_traceable_at(&self, start: u64) -> u64 {
        start.wrapping_add(2 * u64::from(self.first_traceable))
    }

    /// Whether a frame of this code at `instr` has run past its first traceable instruction
    /// (`RESUME`) to one inside its bytecode. A frame that has not may be pushed and linked to
    /// its caller but not yet be its thread's current frame (its arguments being bound), or be
    /// half initialised (its instruction pointer another frame's): its callers' view of the
    /// stack does not show it yet.
    pub fn resumed(&self, code_addr: u64, code_adaptive: u64, instr: u64) -> bool {
        let start = code_addr.wrapping_add(code_adaptive);
        let end = start.wrapping_add(self.lines.last().map_or(0, |r| u64::from(r.end)));
        instr > self.first_traceable_at(start) && instr < end
    }
}

/// Where a string's characters are, how wide each is, and how many of them are read.
pub(crate) struct StrData {
    pub(crate) addr: u64,
    chars: usize,
    kind: u8,
}

impl StrData {
    /// Bytes read: at most [`MAX_NAME_CHARS`] characters.
    pub(crate) fn read_len(&self) -> usize {
        self.chars.min(MAX_NAME_CHARS) * usize::from(self.kind)
    }
    /// The characters read, with `…` when the string is longer.
    pub(crate) fn decode(&self, data: &[u8]) -> String {
        let mut s = decode_str(self.kind, data);
        if self.chars > MAX_NAME_CHARS {
            s.push('…');
        }
        s
    }
}

/// Parses a unicode object's header (at least `compact_size + 8` bytes).
pub(crate) fn unicode_header(
    layout: &Layout,
    obj: u64,
    hdr: &[u8],
) -> Result<StrData, UnwindError> {
    let u = &layout.unicode;
    let b = Bytes(hdr);
    let state = b.u32(u.state)?;
    let kind = ((state >> u.kind_shift) & 7) as u8;
    let compact = (state >> u.compact_bit) & 1 == 1;
    let ascii = (state >> u.ascii_bit) & 1 == 1;
    let len = b.i64(u.length)?;
    let bad = |why: &str| UnwindError::BadObject {
        addr: obj,
        what: format!("string: {why}"),
    };
    if !matches!(kind, 1 | 2 | 4) || (ascii && kind != 1) {
        return Err(bad("invalid kind"));
    }
    if len < 0 || len as u64 > MAX_STR_CHARS {
        return Err(bad("absurd length"));
    }
    let addr = match (compact, ascii) {
        (true, true) => obj.wrapping_add(u.ascii_size),
        (true, false) => obj.wrapping_add(u.compact_size),
        (false, _) => b.u64(u.data_any)?,
    };
    Ok(StrData {
        addr,
        chars: len as usize,
        kind,
    })
}

fn decode_str(kind: u8, data: &[u8]) -> String {
    match kind {
        1 => data.iter().map(|&b| char::from(b)).collect(),
        2 => data
            .chunks_exact(2)
            .map(|c| {
                char::from_u32(u32::from(u16::from_le_bytes([c[0], c[1]])))
                    .unwrap_or(char::REPLACEMENT_CHARACTER)
            })
            .collect(),
        _ => data
            .chunks_exact(4)
            .map(|c| {
                char::from_u32(u32::from_le_bytes([c[0], c[1], c[2], c[3]]))
                    .unwrap_or(char::REPLACEMENT_CHARACTER)
            })
            .collect(),
    }
}

/// Reads one unicode object (two syscalls). The code-object path batches instead.
pub fn read_unicode<M: RemoteMemory>(
    mem: &M,
    layout: &Layout,
    addr: u64,
) -> Result<String, UnwindError> {
    let hdr = mem.read_vec(addr, (layout.unicode.compact_size + 8) as usize)?;
    let s = unicode_header(layout, addr, &hdr)?;
    let data = mem.read_vec(s.addr, s.read_len())?;
    Ok(s.decode(&data))
}

/// Reads a code object at `addr`. `code_type` is the target's `PyCode_Type`, if known: an
/// object of any other type gives [`UnwindError::NotCode`].
pub fn read_code<M: RemoteMemory>(
    mem: &M,
    layout: &Layout,
    code_type: Option<u64>,
    addr: u64,
) -> Result<CodeInfo, UnwindError> {
    match read_codes(mem, layout, code_type, &[addr])?.pop() {
        Some(code) => code.map(|c| c.info),
        None => Err(UnwindError::NotCode(addr)),
    }
}

/// The part of a code object whose words tell which object it is: from the lowest to the
/// highest of its name, qualname, filename and line-table pointers. An object at the same
/// address with the same words has the same contents (they are immutable once made).
pub fn fingerprint_span(layout: &Layout) -> (u64, usize) {
    let c = &layout.code;
    let fields = [c.name, c.qualname, c.filename, c.linetable];
    let lo = fields.iter().copied().min().unwrap_or(0);
    let hi = fields.iter().copied().max().unwrap_or(0);
    (lo, (hi - lo + 8) as usize)
}

/// A hash of a code object's [`fingerprint_span`] bytes.
pub fn fingerprint(bytes: &[u8]) -> u64 {
    bytes.chunks(8).fold(0xcbf2_9ce4_8422_2325u64, |h, c| {
        let mut w = [0u8; 8];
        w[..c.len()].copy_from_slice(c);
        (h ^ u64::from_le_bytes(w)).wrapping_mul(0x0000_0100_0000_01b3)
    })
}

/// Most bytes believed for one frame (a code object's counts are the target's).
const MAX_FRAME_BYTES: i64 = 1 << 20;

/// Bytes of the data stack a frame of a code object with these counts takes; 0 for counts
/// no real code object has.
fn frame_bytes(nlocalsplus: i32, stacksize: i32, layout: &Layout) -> u32 {
    let words = i64::from(nlocalsplus) + i64::from(stacksize);
    let bytes = words * 8 + layout.frame.localsplus as i64;
    match nlocalsplus >= 0 && stacksize >= 0 && bytes <= MAX_FRAME_BYTES {
        true => bytes as u32,
        false => 0,
    }
}

/// Where a code object's parts are, from its header.
struct CodeParts {
    fingerprint: u64,
    strs: [u64; 3],
    table: u64,
    first_line: i32,
    first_traceable: u32,
    frame_bytes: u32,
    has_locals: bool,
}

/// A code object as read, with the [`fingerprint`] of the header its contents came from.
pub struct LoadedCode {
    pub info: CodeInfo,
    pub fingerprint: u64,
}

/// Reads many code objects in three syscalls whatever their number: all headers; then every
/// string and line-table header; then all characters and tables. A batch-wide read failure
/// is an `Err`; a bad object gives an `Err` in its own slot, the others are still read.
/// Each comes with the [`fingerprint`] of the header it was read from, so that a cache
/// validating it later compares against the very words its contents came from.
pub fn read_codes<M: RemoteMemory>(
    mem: &M,
    layout: &Layout,
    code_type: Option<u64>,
    addrs: &[u64],
) -> Result<Vec<Result<LoadedCode, UnwindError>>, UnwindError> {
    let c = &layout.code;
    let (fp_lo, fp_len) = fingerprint_span(layout);
    let hsize = (c.size as usize).max(fp_lo as usize + fp_len);
    // Round 1: headers.
    let mut headers = vec![0u8; hsize * addrs.len()];
    read_chunks(mem, addrs.iter().map(|&a| (a, hsize)), &mut headers)?;
    let parts: Vec<Result<CodeParts, UnwindError>> = addrs
        .iter()
        .zip(headers.chunks_exact(hsize))
        .map(|(&addr, h)| {
            let h = Bytes(h);
            if code_type.is_some_and(|ty| h.u64(8) != Ok(ty)) {
                return Err(UnwindError::NotCode(addr));
            }
            let nlocalsplus = h.i32(c.nlocalsplus)?;
            Ok(CodeParts {
                fingerprint: fingerprint(
                    h.0.get(fp_lo as usize..fp_lo as usize + fp_len)
                        .unwrap_or_default(),
                ),
                strs: [h.u64(c.name)?, h.u64(c.qualname)?, h.u64(c.filename)?],
                table: h.u64(c.linetable)?,
                first_line: h.i32(c.firstlineno)?,
                // A negative or huge index is garbage: no frame is hidden by it.
                first_traceable: u32::try_from(h.i32(c.first_traceable)?)
                    .ok()
                    .filter(|&i| i <= MAX_FIRST_TRACEABLE)
                    .unwrap_or(0),
                frame_bytes: frame_bytes(nlocalsplus, h.i32(c.stacksize)?, layout),
                has_locals: nlocalsplus > 0,
            })
        })
        .collect();
    let ok: Vec<&CodeParts> = parts.iter().filter_map(|p| p.as_ref().ok()).collect();

    // Round 2: three string headers and one bytes header per code object.
    let uhdr = (layout.unicode.compact_size + 8) as usize;
    let bhdr = layout.bytes.ob_sval as usize;
    let per = 3 * uhdr + bhdr;
    let mut hdrs = vec![0u8; per * ok.len()];
    read_chunks(
        mem,
        ok.iter().flat_map(|p| {
            p.strs
                .iter()
                .map(move |&a| (a, uhdr))
                .chain(std::iter::once((p.table, bhdr)))
        }),
        &mut hdrs,
    )?;
    // Round 3: characters and tables.
    let mut layouts = Vec::with_capacity(ok.len());
    for (p, h) in ok.iter().zip(hdrs.chunks_exact(per)) {
        let strs: Result<Vec<StrData>, UnwindError> = (0..3)
            .map(|i| unicode_header(layout, p.strs[i], &h[i * uhdr..(i + 1) * uhdr]))
            .collect();
        let table_len = Bytes(&h[3 * uhdr..]).i64(layout.bytes.ob_size)?;
        let table = if table_len < 0 || table_len as usize > MAX_LINETABLE_LEN {
            Err(UnwindError::BadObject {
                addr: p.table,
                what: "line table: absurd length".into(),
            })
        } else {
            Ok((table_len as usize).min(MAX_LINETABLE_READ))
        };
        layouts.push(strs.and_then(|s| Ok((s, table?))));
    }
    // The batch's budget: objects past it are left for later samples.
    let mut spent = 0usize;
    for l in layouts.iter_mut() {
        if let Ok((strs, table_len)) = l {
            let cost = strs.iter().map(StrData::read_len).sum::<usize>() + *table_len;
            spent += cost;
            if spent > MAX_BATCH_BYTES {
                *l = Err(UnwindError::Budget("code objects' names and line tables"));
            }
        }
    }
    let ranges: Vec<(u64, usize)> = ok
        .iter()
        .zip(&layouts)
        .filter_map(|(p, l)| l.as_ref().ok().map(|l| (p, l)))
        .flat_map(|(p, (strs, table_len))| {
            strs.iter()
                .map(|s| (s.addr, s.read_len()))
                .chain(std::iter::once((
                    p.table.wrapping_add(layout.bytes.ob_sval),
                    *table_len,
                )))
                .collect::<Vec<_>>()
        })
        .collect();
    let mut data = vec![0u8; ranges.iter().map(|r| r.1).sum()];
    read_chunks(mem, ranges.iter().copied(), &mut data)?;

    // Assemble, in the order asked.
    let mut pos = 0usize;
    let mut take = |n: usize| {
        let s = &data[pos..pos + n];
        pos += n;
        s
    };
    let mut layouts = layouts.into_iter();
    Ok(parts
        .into_iter()
        .map(|p| {
            let p = p?;
            let (strs, table_len) = layouts.next().ok_or(UnwindError::NotCode(0))??;
            let mut text = strs.iter().map(|s| s.decode(take(s.read_len())));
            let (name, qualname, filename) = (
                text.next().unwrap_or_default(),
                text.next().unwrap_or_default(),
                text.next().unwrap_or_default(),
            );
            let info = CodeInfo {
                name,
                qualname,
                filename,
                first_line: p.first_line,
                lines: linetable::decode(take(table_len), p.first_line),
                first_traceable: p.first_traceable,
                frame_bytes: p.frame_bytes,
                has_locals: p.has_locals,
            };
            Ok(LoadedCode {
                info,
                fingerprint: p.fingerprint,
            })
        })
        .collect())
}

/// Reads `ranges` back to back into `out` (whose length is their total) in one batch.
pub fn read_chunks<M: RemoteMemory>(
    mem: &M,
    ranges: impl Iterator<Item = (u64, usize)>,
    out: &mut [u8],
) -> Result<(), UnwindError> {
    let mut rest = out;
    let mut reqs = Vec::new();
    for (addr, len) in ranges {
        let (head, tail) = std::mem::take(&mut rest).split_at_mut(len);
        if !head.is_empty() {
            reqs.push(ReadRequest::new(addr, head));
        }
        rest = tail;
    }
    if reqs.is_empty() {
        return Ok(());
    }
    mem.read_many(&mut reqs)
        .map_err(|(_, e)| UnwindError::Memory(e))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn decodes_every_kind() {
        assert_eq!(decode_str(1, b"caf\xe9"), "café");
        let bmp: Vec<u8> = "関数".encode_utf16().flat_map(u16::to_le_bytes).collect();
        assert_eq!(decode_str(2, &bmp), "関数");
        let astral: Vec<u8> = "𠀀𠀁"
            .chars()
            .flat_map(|c| (c as u32).to_le_bytes())
            .collect();
        assert_eq!(decode_str(4, &astral), "𠀀𠀁");
        // Lone surrogates and out-of-range code points do not panic.
        assert_eq!(decode_str(2, &[0x00, 0xd8]), "\u{fffd}");
        assert_eq!(decode_str(4, &[0xff, 0xff, 0xff, 0xff]), "\u{fffd}");
    }
}
