//! Finding `_PyRuntime` in a target: which mapped file holds it (the executable for statically
//! linked interpreters like Debian's, or libpython for shared builds like pyenv's), where it is
//! in that file (the `_PyRuntime` symbol, or the `PyRuntime` section of 3.13+), and the load
//! bias that turns file addresses into target addresses.
//!
//! Reads ELF files as `process` opens them (the mapped file itself); never reads target
//! memory. Reads are bounded: headers, then only symbol and string tables of at most
//! [`MAX_TABLE_SIZE`] bytes each, [`MAX_ELF_READ`] in all; the cache's lock is never held
//! while a file is read.

use crate::process::{Mapping, Process, ProcessError};
use goblin::container::Ctx;
use goblin::elf::section_header::{SHT_DYNSYM, SHT_SYMTAB};
use goblin::elf::sym::Symtab;
use goblin::elf::{program_header::PT_LOAD, Elf, ProgramHeader, SectionHeader, Sym};
use goblin::strtab::Strtab;
use std::collections::HashMap;
use std::io::{Read, Seek, SeekFrom};
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::sync::Mutex;

/// Largest ELF table read (symbol tables of a libpython with debug info are ~1 MiB).
const MAX_TABLE_SIZE: u64 = 16 << 20;
/// Most bytes read from one ELF file.
const MAX_ELF_READ: u64 = 64 << 20;
/// Files whose symbols are remembered (one entry per distinct interpreter binary on the host).
const MAX_CACHED_FILES: usize = 256;

#[derive(Debug, thiserror::Error)]
pub enum BinaryError {
    #[error(transparent)]
    Process(#[from] ProcessError),
    #[error("process {0} is not a Python process (no _PyRuntime in its executable or libraries)")]
    NotPython(i32),
    #[error("cannot read {path}: {msg}")]
    BadElf { path: PathBuf, msg: String },
}

impl BinaryError {
    /// Whether the process, or its files, refused to be read (no privilege over it).
    pub fn is_permission_denied(&self) -> bool {
        matches!(self, BinaryError::Process(e) if e.is_permission_denied())
    }
}

/// Where CPython's globals are, in one mapped ELF file (addresses are file vaddrs, unbiased).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PythonSymbols {
    pub runtime: u64,
    /// `Py_Version` (3.11+): PY_VERSION_HEX as an `unsigned long`.
    pub py_version: Option<u64>,
    /// `PyCode_Type`: lets the unwinder check that a frame's executable is a code object.
    pub code_type: Option<u64>,
    /// The interpreter's own types whose objects `dump --locals` shows by value.
    pub builtin_types: BuiltinTypes,
    /// Lowest PT_LOAD segment: (p_vaddr, p_offset), for the load bias.
    pub first_load: (u64, u64),
}

/// Addresses of the interpreter's own type objects (exported from 3.11 on) whose objects
/// are read as values: an object is of one of these types exactly when its `ob_type` is the
/// address (a class of the program named like one is another type object).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct BuiltinTypes {
    pub none: Option<u64>,
    pub bool_: Option<u64>,
    pub int: Option<u64>,
    pub float: Option<u64>,
    pub str_: Option<u64>,
    pub bytes: Option<u64>,
    pub tuple: Option<u64>,
    pub list: Option<u64>,
    pub dict: Option<u64>,
    pub cell: Option<u64>,
}

impl BuiltinTypes {
    /// Records `name` at `addr` if it is one of the types (the first address seen wins).
    fn note(&mut self, name: &str, addr: u64) {
        let slot = match name {
            "_PyNone_Type" => &mut self.none,
            "PyBool_Type" => &mut self.bool_,
            "PyLong_Type" => &mut self.int,
            "PyFloat_Type" => &mut self.float,
            "PyUnicode_Type" => &mut self.str_,
            "PyBytes_Type" => &mut self.bytes,
            "PyTuple_Type" => &mut self.tuple,
            "PyList_Type" => &mut self.list,
            "PyDict_Type" => &mut self.dict,
            "PyCell_Type" => &mut self.cell,
            _ => return,
        };
        *slot = slot.or(Some(addr));
    }

    fn all(&self) -> [Option<u64>; 10] {
        [
            self.none, self.bool_, self.int, self.float, self.str_, self.bytes, self.tuple,
            self.list, self.dict, self.cell,
        ]
    }

    fn complete(&self) -> bool {
        self.all().iter().all(Option::is_some)
    }

