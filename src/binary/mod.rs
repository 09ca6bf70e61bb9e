//! Finding `_PyRuntime` in a target: which mapped file holds it (the executable for statically
//! linked interpreters like Debian's, or libpython for shared builds like pyenv's), where it is
//! in that file (the `_PyRuntime` symbol, or the `PyRuntime` section of 3.13+), and the load
//! bias that turns file addresses into target addresses.
//!
//! Reads ELF files through `process` (via /proc/PID/root); never reads target memory.

use crate::process::{Mapping, Process, ProcessError};
use goblin::elf::{program_header::PT_LOAD, Elf};
use std::io::Read;
use std::path::{Path, PathBuf};

/// Files bigger than this are not read (no real libpython is near it).
const MAX_ELF_SIZE: u64 = 1 << 30;

#[derive(Debug, thiserror::Error)]
pub enum BinaryError {
    #[error(transparent)]
    Process(#[from] ProcessError),
    #[error("process {0} is not a Python process (no _PyRuntime in its executable or libraries)")]
    NotPython(i32),
    #[error("cannot read {path}: {msg}")]
    BadElf { path: PathBuf, msg: String },
}

/// Where CPython's globals are, in one mapped ELF file (addresses are file vaddrs, unbiased).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PythonSymbols {
    pub runtime: u64,
    /// `Py_Version` (3.11+): PY_VERSION_HEX as an `unsigned long`.
    pub py_version: Option<u64>,
    /// `PyCode_Type`: lets the unwinder check that a frame's executable is a code object.
    pub code_type: Option<u64>,
    /// Lowest PT_LOAD segment: (p_vaddr, p_offset), for the load bias.
    pub first_load: (u64, u64),
}

impl PythonSymbols {
    /// Reads symbols from an ELF image; `Ok(None)` when it holds no `_PyRuntime`.
    pub fn from_elf(data: &[u8]) -> Result<Option<Self>, String> {
        let elf = Elf::parse(data).map_err(|e| e.to_string())?;
        let mut runtime = None;
        let mut py_version = None;
        let mut code_type = None;
        let tables = [(&elf.dynsyms, &elf.dynstrtab), (&elf.syms, &elf.strtab)];
        for (syms, strtab) in tables {
            for sym in syms.iter() {
                if sym.st_value == 0 {
                    continue;
                }
                match strtab.get_at(sym.st_name) {
                    Some("_PyRuntime") => runtime = runtime.or(Some(sym.st_value)),
                    Some("Py_Version") => py_version = py_version.or(Some(sym.st_value)),
                    Some("PyCode_Type") => code_type = code_type.or(Some(sym.st_value)),
                    _ => {}
                }
            }
        }
        if runtime.is_none() {
            // 3.13+ place _PyRuntime in its own section so that it can be found without symbols.
            runtime = elf
                .section_headers
                .iter()
                .find(|sh| {
                    matches!(
                        elf.shdr_strtab.get_at(sh.sh_name),
                        Some(".PyRuntime") | Some("PyRuntime")
                    )
                })
                .map(|sh| sh.sh_addr);
        }
        let Some(runtime) = runtime else {
            return Ok(None);
        };
        let first_load = elf
            .program_headers
            .iter()
            .filter(|ph| ph.p_type == PT_LOAD)
            .min_by_key(|ph| ph.p_vaddr)
            .map(|ph| (ph.p_vaddr, ph.p_offset))
            .ok_or("no PT_LOAD segment")?;
        Ok(Some(PythonSymbols {
            runtime,
            py_version,
            code_type,
            first_load,
        }))
    }
}

/// `_PyRuntime` located in a live target.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RuntimeLocation {
    /// The file that holds it, as the target sees it.
    pub path: PathBuf,
    /// Load bias: target address = file vaddr + bias.
    pub bias: u64,
    /// Target address of `_PyRuntime`.
    pub runtime: u64,
    /// Target address of `Py_Version`, when the file has it (3.11+).
    pub py_version: Option<u64>,
    /// Target address of `PyCode_Type`.
    pub code_type: Option<u64>,
    /// (major, minor) read from the file name (`libpython3.12.so`, `python3.11`), if any.
    pub name_version: Option<(u32, u32)>,
}

/// The load bias of a file mapped by `maps` (the file's mappings), from its first PT_LOAD.
pub fn load_bias(maps: &[&Mapping], first_load: (u64, u64)) -> Option<u64> {
    let (vaddr, offset) = first_load;
    // The mapping of the page that holds the segment's first byte.
    let page_off = offset & !0xfff;
    let m = maps.iter().find(|m| m.offset == page_off)?;
    Some(
        m.start
            .wrapping_sub(page_off)
            .wrapping_sub(vaddr.wrapping_sub(offset)),
    )
}

