//! Dicts and instance attributes read from outside: a dict's entries, an int's value, and
//! where an instance of a class keeps an attribute. Used on demand (`threading_names`) and,
//! through cached slot addresses, by the asyncio loop reader (`asyncio::ready`).
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
//! Target memory is hostile: every count is bounded (at most [`MAX_ENTRIES`] entries of a
//! dict), every string read through the str reader's bounds.

use super::layout::Layout;
use super::objects::read_unicode;
use super::UnwindError;
use crate::memory::RemoteMemory;

const DICT_MA_KEYS: u64 = 32;
const DICT_MA_VALUES: u64 = 40;
const KEYS_LOG2_SIZE: usize = 8;
const KEYS_LOG2_INDEX_BYTES: usize = 9;
const KEYS_KIND: usize = 10;
const KEYS_NENTRIES: usize = 24;
const KEYS_INDICES: u64 = 32;
const KEYS_GENERAL: u8 = 0;
pub const MODULE_MD_DICT: u64 = 16;
const INT_SIZE: u64 = 16;
const INT_DIGITS: u64 = 24;
pub const TYPE_BASICSIZE: u64 = 32;
pub const TYPE_FLAGS: u64 = 168;
const TPFLAGS_INLINE_VALUES: u64 = 1 << 2;
const TPFLAGS_MANAGED_DICT: u64 = 1 << 4;
pub const OB_TYPE: u64 = 8;
pub const TYPE_NAME: u64 = 24;
/// The smallest page: a C string is read past its page's end only when it goes on.
const PAGE: u64 = 4096;

/// The bytes of the C string at `addr` before its NUL, at most `max`: read to the end of its
/// page first, the next page only when the string goes on there (a page after it may not be
/// mapped; a type's name may end just past a page's start).
pub fn c_string<M: RemoteMemory>(mem: &M, addr: u64, max: usize) -> Result<Vec<u8>, UnwindError> {
    let in_page = (max as u64).min(PAGE - addr % PAGE) as usize;
    let mut raw = mem.read_vec(addr, in_page)?;
    if !raw.contains(&0) && in_page < max {
        raw.extend(mem.read_vec(addr.wrapping_add(in_page as u64), max - in_page)?);
    }
    if let Some(end) = raw.iter().position(|&b| b == 0) {
        raw.truncate(end);
    }
    Ok(raw)
}

/// The name of the type at `ty` (its `tp_name`), at most `max` bytes.
pub fn type_name<M: RemoteMemory>(mem: &M, ty: u64, max: usize) -> Result<Vec<u8>, UnwindError> {
    c_string(mem, mem.read_u64(ty.wrapping_add(TYPE_NAME))?, max)
}

/// Most entries of one dict looked at (`sys.modules` holds hundreds; `_active` one per
/// thread).
pub const MAX_ENTRIES: u64 = 1 << 16;

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

/// One entry of a dict: its key and value objects (value 0: none), and where the value's
/// pointer lies in the target (in the entry, or in a split dict's values array).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct DictEntry {
    pub key: u64,
    pub value: u64,
    pub slot: u64,
}

/// Reads dicts, ints and instance attributes of one target.
pub struct ObjectReader<'a, M: RemoteMemory> {
    mem: &'a M,
    layout: &'a Layout,
    objects: Objects,
}

