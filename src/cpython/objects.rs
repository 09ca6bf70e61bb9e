//! Reading CPython objects out of target memory: unicode strings (compact ASCII, 1-, 2- and
//! 4-byte kinds, legacy), bytes, and code objects (names, file, first line, line table).
//!
//! A code object costs three syscalls whatever its size: its header; the headers of its three
//! strings and its line table together; then their data together. Everything read is
//! validated before use: lengths are capped, kinds checked, and the object's type compared
//! with `PyCode_Type` when the binary exports it.

use super::layout::Layout;
use super::linetable::{self, LineRange, MAX_LINETABLE_LEN};
use super::UnwindError;
use crate::memory::{Bytes, ReadRequest, RemoteMemory};

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
}

impl CodeInfo {
    /// The line for an instruction pointer into this code object (see `linetable`).
    pub fn line_at(&self, code_addr: u64, code_adaptive: u64, instr: u64) -> Option<i32> {
        let start = code_addr.wrapping_add(code_adaptive);
        let offset = (instr as i64).wrapping_sub(start as i64);
        linetable::line_for_offset(&self.lines, self.first_line, offset)
    }
}

/// Where a string's characters are and how wide each is.
struct StrData {
    addr: u64,
    chars: usize,
    kind: u8,
}

/// Parses a unicode object's header (at least `compact_size + 8` bytes).
fn unicode_header(layout: &Layout, obj: u64, hdr: &[u8]) -> Result<StrData, UnwindError> {
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
    let data = mem.read_vec(s.addr, s.chars * usize::from(s.kind))?;
    Ok(decode_str(s.kind, &data))
}

/// Reads a code object at `addr`. `code_type` is the target's `PyCode_Type`, if known: an
/// object of any other type gives [`UnwindError::NotCode`].
pub fn read_code<M: RemoteMemory>(
    mem: &M,
    layout: &Layout,
    code_type: Option<u64>,
    addr: u64,
) -> Result<CodeInfo, UnwindError> {
    let c = &layout.code;
    let hdr = mem.read_vec(addr, c.size as usize)?;
    let h = Bytes(&hdr);
    if let Some(ty) = code_type {
        if h.u64(8)? != ty {
            return Err(UnwindError::NotCode(addr));
        }
    }
    let ptrs = [h.u64(c.name)?, h.u64(c.qualname)?, h.u64(c.filename)?];
    let table_ptr = h.u64(c.linetable)?;
    let first_line = h.i32(c.firstlineno)?;

    // Round 2: the three string headers and the bytes header, in one syscall.
    let uhdr = (layout.unicode.compact_size + 8) as usize;
    let bhdr = layout.bytes.ob_sval as usize;
    let mut bufs = [
        vec![0u8; uhdr],
        vec![0u8; uhdr],
        vec![0u8; uhdr],
        vec![0u8; bhdr],
    ];
    {
        let [a, b, d, t] = &mut bufs;
        let mut reqs = [
            ReadRequest::new(ptrs[0], a),
            ReadRequest::new(ptrs[1], b),
            ReadRequest::new(ptrs[2], d),
            ReadRequest::new(table_ptr, t),
        ];
        mem.read_many(&mut reqs).map_err(|(_, e)| e)?;
    }
    let strs = [
        unicode_header(layout, ptrs[0], &bufs[0])?,
        unicode_header(layout, ptrs[1], &bufs[1])?,
        unicode_header(layout, ptrs[2], &bufs[2])?,
    ];
    let table_len = Bytes(&bufs[3]).i64(layout.bytes.ob_size)?;
    if table_len < 0 || table_len as usize > MAX_LINETABLE_LEN {
        return Err(UnwindError::BadObject {
            addr: table_ptr,
            what: "line table: absurd length".into(),
        });
    }

    // Round 3: the characters and the table, in one syscall.
    let mut data: Vec<Vec<u8>> = strs
        .iter()
        .map(|s| vec![0u8; s.chars * usize::from(s.kind)])
        .chain(std::iter::once(vec![0u8; table_len as usize]))
        .collect();
    let addrs = [
        strs[0].addr,
        strs[1].addr,
        strs[2].addr,
        table_ptr.wrapping_add(layout.bytes.ob_sval),
    ];
    {
        let mut reqs: Vec<ReadRequest<'_>> = data
            .iter_mut()
            .zip(addrs)
            .filter(|(buf, _)| !buf.is_empty())
            .map(|(buf, a)| ReadRequest::new(a, buf))
            .collect();
        mem.read_many(&mut reqs).map_err(|(_, e)| e)?;
    }
    Ok(CodeInfo {
        name: decode_str(strs[0].kind, &data[0]),
        qualname: decode_str(strs[1].kind, &data[1]),
        filename: decode_str(strs[2].kind, &data[2]),
        first_line,
        lines: linetable::decode(&data[3], first_line),
    })
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