/// "python3.12", "libpython3.12.so.1.0", "libpython3.13t.so" -> (3, 12)...
pub fn version_from_name(path: &Path) -> Option<(u32, u32)> {
    let name = path.file_name()?.to_str()?;
    let at = name.find("python")? + "python".len();
    let rest = &name[at..];
    let mut parts = rest.splitn(2, '.');
    let major: u32 = parts.next()?.parse().ok()?;
    let minor_str: String = parts
        .next()?
        .chars()
        .take_while(|c| c.is_ascii_digit())
        .collect();
    Some((major, minor_str.parse().ok()?))
}

fn read_file(process: &Process, path: &Path) -> Result<Vec<u8>, BinaryError> {
    let mut f = process.open_file(path)?;
    let len = f.metadata().map(|m| m.len()).unwrap_or(0);
    if len > MAX_ELF_SIZE {
        return Err(BinaryError::BadElf {
            path: path.to_path_buf(),
            msg: format!("file too large ({len} bytes)"),
        });
    }
    let mut data = Vec::with_capacity(len as usize);
    f.read_to_end(&mut data).map_err(|e| BinaryError::BadElf {
        path: path.to_path_buf(),
        msg: e.to_string(),
    })?;
    Ok(data)
}

/// Whether a mapped file could hold CPython's runtime: libpython, or the executable.
fn is_candidate(path: &Path, exe: Option<&Path>) -> bool {
    let is_lib = path
        .file_name()
        .and_then(|n| n.to_str())
        .is_some_and(|n| n.starts_with("libpython") && n.contains(".so"));
    is_lib || Some(path) == exe
}

/// Finds `_PyRuntime` in a live process: libpython first, then the executable.
pub fn locate_runtime(process: &Process) -> Result<RuntimeLocation, BinaryError> {
    let maps = process.file_mappings()?;
    let exe = process.exe().ok();
    let mut candidates: Vec<&Path> = Vec::new();
    for m in &maps {
        if is_candidate(&m.path, exe.as_deref()) && !candidates.contains(&m.path.as_path()) {
            candidates.push(&m.path);
        }
    }
    // Libraries before the executable: an embedding program is not itself Python.
    candidates.sort_by_key(|p| Some(*p) == exe.as_deref());
    let mut name_version = None;
    for path in candidates {
        name_version = name_version.or(version_from_name(path));
        let data = read_file(process, path)?;
        let syms = PythonSymbols::from_elf(&data).map_err(|msg| BinaryError::BadElf {
            path: path.to_path_buf(),
            msg,
        })?;
        let Some(syms) = syms else { continue };
        let file_maps: Vec<&Mapping> = maps.iter().filter(|m| m.path == path).collect();
        let bias = load_bias(&file_maps, syms.first_load).ok_or_else(|| BinaryError::BadElf {
            path: path.to_path_buf(),
            msg: "its first segment is not mapped".into(),
        })?;
        return Ok(RuntimeLocation {
            path: path.to_path_buf(),
            bias,
            runtime: syms.runtime.wrapping_add(bias),
            py_version: syms.py_version.map(|a| a.wrapping_add(bias)),
            code_type: syms.code_type.map(|a| a.wrapping_add(bias)),
            name_version: version_from_name(path).or(name_version),
        });
    }
    Err(BinaryError::NotPython(process.pid()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn versions_from_file_names() {
        assert_eq!(
            version_from_name(Path::new("/usr/bin/python3.11")),
            Some((3, 11))
        );
        assert_eq!(
            version_from_name(Path::new("/x/lib/libpython3.12.so.1.0")),
            Some((3, 12))
        );
        assert_eq!(
            version_from_name(Path::new("libpython3.13t.so")),
            Some((3, 13))
        );
        assert_eq!(version_from_name(Path::new("/usr/bin/python3")), None);
        assert_eq!(version_from_name(Path::new("/bin/sleep")), None);
    }

    #[test]
    fn bias_of_pie_and_fixed_binaries() {
        let m = |start, offset| Mapping {
            start,
            end: start + 0x1000,
            offset,
            dev: (0, 0),
            inode: 1,
            path: PathBuf::from("/x"),
        };
        let (a, b) = (m(0x7f00_0000_0000, 0), m(0x7f00_0000_1000, 0x1000));
        assert_eq!(load_bias(&[&a, &b], (0, 0)), Some(0x7f00_0000_0000));
        let fixed = m(0x40_0000, 0);
        assert_eq!(load_bias(&[&fixed], (0x40_0000, 0)), Some(0));
        assert_eq!(load_bias(&[&b], (0, 0)), None);
    }

    #[test]
    fn garbage_elf_is_an_error_not_a_panic() {
        assert!(PythonSymbols::from_elf(b"\x7fELF\x02\x01\x01garbage").is_err());
        assert!(PythonSymbols::from_elf(&[]).is_err());
    }
}
