//! Which snapshots to delete (`--keep`, `--max-bytes`), and parsing of sizes like `64M`.
//!
//! Owns the choice only. It must not list, stat or delete files: the snapshot sink passes the
//! snapshots it found (name and total size) and deletes what this module names.
//!
//! Rules:
//! - Snapshots are ordered by name (byte-wise), which for the sink's UTC-time directory names
//!   is their age; equal names are ordered by their position in the given slice.
//! - What is kept is always the newest run of snapshots: at most `keep` of them, and only as
//!   many as fit in `max_bytes` together. Counting from the newest, the first snapshot that
//!   would break either limit is deleted with everything older, even when an older one is
//!   small enough to fit: no gaps in the history.
//! - The newest snapshot is never deleted, even when it alone exceeds `max_bytes`.
//! - Sizes are in bytes; `K`, `M`, `G`, `T` (also written `KB`, `KiB`, ...) are powers of 1024.

/// Default `--keep`.
pub const DEFAULT_KEEP: usize = 60;

/// What to keep; build it with [`RetentionPolicy::new`] to have the limits checked.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RetentionPolicy {
    /// Most snapshots kept (at least 1; 0 acts as 1).
    pub keep: usize,
    /// Most bytes kept over all snapshots; `None` for no limit.
    pub max_bytes: Option<u64>,
}

impl Default for RetentionPolicy {
    /// The last 60 snapshots, whatever their size.
    fn default() -> Self {
        RetentionPolicy {
            keep: DEFAULT_KEEP,
            max_bytes: None,
        }
    }
}

/// One snapshot the sink found.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SnapshotEntry {
    /// Its name, which sorts by time (the sink names snapshots by UTC time).
    pub name: String,
    /// Its total size on disk.
    pub bytes: u64,
}

/// `--keep` or `--max-bytes` is out of range.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum RetentionError {
    #[error("--keep must be at least 1 (got 0)")]
    KeepZero,
    #[error("--max-bytes must be at least 1 byte (got 0); leave it out for no limit")]
    MaxBytesZero,
}

/// A size given on the command line is not one.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum SizeError {
    #[error("invalid size {0:?}: expected a number of bytes, optionally with a K, M, G or T suffix (e.g. 512K, 64M, 2G)")]
    Invalid(String),
    #[error("size {0:?} is too large: at most 16 EiB")]
    TooLarge(String),
}

impl RetentionPolicy {
    /// `keep`: `--keep`, at least 1. `max_bytes`: `--max-bytes`, at least 1 when given.
    pub fn new(keep: usize, max_bytes: Option<u64>) -> Result<Self, RetentionError> {
        if keep == 0 {
            return Err(RetentionError::KeepZero);
        }
        if max_bytes == Some(0) {
            return Err(RetentionError::MaxBytesZero);
        }
        Ok(RetentionPolicy { keep, max_bytes })
    }

    /// Indices into `snapshots` of the ones to delete, oldest first. `snapshots` may come in
    /// any order.
    pub fn to_delete(&self, snapshots: &[SnapshotEntry]) -> Vec<usize> {
        let mut order: Vec<usize> = (0..snapshots.len()).collect();
        // Stable: equal names keep their order in the slice.
        order.sort_by(|&a, &b| {
            snapshots[a]
                .name
                .as_bytes()
                .cmp(snapshots[b].name.as_bytes())
        });

        let keep = self.keep.max(1);
        // u128: a sum of u64 sizes cannot overflow it for any slice that fits in memory.
        let mut total = 0u128;
        // Walk from the newest; `cut` ends up as the number of oldest entries to delete.
        let mut cut = 0usize;
        for (pos, &i) in order.iter().enumerate().rev() {
            let kept = order.len() - 1 - pos; // the newer ones, all kept so far
            let bytes = total.saturating_add(u128::from(snapshots[i].bytes));
            let fits = match self.max_bytes {
                Some(max) => bytes <= u128::from(max),
                None => true,
            };
            if kept > 0 && (kept >= keep || !fits) {
                cut = pos + 1;
                break;
            }
            total = bytes;
        }
        order.truncate(cut);
        order
    }
}