    /// The same types where the file is loaded at `bias`.
    pub fn biased(&self, bias: u64) -> BuiltinTypes {
        let b = |a: Option<u64>| a.map(|a| a.wrapping_add(bias));
        BuiltinTypes {
            none: b(self.none),
            bool_: b(self.bool_),
            int: b(self.int),
            float: b(self.float),
            str_: b(self.str_),
            bytes: b(self.bytes),
            tuple: b(self.tuple),
            list: b(self.list),
            dict: b(self.dict),
            cell: b(self.cell),
        }
    }
}

impl PythonSymbols {
    /// Reads symbols from an ELF image in memory; `Ok(None)` when it holds no `_PyRuntime`.
    pub fn from_elf(data: &[u8]) -> Result<Option<Self>, String> {
        Self::from_reader(&mut std::io::Cursor::new(data))
    }

    /// Reads symbols from an ELF file, reading only its headers, section headers and symbol
    /// and string tables (a few hundred KiB of a 30 MiB libpython with debug info), so that
    /// attaching to many processes costs neither time nor memory.
    pub fn from_reader<R: Read + Seek>(f: &mut R) -> Result<Option<Self>, String> {
        let mut budget = MAX_ELF_READ;
        let elf = ElfHeaders::read(f, &mut budget)?;
        let (ctx, sections) = (elf.ctx, &elf.sections);
        let section = |i: usize| sections.get(i);
        let read_section = |f: &mut R, budget: &mut u64, sh: &SectionHeader| {
            read_at(
                f,
                budget,
                sh.sh_offset,
                usize::try_from(sh.sh_size).unwrap_or(usize::MAX),
            )
        };

        let mut runtime = None;
        let mut py_version = None;
        let mut code_type = None;
        let mut builtin_types = BuiltinTypes::default();
        // The dynamic symbols first (small, and they export all of these from 3.11 on); the
        // full symbol table only for what they lack.
        for kind in [SHT_DYNSYM, SHT_SYMTAB] {
            for sh in sections.iter().filter(|sh| sh.sh_type == kind) {
                if runtime.is_some()
                    && py_version.is_some()
                    && code_type.is_some()
                    && builtin_types.complete()
                {
                    break;
                }
                let Some(str_sh) = section(sh.sh_link as usize) else {
                    continue;
                };
                let syms_data = read_section(f, &mut budget, sh)?;
                let str_data = read_section(f, &mut budget, str_sh)?;
                let count = syms_data.len() / Sym::size(ctx.container);
                let syms = Symtab::parse(&syms_data, 0, count, ctx).map_err(|e| e.to_string())?;
                let strtab =
                    Strtab::parse(&str_data, 0, str_data.len(), 0).map_err(|e| e.to_string())?;
                for sym in syms.iter() {
                    if sym.st_value == 0 {
                        continue;
                    }
                    match strtab.get_at(sym.st_name) {
                        Some("_PyRuntime") => runtime = runtime.or(Some(sym.st_value)),
                        Some("Py_Version") => py_version = py_version.or(Some(sym.st_value)),
                        Some("PyCode_Type") => code_type = code_type.or(Some(sym.st_value)),
                        Some(name) => builtin_types.note(name, sym.st_value),
                        None => {}
                    }
                }
            }
        }
        if runtime.is_none() {
            // 3.13+ place _PyRuntime in its own section so that it can be found without symbols.
            runtime = elf
                .section_named(f, &mut budget, &[".PyRuntime", "PyRuntime"])?
                .map(|sh| sh.sh_addr);
        }
        let Some(runtime) = runtime else {
            return Ok(None);
        };
        let first_load = elf.first_load()?;
        Ok(Some(PythonSymbols {
            runtime,
            py_version,
            code_type,
            builtin_types,
            first_load,
        }))
    }
}

/// An ELF file's header, program headers and section headers, read with a budget.
struct ElfHeaders {
    ctx: Ctx,
    shstrndx: usize,
    program_headers: Vec<ProgramHeader>,
    sections: Vec<SectionHeader>,
}

