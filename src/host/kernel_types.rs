//! Where a field of a kernel struct lies, from the running kernel's own type information
//! (BTF, `/sys/kernel/btf/vmlinux`): the kernel capture's off-CPU program reads the id of the
//! thread a CPU switches to (`task_struct.pid`), whose place differs from build to build.
//!
//! Reads only that file, bounded ([`MAX_BTF_BYTES`]); a file that does not parse gives
//! `None`, never a guess. The format is the kernel's UAPI (`include/uapi/linux/btf.h`): a
//! header, then types (each a 12-byte head and kind-specific data) and their names.

use std::path::Path;

/// Largest BTF file read (the kernel's is a few MiB).
pub const MAX_BTF_BYTES: u64 = 64 << 20;

const MAGIC: u16 = 0xeb9f;
const KIND_STRUCT: u32 = 4;

/// The byte offset of member `field` of `struct name` in the running kernel, if its BTF says
/// (and the member is not a bitfield).
pub fn field_offset(name: &str, field: &str) -> Option<u64> {
    let path = Path::new("/sys/kernel/btf/vmlinux");
    if std::fs::metadata(path).ok()?.len() > MAX_BTF_BYTES {
        return None;
    }
    struct_field_offset(&std::fs::read(path).ok()?, name, field)
}

/// [`field_offset`] in the BTF `data`.
pub fn struct_field_offset(data: &[u8], name: &str, field: &str) -> Option<u64> {
    let u16_at = |at: usize| Some(u16::from_le_bytes(data.get(at..at + 2)?.try_into().ok()?));
    let u32_at = |at: usize| Some(u32::from_le_bytes(data.get(at..at + 4)?.try_into().ok()?));
    if u16_at(0)? != MAGIC {
        return None;
    }
    let header = u32_at(4)? as usize;
    let (types_at, types_len) = (u32_at(8)? as usize, u32_at(12)? as usize);
    let strings_at = header.checked_add(u32_at(16)? as usize)?;
    let strings_len = u32_at(20)? as usize;
    let strings = data.get(strings_at..strings_at.checked_add(strings_len)?)?;
    let name_at = |off: u32| {
        let s = strings.get(off as usize..)?;
        let end = s.iter().position(|&b| b == 0)?;
        std::str::from_utf8(&s[..end]).ok()
    };
    let mut at = header.checked_add(types_at)?;
    let end = at.checked_add(types_len)?;
    while at < end {
        let (name_off, info) = (u32_at(at)?, u32_at(at + 4)?);
        at += 12;
        let kind = (info >> 24) & 0x1f;
        let vlen = (info & 0xffff) as usize;
        let bitfields = info >> 31 == 1;
        if kind == KIND_STRUCT && name_at(name_off) == Some(name) {
            for i in 0..vlen {
                let member = at + 12 * i;
                if name_at(u32_at(member)?) == Some(field) {
                    let offset = u32_at(member + 8)?;
                    let bits = match bitfields {
                        true if offset >> 24 != 0 => return None,
                        true => offset & 0xff_ffff,
                        false => offset,
                    };
                    return (bits % 8 == 0).then_some(u64::from(bits / 8));
                }
            }
            return None;
        }
        at += kind_data_bytes(kind, vlen)?;
    }
    None
}

/// The bytes a type of `kind` carries after its head.
fn kind_data_bytes(kind: u32, vlen: usize) -> Option<usize> {
    Some(match kind {
        // int, var, decl tag
        1 | 14 | 17 => 4,
        // array
        3 => 12,
        // struct, union; data section; enum64: 12 bytes an entry
        4 | 5 | 15 | 19 => 12 * vlen,
        // enum, function prototype: 8 bytes an entry
        6 | 13 => 8 * vlen,
        // pointer, forward, typedef, volatile, const, restrict, function, float, type tag
        2 | 7 | 8 | 9 | 10 | 11 | 12 | 16 | 18 => 0,
        _ => return None,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A BTF blob: an int, then `struct s { int a; int b; }`, names "int", "s", "a", "b".
    fn blob(member_b_bits: u32, bitfields: bool) -> Vec<u8> {
        let strings = b"\0int\0s\0a\0b\0";
        let mut types = Vec::new();
        let mut push = |v: u32| types.extend(v.to_le_bytes());
        // int: name 1, kind 1, size 4, then its encoding word.
        push(1);
        push(1 << 24);
        push(4);
        push(32);
        // struct s: name 5, kind 4, two members, size 8.
        push(5);
        push((4 << 24) | 2 | (u32::from(bitfields) << 31));
        push(8);
        for (name, bits) in [(7, 0), (9, member_b_bits)] {
            push(name);
            push(1);
            push(bits);
        }
        let mut v = Vec::new();
        v.extend(MAGIC.to_le_bytes());
        v.extend([1u8, 0]);
        v.extend(24u32.to_le_bytes());
        v.extend(0u32.to_le_bytes());
        v.extend((types.len() as u32).to_le_bytes());
        v.extend((types.len() as u32).to_le_bytes());
        v.extend((strings.len() as u32).to_le_bytes());
        v.extend(&types);
        v.extend(strings);
        v
    }

    #[test]
    fn finds_a_member_offset() {
        assert_eq!(struct_field_offset(&blob(32, false), "s", "b"), Some(4));
        assert_eq!(struct_field_offset(&blob(32, false), "s", "a"), Some(0));
        assert_eq!(struct_field_offset(&blob(32, false), "s", "c"), None);
        assert_eq!(struct_field_offset(&blob(32, false), "t", "a"), None);
        // Bitfield structs: the offset's low 24 bits; a bitfield member is refused.
        assert_eq!(struct_field_offset(&blob(64, true), "s", "b"), Some(8));
        assert_eq!(
            struct_field_offset(&blob(64 | (3 << 24), true), "s", "b"),
            None
        );
        // Truncated or not BTF at all.
        let whole = blob(32, false);
        assert_eq!(struct_field_offset(&whole[..30], "s", "b"), None);
        assert_eq!(struct_field_offset(b"nope", "s", "b"), None);
    }

    #[test]
    fn finds_task_struct_pid_in_this_kernel() {
        let Some(pid) = field_offset("task_struct", "pid") else {
            eprintln!("this kernel has no BTF");
            return;
        };
        let tgid = field_offset("task_struct", "tgid").expect("tgid beside pid");
        // `pid_t pid; pid_t tgid;` lie side by side in every kernel since 2.6.
        assert_eq!(tgid, pid + 4);
        assert!(pid > 0 && pid < 16384, "{pid}");
    }
}