/// Parses a size: `1048576`, `512K`, `64M`, `2G`, `1GiB`, `10MB`, `1.5G`, `64 m`. Units are
/// case-insensitive powers of 1024 (`B`, `K`/`KB`/`KiB`, `M`..., `G`..., `T`...); a fraction
/// needs a unit and is rounded down to whole bytes.
pub fn parse_size(s: &str) -> Result<u64, SizeError> {
    let invalid = || SizeError::Invalid(s.to_string());
    let t = s.trim();
    let digits_end = t
        .find(|c: char| !(c.is_ascii_digit() || c == '.'))
        .unwrap_or(t.len());
    let (number, unit) = t.split_at(digits_end);
    // Only spaces may separate the number from its unit.
    let shift = match unit.trim_start_matches(' ').to_ascii_lowercase().as_str() {
        "" | "b" => 0,
        "k" | "kb" | "kib" => 10,
        "m" | "mb" | "mib" => 20,
        "g" | "gb" | "gib" => 30,
        "t" | "tb" | "tib" => 40,
        _ => return Err(invalid()),
    };
    let (whole, fraction) = match number.split_once('.') {
        Some((w, f)) => (w, Some(f)),
        None => (number, None),
    };
    if whole.is_empty() || !whole.bytes().all(|b| b.is_ascii_digit()) {
        return Err(invalid());
    }
    let too_large = || SizeError::TooLarge(s.to_string());
    // All digits, so the only way to fail is overflow.
    let whole: u64 = whole.parse().map_err(|_| too_large())?;
    let mut bytes = u128::from(whole) << shift;
    if let Some(fraction) = fraction {
        if fraction.is_empty() || !fraction.bytes().all(|b| b.is_ascii_digit()) || shift == 0 {
            return Err(invalid());
        }
        bytes += fraction_of_unit(fraction, shift);
    }
    u64::try_from(bytes).map_err(|_| too_large())
}

/// `floor(0.<digits> * 2^shift)`, exactly: doubles the decimal fraction `shift` times and
/// collects the carries out of it as the bits of the result.
fn fraction_of_unit(digits: &str, shift: u32) -> u128 {
    let mut digits: Vec<u8> = digits.bytes().map(|b| b - b'0').collect();
    let mut whole = 0u128;
    for _ in 0..shift {
        let mut carry = 0u8;
        for d in digits.iter_mut().rev() {
            let v = *d * 2 + carry;
            *d = v % 10;
            carry = v / 10;
        }
        whole = (whole << 1) | u128::from(carry);
    }
    whole
}

#[cfg(test)]
mod tests {
    use super::*;

    fn entries(list: &[(&str, u64)]) -> Vec<SnapshotEntry> {
        list.iter()
            .map(|&(name, bytes)| SnapshotEntry {
                name: name.to_string(),
                bytes,
            })
            .collect()
    }

    fn names(snaps: &[SnapshotEntry], idx: &[usize]) -> Vec<String> {
        idx.iter().map(|&i| snaps[i].name.clone()).collect()
    }

    fn t(n: u32) -> String {
        format!("2026-04-01T12-{:02}-{:02}Z", n / 60, n % 60)
    }

    #[test]
    fn defaults_and_construction() {
        let d = RetentionPolicy::default();
        assert_eq!(d.keep, 60);
        assert_eq!(d.max_bytes, None);
        assert_eq!(RetentionPolicy::new(60, None), Ok(d));
        assert_eq!(
            RetentionPolicy::new(3, Some(10)),
            Ok(RetentionPolicy {
                keep: 3,
                max_bytes: Some(10)
            })
        );
        assert_eq!(RetentionPolicy::new(0, None), Err(RetentionError::KeepZero));
        assert_eq!(
            RetentionPolicy::new(0, None).unwrap_err().to_string(),
            "--keep must be at least 1 (got 0)"
        );
        assert_eq!(
            RetentionPolicy::new(5, Some(0)),
            Err(RetentionError::MaxBytesZero)
        );
        assert_eq!(RetentionError::MaxBytesZero.to_string().lines().count(), 1);
    }