impl ElfHeaders {
    fn read<R: Read + Seek>(f: &mut R, budget: &mut u64) -> Result<ElfHeaders, String> {
        let mut ident = [0u8; 64];
        f.seek(SeekFrom::Start(0))
            .map_err(|e| format!("not an ELF file: {e}"))?;
        f.read_exact(&mut ident)
            .map_err(|e| format!("not an ELF file: {e}"))?;
        let header = Elf::parse_header(&ident).map_err(|e| e.to_string())?;
        let ctx = Ctx::new(
            header.container().map_err(|e| e.to_string())?,
            header.endianness().map_err(|e| e.to_string())?,
        );
        let phdrs = read_at(
            f,
            budget,
            header.e_phoff,
            ProgramHeader::size(ctx) * usize::from(header.e_phnum),
        )?;
        let program_headers = ProgramHeader::parse(&phdrs, 0, usize::from(header.e_phnum), ctx)
            .map_err(|e| e.to_string())?;
        let shdrs = read_at(
            f,
            budget,
            header.e_shoff,
            SectionHeader::size(ctx) * usize::from(header.e_shnum),
        )?;
        let sections = if header.e_shoff == 0 || header.e_shnum == 0 {
            Vec::new()
        } else {
            SectionHeader::parse_from(&shdrs, 0, usize::from(header.e_shnum), ctx)
                .map_err(|e| e.to_string())?
        };
        Ok(ElfHeaders {
            ctx,
            shstrndx: usize::from(header.e_shstrndx),
            program_headers,
            sections,
        })
    }

    /// The first section named one of `names`.
    fn section_named<R: Read + Seek>(
        &self,
        f: &mut R,
        budget: &mut u64,
        names: &[&str],
    ) -> Result<Option<&SectionHeader>, String> {
        let Some(names_sh) = self.sections.get(self.shstrndx) else {
            return Ok(None);
        };
        let data = read_at(
            f,
            budget,
            names_sh.sh_offset,
            usize::try_from(names_sh.sh_size).unwrap_or(usize::MAX),
        )?;
        let strtab = Strtab::parse(&data, 0, data.len(), 0).map_err(|e| e.to_string())?;
        Ok(self.sections.iter().find(|sh| {
            strtab
                .get_at(sh.sh_name)
                .is_some_and(|n| names.contains(&n))
        }))
    }

    /// The lowest PT_LOAD segment: (p_vaddr, p_offset).
    fn first_load(&self) -> Result<(u64, u64), String> {
        self.program_headers
            .iter()
            .filter(|ph| ph.p_type == PT_LOAD)
            .min_by_key(|ph| ph.p_vaddr)
            .map(|ph| (ph.p_vaddr, ph.p_offset))
            .ok_or_else(|| "no PT_LOAD segment".to_string())
    }
}

/// A section's file address, with the file's lowest PT_LOAD segment (p_vaddr, p_offset)
/// for its load bias.
struct SectionAt {
    addr: u64,
    first_load: (u64, u64),
}

/// Where the section named one of `names` is in an ELF file; `None` when it has none.
fn section_address<R: Read + Seek>(f: &mut R, names: &[&str]) -> Result<Option<SectionAt>, String> {
    let mut budget = MAX_ELF_READ;
    let elf = ElfHeaders::read(f, &mut budget)?;
    let Some(addr) = elf
        .section_named(f, &mut budget, names)?
        .map(|sh| sh.sh_addr)
    else {
        return Ok(None);
    };
    Ok(Some(SectionAt {
        addr,
        first_load: elf.first_load()?,
    }))
}

/// The target address of the section named one of `names` in the first file mapped by
/// `process` that `wanted` accepts (by its path) and that has the section.
pub fn locate_section(
    process: &Process,
    names: &[&str],
    wanted: impl Fn(&Path) -> bool,
) -> Result<Option<u64>, BinaryError> {
    let maps = process.file_mappings()?;
    let mut tried: Vec<&Path> = Vec::new();
    for first in &maps {
        let path = first.path.as_path();
        if tried.contains(&path) || !wanted(path) {
            continue;
        }
        tried.push(path);
        let bad = |msg: String| BinaryError::BadElf {
            path: path.to_path_buf(),
            msg,
        };
        let mut f = std::io::BufReader::new(process.open_mapped(first)?);
        let Some(at) = section_address(&mut f, names).map_err(bad)? else {
            continue;
        };
        let file_maps: Vec<&Mapping> = maps.iter().filter(|m| m.path == path).collect();
        let bias = load_bias(&file_maps, at.first_load)
            .ok_or_else(|| bad("its first segment is not mapped".into()))?;
        return Ok(Some(at.addr.wrapping_add(bias)));
    }
    Ok(None)
}

