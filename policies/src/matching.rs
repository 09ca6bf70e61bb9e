//! Which processes to profile.
//!
//! A process matches when it is named by pid, or when any include regex matches its full
//! command line or its executable's name, and no exclude regex does. With no include rule and
//! no pid at all, every Python process matches. The profiler itself never matches.

use regex::Regex;

/// A regex given by the user did not compile.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("invalid regex '{pattern}': {reason}")]
pub struct MatchError {
    pub pattern: String,
    pub reason: String,
}

/// What the caller knows about a candidate process.
#[derive(Debug, Clone, Copy)]
pub struct ProcessFacts<'a> {
    pub pid: i32,
    /// The command line, arguments joined by spaces.
    pub cmdline: &'a str,
    /// The executable's file name (e.g. `python3.12`).
    pub exe_name: &'a str,
}

#[derive(Debug, Clone, Default)]
pub struct MatchPolicy {
    include: Vec<Regex>,
    exclude: Vec<Regex>,
    pids: Vec<i32>,
    self_pid: Option<i32>,
}

fn compile(pattern: &str) -> Result<Regex, MatchError> {
    Regex::new(pattern).map_err(|e| MatchError {
        pattern: pattern.to_string(),
        // regex's syntax errors are drawn over several lines; keep the last, which says why.
        reason: e
            .to_string()
            .lines()
            .rev()
            .find(|l| !l.trim().is_empty())
            .unwrap_or("")
            .trim()
            .trim_start_matches("error: ")
            .to_string(),
    })
}

impl MatchPolicy {
    /// Builds the policy; `self_pid` is the profiler's own pid, never matched.
    pub fn new<I, E>(
        include: I,
        exclude: E,
        pids: &[i32],
        self_pid: Option<i32>,
    ) -> Result<Self, MatchError>
    where
        I: IntoIterator,
        I::Item: AsRef<str>,
        E: IntoIterator,
        E::Item: AsRef<str>,
    {
        Ok(MatchPolicy {
            include: include
                .into_iter()
                .map(|p| compile(p.as_ref()))
                .collect::<Result<_, _>>()?,
            exclude: exclude
                .into_iter()
                .map(|p| compile(p.as_ref()))
                .collect::<Result<_, _>>()?,
            pids: pids.to_vec(),
            self_pid,
        })
    }

    /// True when the user named no process at all: then every Python process matches.
    pub fn matches_everything(&self) -> bool {
        self.include.is_empty() && self.pids.is_empty()
    }

    /// When only the processes named by pid can match (no include pattern): those pids, so
    /// that a scan need not look at any other process.
    pub fn only_pids(&self) -> Option<&[i32]> {
        (self.include.is_empty() && !self.pids.is_empty()).then_some(&self.pids[..])
    }

    /// Whether an exclude rule names this process (or it is the profiler itself).
    pub fn excludes(&self, p: &ProcessFacts<'_>) -> bool {
        Some(p.pid) == self.self_pid
            || self
                .exclude
                .iter()
                .any(|r| r.is_match(p.cmdline) || r.is_match(p.exe_name))
    }

    /// Whether to profile this process (the caller has established it runs Python).
    pub fn matches(&self, p: &ProcessFacts<'_>) -> bool {
        if Some(p.pid) == self.self_pid {
            return false;
        }
        let hit = |r: &Regex| r.is_match(p.cmdline) || r.is_match(p.exe_name);
        if self.exclude.iter().any(hit) {
            return false;
        }
        self.matches_everything() || self.pids.contains(&p.pid) || self.include.iter().any(hit)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn facts<'a>(pid: i32, cmdline: &'a str, exe_name: &'a str) -> ProcessFacts<'a> {
        ProcessFacts {
            pid,
            cmdline,
            exe_name,
        }
    }

    #[test]
    fn no_rules_match_everything_but_self() {
        let p = MatchPolicy::new::<[&str; 0], [&str; 0]>([], [], &[], Some(7)).unwrap();
        assert!(p.matches_everything());
        assert!(p.matches(&facts(1, "python x.py", "python3")));
        assert!(!p.matches(&facts(7, "pyfleet", "pyfleet")));
    }

    #[test]
    fn only_named_pids_limit_the_scan() {
        let none: [&str; 0] = [];
        let p = MatchPolicy::new(none, ["x"], &[4, 2], None).unwrap();
        assert_eq!(p.only_pids(), Some(&[4, 2][..]));
        let q = MatchPolicy::new(["gunicorn"], none, &[4], None).unwrap();
        assert_eq!(q.only_pids(), None, "a pattern can match any process");
        let r = MatchPolicy::new(none, none, &[], None).unwrap();
        assert_eq!(r.only_pids(), None, "no rule matches every process");
    }

    #[test]
    fn include_exclude_and_pids() {
        let p = MatchPolicy::new(["gunicorn"], ["master"], &[42], None).unwrap();
        assert!(p.matches(&facts(1, "python /v/bin/gunicorn app:wsgi", "python3.12")));
        assert!(!p.matches(&facts(2, "gunicorn: master [app]", "python3.12")));
        assert!(!p.matches(&facts(3, "python celery worker", "python3.12")));
        assert!(p.matches(&facts(42, "python celery worker", "python3.12")));
        // Exclusion wins over an explicit pid too: the user said not that one.
        assert!(!p.matches(&facts(42, "gunicorn: master", "python3.12")));
        // The executable name counts as well as the command line.
        let q = MatchPolicy::new(["^python3\\.15$"], [] as [&str; 0], &[], None).unwrap();
        assert!(q.matches(&facts(
            5,
            "/usr/bin/python3.15 -m http.server",
            "python3.15"
        )));
        assert!(!q.matches(&facts(5, "python3.15 -m http.server", "python3.1")));
    }

    #[test]
    fn bad_regex_is_one_line() {
        let e = MatchPolicy::new(["("], [] as [&str; 0], &[], None).unwrap_err();
        let msg = e.to_string();
        assert!(msg.starts_with("invalid regex '('"), "{msg}");
        assert_eq!(msg.lines().count(), 1, "{msg}");
        assert!(MatchPolicy::new(["ok"], ["[z-a]"], &[], None).is_err());
    }
}