    #[test]
    fn nothing_to_do() {
        let p = RetentionPolicy::new(3, Some(100)).unwrap();
        assert!(p.to_delete(&[]).is_empty());
        assert!(p.to_delete(&entries(&[("a", 1)])).is_empty());
        assert!(p
            .to_delete(&entries(&[("a", 1), ("b", 1), ("c", 1)]))
            .is_empty());
    }

    #[test]
    fn keeps_the_last_n_oldest_first() {
        let p = RetentionPolicy::new(3, None).unwrap();
        let snaps: Vec<_> = (0..10)
            .map(|i| SnapshotEntry {
                name: t(i),
                bytes: 1000,
            })
            .collect();
        let del = p.to_delete(&snaps);
        assert_eq!(del, vec![0, 1, 2, 3, 4, 5, 6]);
    }

    #[test]
    fn any_input_order() {
        let p = RetentionPolicy::new(2, None).unwrap();
        let snaps = entries(&[("c", 1), ("a", 1), ("e", 1), ("b", 1), ("d", 1)]);
        let del = p.to_delete(&snaps);
        assert_eq!(names(&snaps, &del), ["a", "b", "c"]);
        assert_eq!(del, vec![1, 3, 0]);
    }

    #[test]
    fn byte_limit_keeps_a_newest_run() {
        let p = RetentionPolicy::new(60, Some(100)).unwrap();
        // Newest first: 30 + 40 = 70; + 50 = 120 > 100 -> "c" and everything older go, even
        // the tiny "a" that would still fit.
        let snaps = entries(&[("a", 1), ("b", 10), ("c", 50), ("d", 40), ("e", 30)]);
        assert_eq!(names(&snaps, &p.to_delete(&snaps)), ["a", "b", "c"]);
        // Exactly at the limit is kept.
        let snaps = entries(&[("a", 5), ("b", 60), ("c", 40)]);
        assert_eq!(names(&snaps, &p.to_delete(&snaps)), ["a"]);
    }

    #[test]
    fn both_limits_the_stricter_wins() {
        let p = RetentionPolicy::new(2, Some(1000)).unwrap();
        let snaps = entries(&[("a", 1), ("b", 1), ("c", 1), ("d", 1)]);
        assert_eq!(names(&snaps, &p.to_delete(&snaps)), ["a", "b"]);
        let p = RetentionPolicy::new(10, Some(25)).unwrap();
        let snaps = entries(&[("a", 10), ("b", 10), ("c", 10), ("d", 10)]);
        assert_eq!(names(&snaps, &p.to_delete(&snaps)), ["a", "b"]);
    }

    #[test]
    fn newest_is_never_deleted() {
        let p = RetentionPolicy::new(5, Some(100)).unwrap();
        let snaps = entries(&[("a", 10), ("b", 10), ("z", 1_000_000)]);
        assert_eq!(names(&snaps, &p.to_delete(&snaps)), ["a", "b"]);
        let snaps = entries(&[("z", u64::MAX)]);
        assert!(p.to_delete(&snaps).is_empty());
        // keep = 0 set directly (bypassing new) still keeps the newest.
        let p = RetentionPolicy {
            keep: 0,
            max_bytes: Some(1),
        };
        let snaps = entries(&[("b", 5), ("a", 5)]);
        assert_eq!(p.to_delete(&snaps), vec![1]);
    }

    #[test]
    fn huge_sizes_do_not_overflow() {
        let p = RetentionPolicy::new(10, Some(u64::MAX)).unwrap();
        let snaps = entries(&[("a", u64::MAX), ("b", u64::MAX), ("c", 1)]);
        // 1 + MAX is over MAX: neither wraps round to a small number nor saturates to "fits".
        assert_eq!(names(&snaps, &p.to_delete(&snaps)), ["a", "b"]);
        let snaps = entries(&[("a", u64::MAX - 1), ("b", 1)]);
        assert!(p.to_delete(&snaps).is_empty());
        let p = RetentionPolicy::new(usize::MAX, None).unwrap();
        let snaps = entries(&[("a", u64::MAX), ("b", u64::MAX), ("c", u64::MAX)]);
        assert!(p.to_delete(&snaps).is_empty());
    }