/// Reads `len` bytes at `offset` of `f`, out of `budget` (bounded: ELF sizes are the file's,
/// untrusted).
fn read_at<R: Read + Seek>(
    f: &mut R,
    budget: &mut u64,
    offset: u64,
    len: usize,
) -> Result<Vec<u8>, String> {
    if len as u64 > MAX_TABLE_SIZE {
        return Err(format!("ELF table of {len} bytes is too large"));
    }
    *budget = budget
        .checked_sub(len as u64)
        .ok_or_else(|| format!("ELF tables larger than {MAX_ELF_READ} bytes in all"))?;
    f.seek(SeekFrom::Start(offset))
        .map_err(|e| format!("seek to {offset:#x}: {e}"))?;
    let mut data = vec![0u8; len];
    f.read_exact(&mut data)
        .map_err(|e| format!("reading {len} bytes at {offset:#x}: {e}"))?;
    Ok(data)
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
    /// Target addresses of the types `dump --locals` reads by value.
    pub builtin_types: BuiltinTypes,
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

/// Symbols of each file already read, by (device, inode, size, mtime): the interpreters of a
/// fleet share a handful of binaries, read once each (two probes of a new one at the same
/// time may both read it).
static SYMBOLS: Mutex<Option<HashMap<FileKey, Option<PythonSymbols>>>> = Mutex::new(None);

/// A file's identity: device, inode, size, modification time.
type FileKey = (u64, u64, u64, i64);

/// The Python symbols of the file a target mapped at `m`, cached.
fn symbols_of(process: &Process, m: &Mapping) -> Result<Option<PythonSymbols>, BinaryError> {
    let bad = |msg: String| BinaryError::BadElf {
        path: m.path.clone(),
        msg,
    };
    let mut f = process.open_mapped(m)?;
    let meta = f.metadata().map_err(|e| bad(e.to_string()))?;
    let key = (meta.dev(), meta.ino(), meta.len(), meta.mtime());
    let cached = |key: &FileKey| {
        let mut cache = SYMBOLS
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner());
        cache.get_or_insert_with(HashMap::new).get(key).cloned()
    };
    if let Some(found) = cached(&key) {
        return Ok(found);
    }
    let mut reader = std::io::BufReader::new(&mut f);
    let syms = PythonSymbols::from_reader(&mut reader).map_err(bad)?;
    let mut cache = SYMBOLS
        .lock()
        .unwrap_or_else(|poisoned| poisoned.into_inner());
    let cache = cache.get_or_insert_with(HashMap::new);
    if cache.len() >= MAX_CACHED_FILES {
        cache.clear();
    }
    cache.insert(key, syms.clone());
    Ok(syms)
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
    // The maps can be readable where the executable's link is not (ptrace "read" access
    // without CAP_SYS_PTRACE under Yama, or CAP_PERFMON alone): then a static interpreter is
    // refused, not "not Python".
    let (exe, exe_refused) = match process.exe() {
        Ok(path) => (Some(path), None),
        Err(e @ ProcessError::PermissionDenied(_)) => (None, Some(e)),
        Err(_) => (None, None),
    };
    // Each candidate file by its first mapping.
    let mut candidates: Vec<&Mapping> = Vec::new();
    for m in &maps {
        if is_candidate(&m.path, exe.as_deref()) && !candidates.iter().any(|c| c.path == m.path) {
            candidates.push(m);
        }
    }
    // Libraries before the executable: an embedding program is not itself Python.
    candidates.sort_by_key(|m| Some(m.path.as_path()) == exe.as_deref());
    let mut name_version = None;
    // A candidate that cannot be read (refused as unsafe, not ELF) does not hide the next
    // one; its error is the answer only when no candidate holds the runtime.
    let mut failed = None;
    for first in candidates {
        let path = first.path.as_path();
        name_version = name_version.or(version_from_name(path));
        let syms = match symbols_of(process, first) {
            Ok(Some(syms)) => syms,
            Ok(None) => continue,
            Err(e @ BinaryError::Process(ProcessError::NoSuchProcess(_))) => return Err(e),
            Err(e) => {
                failed = failed.or(Some(e));
                continue;
            }
        };
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
            builtin_types: syms.builtin_types.biased(bias),
            name_version: version_from_name(path).or(name_version),
        });
    }
    Err(failed
        .or(exe_refused.map(BinaryError::Process))
        .unwrap_or(BinaryError::NotPython(process.pid())))
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
