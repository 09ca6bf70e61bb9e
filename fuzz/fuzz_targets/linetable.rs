//! The location-table decoder over arbitrary bytes: never panics, never more ranges than the
//! bound, ranges in order.
#![no_main]
use libfuzzer_sys::fuzz_target;
use pyfleet::cpython::linetable::{decode, line_for_offset, MAX_LINE_RANGES};

fuzz_target!(|data: &[u8]| {
    let (first, table) = match data.split_first_chunk::<4>() {
        Some((f, t)) => (i32::from_le_bytes(*f), t),
        None => (1, data),
    };
    let ranges = decode(table, first);
    assert!(ranges.len() <= MAX_LINE_RANGES);
    for pair in ranges.windows(2) {
        assert!(pair[0].end <= pair[1].start);
    }
    for offset in [-1i64, 0, 1, 2, 100, i64::from(u32::MAX) + 1] {
        let _ = line_for_offset(&ranges, first, offset);
    }
});
