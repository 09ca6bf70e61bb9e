//! `_Py_DebugOffsets` as a target could lay it out: the synthetic runtime's table (a sound
//! one), overwritten where the input says. Parsing and building a layout is an error or a
//! layout whose spans are bounded, never a panic.
//!
//! Input: records of 1 byte of field index and 8 bytes of value.
#![no_main]
use libfuzzer_sys::fuzz_target;
use pyfleet::cpython::debug_offsets::{build, DebugOffsets, FIELDS_313};
use pyfleet::cpython::synthetic::{offsets, raw_offsets};
use pyfleet::cpython::Version;

fuzz_target!(|data: &[u8]| {
    let mut raw = raw_offsets(&offsets());
    for rec in data.chunks_exact(9) {
        let at = usize::from(rec[0]) % FIELDS_313.len() * 8;
        raw[at..at + 8].copy_from_slice(&rec[1..9]);
    }
    let Ok(d) = DebugOffsets::parse(FIELDS_313, &raw) else {
        return;
    };
    for minor in 13..=15 {
        if let Ok(layout) = build(&d, Version::from_hex(0x0300_00f0 | (minor << 16))) {
            assert!(layout.tstate.size <= 16 << 10);
            assert!(layout.frame.size <= 256);
            assert!(layout.code.size <= 16 << 10);
        }
    }
});
