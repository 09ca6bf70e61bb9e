//! Thread ids across pid namespaces.
//!
//! CPython records a thread's native id (`gettid()`) as the thread's own pid namespace sees
//! it: in a container that is 1, 2, 3..., not the id under which pyfleet finds the thread in
//! /proc. [`ThreadIds`] maps the target's ids to ours through the `NSpid` line of
//! `/proc/PID/task/TID/status` (our id first, the innermost namespace's last). For a target in
//! pyfleet's own pid namespace the map is the identity and costs nothing.
//!
//! Bounds: at most [`MAX_MAPPED`] threads are mapped, and the task list is read again at most
//! once per [`ThreadIds::begin`] (once per sample), on the first id it does not know.

use rustc_hash::FxHashMap;

/// Most threads of one target whose ids are mapped.
pub const MAX_MAPPED: usize = 1 << 16;

/// A target's thread ids as its namespace sees them, mapped to pyfleet's.
#[derive(Debug)]
pub struct ThreadIds {
    pid: i32,
    /// `None`: the target shares pyfleet's pid namespace (ids are the same).
    map: Option<FxHashMap<u64, i32>>,
    /// The task list was read again since the last [`ThreadIds::begin`].
    refreshed: bool,
}

impl ThreadIds {
    pub fn new(pid: i32) -> Self {
        let ours = std::fs::read_link("/proc/self/ns/pid").ok();
        let theirs = std::fs::read_link(format!("/proc/{pid}/ns/pid")).ok();
        let other = matches!((ours, theirs), (Some(a), Some(b)) if a != b);
        let mut ids = ThreadIds {
            pid,
            map: other.then(FxHashMap::default),
            refreshed: false,
        };
        ids.refresh();
        ids
    }

    /// Whether the target lives in another pid namespace than pyfleet.
    pub fn namespaced(&self) -> bool {
        self.map.is_some()
    }

    /// A new sample starts: an unknown id may read the task list again.
    pub fn begin(&mut self) {
        self.refreshed = false;
    }

    /// Our id of the thread the target knows as `tid`; `None` if no thread of the target has
    /// that id in its namespace (it exited, or the id is garbage).
    pub fn host(&mut self, tid: u64) -> Option<i32> {
        let Some(map) = &self.map else {
            return i32::try_from(tid).ok().filter(|&t| t > 0);
        };
        if let Some(&h) = map.get(&tid) {
            return Some(h);
        }
        if self.refreshed {
            return None;
        }
        self.refresh();
        self.map.as_ref()?.get(&tid).copied()
    }

    fn refresh(&mut self) {
        self.refreshed = true;
        let Some(map) = self.map.as_mut() else {
            return;
        };
        map.clear();
        let Ok(dir) = std::fs::read_dir(format!("/proc/{}/task", self.pid)) else {
            return;
        };
        for entry in dir.flatten().take(MAX_MAPPED) {
            let Some(host) = entry
                .file_name()
                .to_str()
                .and_then(|s| s.parse::<i32>().ok())
            else {
                continue;
            };
            let status = std::fs::read_to_string(format!("/proc/{}/task/{host}/status", self.pid));
            if let Some(inner) = status.ok().as_deref().and_then(innermost_id) {
                map.insert(inner, host);
            }
        }
    }
}

/// The innermost namespace's id from a status file's `NSpid:` line (the last field).
fn innermost_id(status: &str) -> Option<u64> {
    status
        .lines()
        .find_map(|l| l.strip_prefix("NSpid:"))?
        .split_whitespace()
        .last()?
        .parse()
        .ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_the_innermost_id() {
        let status = "Name:\tpython3\nTgid:\t4242\nNSpid:\t4242\t17\t1\nPPid:\t1\n";
        assert_eq!(innermost_id(status), Some(1));
        assert_eq!(innermost_id("NSpid:\t99\n"), Some(99));
        assert_eq!(innermost_id("Name:\tx\n"), None);
    }

    #[test]
    fn own_threads_map_to_themselves() {
        let me = std::process::id() as i32;
        let mut ids = ThreadIds::new(me);
        assert!(!ids.namespaced());
        assert_eq!(ids.host(me as u64), Some(me));
        assert_eq!(ids.host(0), None);
    }
}
