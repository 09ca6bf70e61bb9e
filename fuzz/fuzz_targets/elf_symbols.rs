//! The ELF symbol lookup over any file: an error or symbols, never a panic, and bounded reads.
#![no_main]
use libfuzzer_sys::fuzz_target;
use pyfleet::binary::PythonSymbols;

fuzz_target!(|data: &[u8]| {
    let _ = PythonSymbols::from_elf(data);
});
