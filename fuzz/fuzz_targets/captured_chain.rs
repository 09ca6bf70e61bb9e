//! The kernel capture's decoder over hostile records: a chain the model of the BPF program
//! copied of the synthetic 3.13 runtime's threads (`cpython::synthetic::captured_record`),
//! then cut short and overwritten at places the input chooses (frame addresses, the bytes of
//! each frame, fingerprints, counts and flags of the head), parsed as the ring's records are
//! and decoded as a captured sample. Every record is a stack, a counted failure or refused
//! whole, never a panic.
//!
//! Input: one byte choosing how many bytes to cut off the record's end (0-255), then records
//! of 2 bytes of offset (little-endian, into the record) and 8 bytes to write there.
#![no_main]
use libfuzzer_sys::fuzz_target;
use pyfleet::cpython::synthetic::{captured_record, runtime, unwinder};
use pyfleet::memory::capture_records::CapturedRecord;

fuzz_target!(|data: &[u8]| {
    let Some((&cut, edits)) = data.split_first() else {
        return;
    };
    let (img, _) = runtime();
    let mut u = unwinder(img);
    if u.sample().is_err() {
        return;
    }
    for t in u.captured_threads() {
        let mut bytes = captured_record(u.memory(), u.capture_layout(), 0, t.tid as u32, t.tstate);
        for edit in edits.chunks_exact(10) {
            let at = usize::from(u16::from_le_bytes([edit[0], edit[1]]));
            if let Some(place) = bytes.get_mut(at..at + 8) {
                place.copy_from_slice(&edit[2..10]);
            }
        }
        bytes.truncate(bytes.len().saturating_sub(usize::from(cut)));
        let Some(record) = CapturedRecord::parse(&bytes) else {
            continue;
        };
        let _ = record.unreadable();
        let (collecting, holds_gil) = (record.collecting, record.holds_gil());
        let truncated = record.truncated();
        if let Ok(sample) = u.sample_captured(t, record.frames(), truncated, collecting, holds_gil)
        {
            let _ = u.stacks().resolve(sample.stack).map(Iterator::count);
        }
    }
});
