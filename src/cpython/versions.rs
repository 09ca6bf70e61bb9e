//! The CPython versions pyfleet reads: one row per minor version of Python 3, saying where
//! its layout comes from. Detection ([`find`]), building the layout (`detect_layout`) and the
//! "unsupported version" error ([`supported_range`]) all read this table and nothing else;
//! adding a version is a row here plus the checklist in ARCHITECTURE.md ("Adding a CPython
//! version").

use super::debug_offsets::{FIELDS_313, FIELDS_314, FIELDS_315};
use super::layout::{Layout, Version};
use super::tables::{layout_311, layout_312};

/// Where a version's layout comes from.
#[derive(Debug, Clone, Copy)]
pub enum LayoutSource {
    /// Built into pyfleet (`tables.rs`, derived from the version's headers): the version has
    /// no `_Py_DebugOffsets`.
    BuiltIn(fn(Version) -> Layout),
    /// The target's own `_Py_DebugOffsets` at the start of `_PyRuntime`: these field names
    /// in declaration order (`debug_offsets.rs`), validated before use.
    DebugOffsets(&'static [&'static str]),
}

/// One supported minor version of Python 3.
#[derive(Debug, Clone, Copy)]
pub struct SupportedVersion {
    pub minor: u32,
    pub layout: LayoutSource,
}

/// Every version pyfleet reads, oldest first.
pub const SUPPORTED: &[SupportedVersion] = &[
    SupportedVersion {
        minor: 11,
        layout: LayoutSource::BuiltIn(layout_311),
    },
    SupportedVersion {
        minor: 12,
        layout: LayoutSource::BuiltIn(layout_312),
    },
    SupportedVersion {
        minor: 13,
        layout: LayoutSource::DebugOffsets(FIELDS_313),
    },
    SupportedVersion {
        minor: 14,
        layout: LayoutSource::DebugOffsets(FIELDS_314),
    },
    SupportedVersion {
        minor: 15,
        layout: LayoutSource::DebugOffsets(FIELDS_315),
    },
];

/// The row of a version, if pyfleet reads it.
pub fn find(version: Version) -> Option<&'static SupportedVersion> {
    if version.major != 3 {
        return None;
    }
    SUPPORTED.iter().find(|v| v.minor == version.minor)
}

/// "3.11 to 3.15": the oldest and newest rows, for messages.
pub fn supported_range() -> String {
    match (SUPPORTED.first(), SUPPORTED.last()) {
        (Some(first), Some(last)) => format!("3.{} to 3.{}", first.minor, last.minor),
        _ => "no version".to_string(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn v(major: u64, minor: u64) -> Version {
        Version::from_hex((major << 24) | (minor << 16))
    }

    #[test]
    fn one_row_per_version_in_order_with_its_source() {
        let minors: Vec<u32> = SUPPORTED.iter().map(|r| r.minor).collect();
        assert_eq!(minors, vec![11, 12, 13, 14, 15]);
        assert_eq!(supported_range(), "3.11 to 3.15");
        for minor in [11, 12] {
            assert!(matches!(
                find(v(3, minor)).map(|r| r.layout),
                Some(LayoutSource::BuiltIn(_))
            ));
        }
        for minor in [13, 14, 15] {
            assert!(matches!(
                find(v(3, minor)).map(|r| r.layout),
                Some(LayoutSource::DebugOffsets(_))
            ));
        }
        // Built-in layouts say the version they were built for.
        for r in SUPPORTED {
            if let LayoutSource::BuiltIn(build) = r.layout {
                assert_eq!(build(v(3, u64::from(r.minor))).version.minor, r.minor);
            }
        }
        assert!(find(v(3, 10)).is_none());
        assert!(find(v(3, 16)).is_none());
        assert!(find(v(2, 11)).is_none());
    }
}