impl<'a, M: RemoteMemory> ObjectReader<'a, M> {
    /// The reader of a target of `layout`'s version; `None` for a version it does not know.
    pub fn new(mem: &'a M, layout: &'a Layout) -> Option<ObjectReader<'a, M>> {
        Some(ObjectReader {
            mem,
            layout,
            objects: Objects::of(layout.version.minor)?,
        })
    }

    /// The value of the entry of `entries` whose key is the str `key`.
    pub fn str_keyed(
        &self,
        entries: &[DictEntry],
        key: &str,
    ) -> Result<Option<DictEntry>, UnwindError> {
        for e in entries {
            if e.value != 0 && e.key != 0 && read_unicode(self.mem, self.layout, e.key)? == key {
                return Ok(Some(*e));
            }
        }
        Ok(None)
    }

    /// The entries of the dict at `dict`.
    pub fn dict(&self, dict: u64) -> Result<Vec<DictEntry>, UnwindError> {
        let keys = self.mem.read_u64(dict + DICT_MA_KEYS)?;
        let values = self.mem.read_u64(dict + DICT_MA_VALUES)?;
        self.entries(keys, (values != 0).then_some(values))
    }

    /// The entries of a keys object, their values from `values` (a split dict's array) when
    /// given, else from the entries themselves.
    fn entries(&self, keys: u64, values: Option<u64>) -> Result<Vec<DictEntry>, UnwindError> {
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
        let key_at: u64 = if kind == KEYS_GENERAL { 8 } else { 0 };
        let first = keys + KEYS_INDICES + (1u64 << log2_index_bytes);
        let raw = self.mem.read_vec(first, (nentries * entry_size) as usize)?;
        let values = match values {
            Some(v) => {
                let at = v + self.objects.values;
                Some((at, self.mem.read_vec(at, (nentries * 8) as usize)?))
            }
            None => None,
        };
        let word = |bytes: &[u8], at: u64| -> u64 {
            bytes
                .get(at as usize..at as usize + 8)
                .and_then(|b| b.try_into().ok())
                .map_or(0, u64::from_le_bytes)
        };
        Ok((0..nentries)
            .map(|i| {
                let entry = i * entry_size;
                let key = word(&raw, entry + key_at);
                let (value, slot) = match &values {
                    Some((at, v)) => (word(v, i * 8), at + i * 8),
                    None => (word(&raw, entry + key_at + 8), first + entry + key_at + 8),
                };
                DictEntry { key, value, slot }
            })
            .collect())
    }

    /// The value of an int object, when it fits in 64 bits and is not negative.
    pub fn int(&self, addr: u64) -> Result<Option<u64>, UnwindError> {
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

    /// The entry of attribute `name` of an instance of a class (its managed dict), if it has
    /// one: the attribute's object and where the instance keeps its pointer.
    pub fn attribute(&self, obj: u64, name: &str) -> Result<Option<DictEntry>, UnwindError> {
        let entries = self.instance_entries(obj)?;
        self.str_keyed(&entries, name)
    }

    /// The str attribute `name` of an instance of a class, if it has one.
    pub fn str_attribute(&self, obj: u64, name: &str) -> Result<Option<String>, UnwindError> {
        match self.attribute(obj, name)? {
            Some(e) => Ok(Some(read_unicode(self.mem, self.layout, e.value)?)),
            None => Ok(None),
        }
    }

    /// The entries of an instance's managed dict (none for a type without one).
    fn instance_entries(&self, obj: u64) -> Result<Vec<DictEntry>, UnwindError> {
        let ty = self.mem.read_u64(obj + OB_TYPE)?;
        let flags = self.mem.read_u64(ty + TYPE_FLAGS)?;
        if flags & TPFLAGS_MANAGED_DICT == 0 {
            return Ok(Vec::new());
        }
        let before = |words: u64| self.mem.read_u64(obj.wrapping_sub(8 * words));
        let shared = || self.mem.read_u64(ty + self.objects.cached_keys);
        match self.objects.minor {
            11 => match before(4)? {
                0 => self.managed_dict(before(3)?),
                values => self.entries(shared()?, Some(values)),
            },
            12 => match before(3)? {
                0 => Ok(Vec::new()),
                tagged if tagged & 1 == 1 => self.entries(shared()?, Some(tagged + 1)),
                dict => self.dict(dict),
            },
            _ => match before(3)? {
                0 if flags & TPFLAGS_INLINE_VALUES != 0 => {
                    let basicsize = self.mem.read_u64(ty + TYPE_BASICSIZE)?;
                    let values = obj + basicsize;
                    let mut valid = [0u8; 1];
                    self.mem.read(values + 3, &mut valid)?;
                    match valid[0] {
                        0 => Ok(Vec::new()),
                        _ => self.entries(shared()?, Some(values)),
                    }
                }
                0 => Ok(Vec::new()),
                dict => self.dict(dict),
            },
        }
    }

    fn managed_dict(&self, dict: u64) -> Result<Vec<DictEntry>, UnwindError> {
        match dict {
            0 => Ok(Vec::new()),
            dict => self.dict(dict),
        }
    }
}
