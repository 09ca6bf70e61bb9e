//! The sampler over a mutated image of a live runtime: the synthetic 3.13 runtime of
//! `cpython::synthetic` (one interpreter, two threads, shims, code objects), overwritten at
//! places the input chooses. Every sample is a stack or an error, never a panic.
//!
//! Input: records of 2 bytes of offset (little-endian, in units of 8 bytes into the heap)
//! and 8 bytes to write there.
#![no_main]
use libfuzzer_sys::fuzz_target;
use pyfleet::cpython::synthetic::{runtime, unwinder, HEAP, HEAP_SIZE};

fuzz_target!(|data: &[u8]| {
    let (img, _) = runtime();
    for rec in data.chunks_exact(10) {
        let off = u64::from(u16::from_le_bytes([rec[0], rec[1]])) * 8;
        if off + 8 <= HEAP_SIZE as u64 {
            img.poke(HEAP + off, &rec[2..10]);
        }
    }
    let mut u = unwinder(img);
    for _ in 0..3 {
        if let Ok(samples) = u.sample() {
            let stacks: Vec<u32> = samples.iter().map(|t| t.stack).collect();
            for id in stacks {
                let _ = u.stacks().resolve(id).map(Iterator::count);
            }
        }
    }
});
