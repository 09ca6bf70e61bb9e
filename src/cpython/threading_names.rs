//! The names the `threading` module gives a process's threads (`Thread.name`: "MainThread",
//! "Thread-1 (work)", a pool's "pool_0"), read from outside for `dump`: in each interpreter,
//! `sys.modules["threading"]._active` maps `threading.get_ident()` to the `Thread`, whose
//! `_name` is the name. Read on demand, never while sampling: it walks three dicts and an
//! instance's attributes, a few hundred small reads.
//!
//! Layouts, the same for the default build of 3.11-3.15 unless said (`tools/offsets/derive.sh`
//! prints each, in `derived-3.X.txt`): a dict's `ma_keys` at 32 and `ma_values` at 40; its keys
//! object's `dk_log2_size` at 8, `dk_log2_index_bytes` at 9, `dk_kind` at 10 (0 general keys,
//! 1 str keys, 2 split), `dk_nentries` at 24, the index table at 32 and the entries after it
//! (24 bytes: hash, key, value; 16 for str keys: key, value); a split dict's values in an array
//! (`PyDictValues.values`: at 0 on 3.11/3.12, at 8 on 3.13+). A module's `md_dict` at 16. An
//! int's size at 16 (3.11: `ob_size`, signed; 3.12+: `lv_tag`, digits times 8, sign in its
//! low bits) and its 30-bit digits at 24. An instance of a class (a managed dict): 3.11, its
//! values pointer 32 bytes before the object and its dict 24 before; 3.12, one word 24
//! before, the values pointer less one when its low bit is set, else the dict; 3.13+, the
//! dict 24 before, or else (the type's `Py_TPFLAGS_INLINE_VALUES`) the values inline at the
//! type's `tp_basicsize` (`tp_basicsize` at 32, `tp_flags` at 168), valid while their byte 3
//! is set. Split values go with the type's shared keys, `ht_cached_keys` (872 on 3.11, 880 on
//! 3.12-3.14, 888 on 3.15).
//!
//! Target memory is hostile: every count is bounded, every string read through the str
//! reader's bounds, and a thread whose name cannot be read has none (the dump says the
//! kernel's name only).

use super::layout::Layout;
use super::objects::read_unicode;
use super::UnwindError;
use crate::memory::RemoteMemory;
use std::collections::HashMap;

const DICT_MA_KEYS: u64 = 32;
const DICT_MA_VALUES: u64 = 40;
const KEYS_LOG2_SIZE: usize = 8;
const KEYS_LOG2_INDEX_BYTES: usize = 9;
const KEYS_KIND: usize = 10;
const KEYS_NENTRIES: usize = 24;
const KEYS_INDICES: u64 = 32;
const KEYS_GENERAL: u8 = 0;
const MODULE_MD_DICT: u64 = 16;
const INT_SIZE: u64 = 16;
const INT_DIGITS: u64 = 24;
const TYPE_BASICSIZE: u64 = 32;
const TYPE_FLAGS: u64 = 168;
const TPFLAGS_INLINE_VALUES: u64 = 1 << 2;
const TPFLAGS_MANAGED_DICT: u64 = 1 << 4;
const OB_TYPE: u64 = 8;

/// Most entries of one dict looked at (`sys.modules` holds hundreds; `_active` one per
/// thread).
const MAX_ENTRIES: u64 = 1 << 16;
/// Most interpreters looked at.
const MAX_INTERPRETERS: usize = 256;
/// Longest name kept, in characters.
const MAX_NAME_CHARS: usize = 256;

/// What differs between versions.
#[derive(Clone, Copy)]
struct Objects {
    minor: u32,
    /// `PyDictValues.values`.
    values: u64,
    /// `PyHeapTypeObject.ht_cached_keys`.
    cached_keys: u64,
}

impl Objects {
    fn of(minor: u32) -> Option<Objects> {
        let (values, cached_keys) = match minor {
            11 => (0, 872),
            12 => (0, 880),
            13 | 14 => (8, 880),
            15 => (8, 888),
            _ => return None,
        };
        Some(Objects {
            minor,
            values,
            cached_keys,
        })
    }
}

