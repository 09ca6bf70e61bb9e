//! Decoding CPython's location table (`co_linetable`, 3.11+) into line numbers.
//!
//! Format (CPython's Objects/locations.md): a sequence of entries; the first byte of each
//! entry has bit 7 set, bits 3-6 hold a code, bits 0-2 hold the number of code units covered
//! minus one. Codes 0-9 are "short" forms (same line), 10-12 are one-line forms (line delta
//! 0, 1, 2), 13 has no column information (line delta as a signed varint), 14 is the long form
//! (line delta signed varint, then end line, columns), 15 means "no location" (no line).
//! Varints are little-endian 6-bit groups with bit 6 as continuation; signed varints keep the
//! sign in bit 0. The line starts at `co_firstlineno` and accumulates the deltas.
//!
//! Target memory is hostile: a truncated or garbage table ends the decoding, never panics.

/// One address range of a location table: code-unit bytes `[start, end)` and their line
/// (`None` for entries without a line).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LineRange {
    pub start: u32,
    pub end: u32,
    pub line: Option<i32>,
}

/// Code unit size in bytes (`sizeof(_Py_CODEUNIT)`).
const CODE_UNIT: u32 = 2;
/// Most ranges decoded from one table (a line of code is one range or a few).
pub const MAX_LINE_RANGES: usize = 32 << 10;
/// Tables longer than this are not believed (real ones are a few KiB at most).
pub const MAX_LINETABLE_LEN: usize = 1 << 22;

struct Reader<'a> {
    data: &'a [u8],
    pos: usize,
}

impl Reader<'_> {
    fn byte(&mut self) -> Option<u8> {
        let b = *self.data.get(self.pos)?;
        self.pos += 1;
        Some(b)
    }
    fn varint(&mut self) -> Option<u32> {
        let mut b = self.byte()?;
        let mut val = u32::from(b & 63);
        let mut shift = 0u32;
        while b & 64 != 0 {
            b = self.byte()?;
            shift += 6;
            if shift > 30 {
                return None;
            }
            val |= u32::from(b & 63) << shift;
        }
        Some(val)
    }
    fn svarint(&mut self) -> Option<i32> {
        let v = self.varint()?;
        let mag = (v >> 1) as i32;
        Some(if v & 1 != 0 { -mag } else { mag })
    }
}

/// Decodes the whole table into ranges. Stops quietly at the first malformed entry: the
/// ranges before it are still right.
pub fn decode(table: &[u8], first_line: i32) -> Vec<LineRange> {
    let mut out: Vec<LineRange> = Vec::new();
    let mut r = Reader {
        data: table,
        pos: 0,
    };
    let mut line = first_line;
    let mut addr = 0u32;
    while let Some(first) = r.byte() {
        if first & 0x80 == 0 {
            break; // not at an entry start: garbage
        }
        let code = (first >> 3) & 15;
        let units = u32::from(first & 7) + 1;
        let delta = match code {
            15 => Some(0),
            13 | 14 => r.svarint(),
            10..=12 => Some(i32::from(code) - 10),
            _ => Some(0),
        };
        let Some(delta) = delta else { break };
        line = line.wrapping_add(delta);
        let end = addr.saturating_add(units * CODE_UNIT);
        let line = (code != 15).then_some(line);
        // Adjacent ranges of one line are one range (most lines have several entries).
        let full = out.len() >= MAX_LINE_RANGES;
        match out.last_mut() {
            Some(last) if last.line == line && last.end == addr => last.end = end,
            // Past the bound, lines are unknown: pyfleet's memory, not the target's table.
            _ if full => break,
            _ => out.push(LineRange {
                start: addr,
                end,
                line,
            }),
        }
        addr = end;
        // Skip the rest of the entry (end line, columns): up to the next byte with bit 7 set.
        while r.data.get(r.pos).is_some_and(|b| b & 0x80 == 0) {
            r.pos += 1;
        }
    }
    out
}

/// The line for a byte offset into the code (`instruction address - start of code`), as
/// CPython's `PyCode_Addr2Line` gives it: a negative offset (before the first instruction)
/// means the first line; an offset past the table, or an entry without a line, means `None`.
pub fn line_for_offset(ranges: &[LineRange], first_line: i32, offset: i64) -> Option<i32> {
    if offset < 0 {
        return Some(first_line);
    }
    let offset = u32::try_from(offset).ok()?;
    let i = ranges.partition_point(|r| r.end <= offset);
    let r = ranges.get(i)?;
    (r.start <= offset).then_some(r.line).flatten()
}

#[cfg(test)]
mod tests {
    use super::*;

    /// (linetable, firstlineno, co_lines()) captured from real interpreters with
    /// `list(f.__code__.co_lines())`; see the comment on each.
    struct Vector {
        table: &'static [u8],
        first: i32,
        lines: &'static [(u32, u32, Option<i32>)],
    }

    fn check(v: &Vector) {
        let got = decode(v.table, v.first);
        let got: Vec<_> = got.iter().map(|r| (r.start, r.end, r.line)).collect();
        // Some versions' co_lines() merge adjacent ranges with the same line: compare merged.
        assert_eq!(merge(&got), merge(v.lines));
    }

    fn merge(ranges: &[(u32, u32, Option<i32>)]) -> Vec<(u32, u32, Option<i32>)> {
        let mut merged: Vec<(u32, u32, Option<i32>)> = Vec::new();
        for &(s, e, l) in ranges {
            match merged.last_mut() {
                Some(last) if last.2 == l && last.1 == s => last.1 = e,
                _ => merged.push((s, e, l)),
            }
        }
        merged
    }

    include!("linetable_vectors.rs");

    #[test]
    fn decodes_real_tables() {
        for v in VECTORS {
            check(v);
        }
    }

    #[test]
    fn lookups_follow_addr2line() {
        // 3 units on the first line, 1 unit with no line, 2 units two lines later.
        let t = [
            0x80 | (10 << 3) | 2,
            0,
            0,
            0x80 | (15 << 3),
            0x80 | (12 << 3) | 1,
            0,
            0,
        ];
        let r = decode(&t, 7);
        assert_eq!(line_for_offset(&r, 7, -2), Some(7));
        assert_eq!(line_for_offset(&r, 7, 0), Some(7));
        assert_eq!(line_for_offset(&r, 7, 5), Some(7));
        assert_eq!(line_for_offset(&r, 7, 6), None);
        assert_eq!(line_for_offset(&r, 7, 8), Some(9));
        assert_eq!(line_for_offset(&r, 7, 11), Some(9));
        assert_eq!(line_for_offset(&r, 7, 12), None);
    }

    #[test]
    fn garbage_never_panics() {
        let mut seed = 0x1234_5678_u32;
        for len in 0..300 {
            let t: Vec<u8> = (0..len)
                .map(|_| {
                    seed ^= seed << 13;
                    seed ^= seed >> 17;
                    seed ^= seed << 5;
                    seed as u8
                })
                .collect();
            let r = decode(&t, i32::MAX - 3);
            assert!(r.len() <= t.len());
            let _ = line_for_offset(&r, 1, i64::from(seed));
        }
        // A varint that never ends.
        assert!(decode(
            &[0x80 | (13 << 3), 0x7f, 0x7f, 0x7f, 0x7f, 0x7f, 0x7f, 0x7f],
            1
        )
        .is_empty());
    }
}
