//! pyfleet-policies: the pure decisions of pyfleet. No I/O, no async, no clocks read here:
//! callers pass in what they observed and get a decision back, so every rule is unit-tested
//! exhaustively.

#![forbid(unsafe_code)]

pub mod family;
pub mod file_mode;
pub mod idle;
pub mod matching;
pub mod mode;
pub mod naming;
pub mod own_code;
pub mod rate;
pub mod restart;
pub mod retention;

pub use family::{Family, PythonFacts, Role, RoleError};
pub use file_mode::{FileMode, FileModeError};
pub use idle::{leave_out_idle, task_waits_for_work, waits_for_work};
pub use matching::{LabelRuleError, MatchError, MatchPolicy, ProcessFacts, LABEL_KEYS};
pub use mode::{Mode, ModeError};
pub use naming::{is_multiprocessing_child, is_multiprocessing_helper, sanitize, short_name};
pub use own_code::is_own_code;
pub use rate::{RateError, RatePolicy};
pub use restart::{RestartDecision, RestartPolicy, RestartState};
pub use retention::{parse_size, RetentionError, RetentionPolicy, SizeError, SnapshotEntry};