/// `threading.get_ident()` to `Thread.name`, for every thread the `threading` module of any
/// interpreter knows. Empty when no interpreter imported `threading`.
pub fn read<M: RemoteMemory>(
    mem: &M,
    layout: &Layout,
    runtime: u64,
) -> Result<HashMap<u64, String>, UnwindError> {
    let Some(objects) = Objects::of(layout.version.minor) else {
        return Ok(HashMap::new());
    };
    let reader = Reader {
        mem,
        layout,
        objects,
    };
    let mut names = HashMap::new();
    let mut interp = mem.read_u64(runtime + layout.runtime_interpreters_head)?;
    let mut seen = 0;
    while interp != 0 {
        seen += 1;
        if seen > MAX_INTERPRETERS {
            return Err(UnwindError::TooLong("interpreter list", MAX_INTERPRETERS));
        }
        reader.interpreter(interp, &mut names)?;
        interp = mem.read_u64(interp + layout.interp.next)?;
    }
    Ok(names)
}

struct Reader<'a, M: RemoteMemory> {
    mem: &'a M,
    layout: &'a Layout,
    objects: Objects,
}

/// A dict's entries, as (key, value) object addresses (value 0: none).
type Entries = Vec<(u64, u64)>;

impl<M: RemoteMemory> Reader<'_, M> {
    fn interpreter(
        &self,
        interp: u64,
        names: &mut HashMap<u64, String>,
    ) -> Result<(), UnwindError> {
        let modules = self.mem.read_u64(interp + self.layout.interp.modules)?;
        if modules == 0 {
            return Ok(());
        }
        let Some(threading) = self.str_keyed(&self.dict(modules)?, "threading")? else {
            return Ok(());
        };
        let globals = self.mem.read_u64(threading + MODULE_MD_DICT)?;
        let Some(active) = self.str_keyed(&self.dict(globals)?, "_active")? else {
            return Ok(());
        };
        for (ident, thread) in self.dict(active)? {
            if thread == 0 {
                continue;
            }
            let Some(ident) = self.int(ident)? else {
                continue;
            };
            // A thread whose name cannot be read (being torn down) keeps the others'.
            if let Ok(Some(name)) = self.attribute(thread, "_name") {
                names.insert(ident, name.chars().take(MAX_NAME_CHARS).collect());
            }
        }
        Ok(())
    }

    /// The value of the entry of `entries` whose key is the str `key`.
    fn str_keyed(&self, entries: &Entries, key: &str) -> Result<Option<u64>, UnwindError> {
        for &(k, v) in entries {
            if v != 0 && k != 0 && read_unicode(self.mem, self.layout, k)? == key {
                return Ok(Some(v));
            }
        }
        Ok(None)
    }

    /// The entries of the dict at `dict`.
    fn dict(&self, dict: u64) -> Result<Entries, UnwindError> {
        let keys = self.mem.read_u64(dict + DICT_MA_KEYS)?;
        let values = self.mem.read_u64(dict + DICT_MA_VALUES)?;
        self.entries(keys, (values != 0).then_some(values))
    }

    /// The entries of a keys object, their values from `values` (a split dict's array) when
    /// given, else from the entries themselves.
    fn entries(&self, keys: u64, values: Option<u64>) -> Result<Entries, UnwindError> {
        let bad = |what: &str| UnwindError::BadObject {
            addr: keys,
            what: what.to_string(),
        };
        let header = self.mem.read_vec(keys, KEYS_INDICES as usize)?;
        let log2_size = header[KEYS_LOG2_SIZE];
        let log2_index_bytes = header[KEYS_LOG2_INDEX_BYTES];
        let kind = header[KEYS_KIND];
        let nentries = u64::from_le_bytes(
            header[KEYS_NENTRIES..KEYS_NENTRIES + 8]
                .try_into()
                .map_err(|_| bad("short keys object"))?,
        );
        if log2_size > 30 || log2_index_bytes > 34 || kind > 2 {
            return Err(bad("dict keys header out of range"));
        }
        if nentries > (1u64 << log2_size) || nentries > MAX_ENTRIES {
            return Err(UnwindError::TooLong("dict", MAX_ENTRIES as usize));
        }
        let entry_size: u64 = if kind == KEYS_GENERAL { 24 } else { 16 };
        let key_at: usize = if kind == KEYS_GENERAL { 8 } else { 0 };
        let first = keys + KEYS_INDICES + (1u64 << log2_index_bytes);
        let raw = self.mem.read_vec(first, (nentries * entry_size) as usize)?;
        let values = match values {
            Some(v) => Some(
                self.mem
                    .read_vec(v + self.objects.values, (nentries * 8) as usize)?,
            ),
            None => None,
        };
        let word = |bytes: &[u8], at: usize| -> u64 {
            bytes
                .get(at..at + 8)
                .and_then(|b| b.try_into().ok())
                .map_or(0, u64::from_le_bytes)
        };
        Ok((0..nentries as usize)
            .map(|i| {
                let entry = i * entry_size as usize;
                let key = word(&raw, entry + key_at);
                let value = match &values {
                    Some(v) => word(v, i * 8),
                    None => word(&raw, entry + key_at + 8),
                };
                (key, value)
            })
            .collect())
    }

    /// The value of an int object, when it fits in 64 bits and is not negative.
    fn int(&self, addr: u64) -> Result<Option<u64>, UnwindError> {
        let size = self.mem.read_u64(addr + INT_SIZE)?;
        let digits = match self.objects.minor {
            // ob_size: the digit count, negative for a negative number.
            11 => match i64::try_from(size) {
                Ok(n) if n >= 0 => n as u64,
                _ => return Ok(None),
            },
            // lv_tag: digits << 3 | sign (0 positive, 1 zero, 2 negative).
            _ => match size & 3 {
                2 => return Ok(None),
                _ => size >> 3,
            },
        };
        if digits > 3 {
            return Ok(None);
        }
        let raw = self.mem.read_vec(addr + INT_DIGITS, digits as usize * 4)?;
        let mut value: u128 = 0;
        for (i, d) in raw.chunks_exact(4).enumerate() {
            let d = u32::from_le_bytes([d[0], d[1], d[2], d[3]]) & ((1 << 30) - 1);
            value |= u128::from(d) << (30 * i);
        }
        Ok(u64::try_from(value).ok())
    }

    /// The str attribute `name` of an instance of a class (its managed dict), if it has one.
    fn attribute(&self, obj: u64, name: &str) -> Result<Option<String>, UnwindError> {
        let ty = self.mem.read_u64(obj + OB_TYPE)?;
        let flags = self.mem.read_u64(ty + TYPE_FLAGS)?;
        if flags & TPFLAGS_MANAGED_DICT == 0 {
            return Ok(None);
        }
        let before = |words: u64| self.mem.read_u64(obj.wrapping_sub(8 * words));
        let shared = || self.mem.read_u64(ty + self.objects.cached_keys);
        let entries = match self.objects.minor {
            11 => match before(4)? {
                0 => self.managed_dict(before(3)?)?,
                values => self.entries(shared()?, Some(values))?,
            },
            12 => match before(3)? {
                0 => Vec::new(),
                tagged if tagged & 1 == 1 => self.entries(shared()?, Some(tagged + 1))?,
                dict => self.dict(dict)?,
            },
            _ => match before(3)? {
                0 if flags & TPFLAGS_INLINE_VALUES != 0 => {
                    let basicsize = self.mem.read_u64(ty + TYPE_BASICSIZE)?;
                    let values = obj + basicsize;
                    let mut valid = [0u8; 1];
                    self.mem.read(values + 3, &mut valid)?;
                    match valid[0] {
                        0 => Vec::new(),
                        _ => self.entries(shared()?, Some(values))?,
                    }
                }
                0 => Vec::new(),
                dict => self.dict(dict)?,
            },
        };
        match self.str_keyed(&entries, name)? {
            Some(value) => Ok(Some(read_unicode(self.mem, self.layout, value)?)),
            None => Ok(None),
        }
    }

    fn managed_dict(&self, dict: u64) -> Result<Entries, UnwindError> {
        match dict {
            0 => Ok(Vec::new()),
            dict => self.dict(dict),
        }
    }
}