    #[test]
    fn equal_names_order_by_position() {
        let p = RetentionPolicy::new(1, None).unwrap();
        let snaps = entries(&[("x", 1), ("x", 2), ("x", 3)]);
        assert_eq!(p.to_delete(&snaps), vec![0, 1]);
    }

    #[test]
    fn names_sort_bytewise() {
        let p = RetentionPolicy::new(1, None).unwrap();
        // Uppercase sorts before lowercase, "é" (0xC3..) after ASCII.
        let snaps = entries(&[("é", 1), ("b", 1), ("B", 1)]);
        assert_eq!(names(&snaps, &p.to_delete(&snaps)), ["B", "b"]);
    }

    #[test]
    fn sizes() {
        let cases: &[(&str, u64)] = &[
            ("0", 0),
            ("1048576", 1_048_576),
            ("512K", 512 << 10),
            ("512k", 512 << 10),
            ("512KB", 512 << 10),
            ("512KiB", 512 << 10),
            ("64M", 64 << 20),
            ("10MB", 10 << 20),
            ("10mib", 10 << 20),
            ("2G", 2 << 30),
            ("1GiB", 1 << 30),
            ("1gb", 1 << 30),
            ("3T", 3 << 40),
            ("3TiB", 3 << 40),
            ("100B", 100),
            ("100b", 100),
            (" 64M ", 64 << 20),
            ("64 M", 64 << 20),
            ("1.5G", 3 << 29),
            ("0.5K", 512),
            ("1.0009765625K", 1025),
            ("0.3K", 307),                                      // 307.2 rounds down
            ("0.0000000000009094947017729282379150390625T", 1), // 2^-40 T, exactly
            ("0.0000000000009094947017729282379150390624T", 0),
            ("0000064M", 64 << 20),
            ("18446744073709551615", u64::MAX),
            ("18446744073709551615B", u64::MAX),
            ("16777215.99999999999999999999999999999T", u64::MAX),
        ];
        for &(s, want) in cases {
            assert_eq!(parse_size(s), Ok(want), "{s}");
        }
        // A fraction of a byte makes no sense.
        assert!(matches!(parse_size("1.5"), Err(SizeError::Invalid(_))));
        assert!(matches!(parse_size("1.9999B"), Err(SizeError::Invalid(_))));
        // Long fractions are accepted and round down.
        assert_eq!(parse_size("0.99999999999999999999999999K"), Ok(1023));
        assert_eq!(parse_size("0.999T"), Ok((1 << 40) * 999 / 1000));
    }

    #[test]
    fn bad_sizes() {
        for s in [
            "", " ", "M", "K10", "1\tM", "1\nM", "-1", "-1M", "+1M", "1e6", "0x10", "1,000",
            "1_000", "1.", ".5M", "1..5M", "1.2.3M", "10 MBs", "10Q", "10MM", "ten", "1 0", "1.5 ",
            "∞", "１２", "10\nM", "10M\0",
        ] {
            let e = parse_size(s).unwrap_err();
            assert!(matches!(e, SizeError::Invalid(_)), "{s:?}: {e:?}");
            assert_eq!(e.to_string().lines().count(), 1, "{s:?}");
        }
        assert_eq!(
            parse_size("abc").unwrap_err().to_string(),
            "invalid size \"abc\": expected a number of bytes, optionally with a K, M, G or T suffix (e.g. 512K, 64M, 2G)"
        );
        for s in [
            "18446744073709551616",
            "99999999999999999999999999",
            "16777216T",
            "17179869184G",
            "18014398509481984K",
            "99999999999999999999T",
        ] {
            let e = parse_size(s).unwrap_err();
            assert!(matches!(e, SizeError::TooLarge(_)), "{s}: {e:?}");
            assert_eq!(e.to_string().lines().count(), 1);
        }
        assert_eq!(
            parse_size("16777216T").unwrap_err().to_string(),
            "size \"16777216T\" is too large: at most 16 EiB"
        );
        // Hostile input stays on one line in the message.
        let e = parse_size("1\n2\r\n3").unwrap_err().to_string();
        assert_eq!(e.lines().count(), 1, "{e}");
    }
}
