//! Which processes to profile.
//!
//! A process matches when it is named by pid, or when any include regex matches what runs, or
//! any command-line regex (`--match-cmdline`) its full command line, and no exclude regex
//! matches its full command line, its executable's name or its name. What runs is the name
//! pyfleet knows it by (`naming`), its executable's name, or its command line with every
//! word's directories left out (`/srv/venvs/gunicorn/bin/python /srv/venvs/gunicorn/bin/uvicorn
//! app:app` is `python uvicorn app:app`): what the user means by a program, never where an
//! interpreter or a script is installed. With no include rule and no pid at all, every Python
//! process matches. The profiler itself never matches.
//!
//! Label rules (`KEY=REGEX`, on the labels of [`LABEL_KEYS`]) narrow that: a process matches
//! only if every include label rule matches its label of that key (a process without the
//! label does not), and no exclude label rule does.

use regex::Regex;

/// A regex given by the user did not compile.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("invalid regex '{pattern}': {reason}")]
pub struct MatchError {
    pub pattern: String,
    pub reason: String,
}

/// The labels rules can name.
pub const LABEL_KEYS: [&str; 5] = ["service", "namespace", "pod", "pod_uid", "container_id"];

/// What the caller knows about a candidate process.
#[derive(Debug, Clone, Copy)]
pub struct ProcessFacts<'a> {
    pub pid: i32,
    /// The command line, arguments joined by spaces.
    pub cmdline: &'a str,
    /// The name pyfleet knows it by (`naming::short_name`), when the caller found it.
    pub name: &'a str,
    /// The executable's file name (e.g. `python3.12`).
    pub exe_name: &'a str,
    /// Its labels (`key`, `value`), if the caller found them.
    pub labels: &'a [(&'a str, &'a str)],
}

impl ProcessFacts<'_> {
    fn label(&self, key: &str) -> Option<&str> {
        self.labels.iter().find(|(k, _)| *k == key).map(|(_, v)| *v)
    }
}

/// A label rule (`KEY=REGEX`) the user gave is not one.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum LabelRuleError {
    #[error(
        "label rule '{0}' is not KEY=REGEX (keys: service, namespace, pod, pod_uid, container_id)"
    )]
    Shape(String),
    #[error(
        "unknown label '{key}' in '{rule}' (keys: service, namespace, pod, pod_uid, container_id)"
    )]
    Key { key: String, rule: String },
    #[error(transparent)]
    Regex(#[from] MatchError),
}

fn label_rule(rule: &str) -> Result<(&'static str, Regex), LabelRuleError> {
    let (key, pattern) = rule
        .split_once('=')
        .ok_or_else(|| LabelRuleError::Shape(rule.to_string()))?;
    let key = LABEL_KEYS
        .iter()
        .find(|k| **k == key.trim())
        .ok_or_else(|| LabelRuleError::Key {
            key: key.to_string(),
            rule: rule.to_string(),
        })?;
    Ok((key, compile(pattern)?))
}

#[derive(Debug, Clone, Default)]
pub struct MatchPolicy {
    include: Vec<Regex>,
    include_cmdline: Vec<Regex>,
    exclude: Vec<Regex>,
    pids: Vec<i32>,
    self_pid: Option<i32>,
    label_include: Vec<(&'static str, Regex)>,
    label_exclude: Vec<(&'static str, Regex)>,
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
            include_cmdline: Vec::new(),
            pids: pids.to_vec(),
            self_pid,
            label_include: Vec::new(),
            label_exclude: Vec::new(),
        })
    }

    /// Adds rules on the full command line (`--match-cmdline`, see the module documentation).
    pub fn with_cmdline_rules<I>(mut self, include: I) -> Result<Self, MatchError>
    where
        I: IntoIterator,
        I::Item: AsRef<str>,
    {
        for r in include {
            self.include_cmdline.push(compile(r.as_ref())?);
        }
        Ok(self)
    }

    /// Adds label rules (`KEY=REGEX`, see the module documentation).
    pub fn with_label_rules<I, E>(mut self, include: I, exclude: E) -> Result<Self, LabelRuleError>
    where
        I: IntoIterator,
        I::Item: AsRef<str>,
        E: IntoIterator,
        E::Item: AsRef<str>,
    {
        for r in include {
            self.label_include.push(label_rule(r.as_ref())?);
        }
        for r in exclude {
            self.label_exclude.push(label_rule(r.as_ref())?);
        }
        Ok(self)
    }

    /// Whether any rule looks at labels (the caller need not find them otherwise).
    pub fn uses_labels(&self) -> bool {
        !self.label_include.is_empty() || !self.label_exclude.is_empty()
    }

    fn labels_exclude(&self, p: &ProcessFacts<'_>) -> bool {
        self.label_exclude
            .iter()
            .any(|(k, r)| p.label(k).is_some_and(|v| r.is_match(v)))
    }

    fn labels_include(&self, p: &ProcessFacts<'_>) -> bool {
        self.label_include
            .iter()
            .all(|(k, r)| p.label(k).is_some_and(|v| r.is_match(v)))
    }

    /// True when the user named no process at all: then every Python process matches.
    pub fn matches_everything(&self) -> bool {
        self.include.is_empty() && self.include_cmdline.is_empty() && self.pids.is_empty()
    }

    /// The processes named by pid (`--pid`).
    pub fn named_pids(&self) -> &[i32] {
        &self.pids
    }

    /// When only the processes named by pid can match (no include pattern): those pids, so
    /// that a scan need not look at any other process.
    pub fn only_pids(&self) -> Option<&[i32]> {
        (self.include.is_empty() && self.include_cmdline.is_empty() && !self.pids.is_empty())
            .then_some(&self.pids[..])
    }

    /// Whether an exclude rule names this process (or it is the profiler itself).
    pub fn excludes(&self, p: &ProcessFacts<'_>) -> bool {
        let hit = |r: &Regex| {
            r.is_match(p.cmdline)
                || r.is_match(p.exe_name)
                || (!p.name.is_empty() && r.is_match(p.name))
        };
        Some(p.pid) == self.self_pid || self.exclude.iter().any(hit) || self.labels_exclude(p)
    }

    /// Whether to profile this process (the caller has established it runs Python).
    pub fn matches(&self, p: &ProcessFacts<'_>) -> bool {
        if self.excludes(p) || !self.labels_include(p) {
            return false;
        }
        if self.matches_everything() || self.pids.contains(&p.pid) {
            return true;
        }
        if self.include_cmdline.iter().any(|r| r.is_match(p.cmdline)) {
            return true;
        }
        if self.include.is_empty() {
            return false;
        }
        let runs = without_directories(p.cmdline);
        self.include.iter().any(|r| {
            (!p.name.is_empty() && r.is_match(p.name))
                || r.is_match(p.exe_name)
                || r.is_match(&runs)
        })
    }
}

/// `cmdline` with every word's directories left out (`/a/b/uvicorn` is `uvicorn`, `app/` is
/// `app`): what runs, without where it is installed.
pub fn without_directories(cmdline: &str) -> String {
    cmdline
        .split(' ')
        .map(|w| {
            let trimmed = w.trim_end_matches('/');
            trimmed.rsplit('/').next().unwrap_or(trimmed)
        })
        .collect::<Vec<_>>()
        .join(" ")
}

#[cfg(test)]
mod tests {
    use super::*;

    fn facts<'a>(pid: i32, cmdline: &'a str, exe_name: &'a str) -> ProcessFacts<'a> {
        ProcessFacts {
            pid,
            cmdline,
            name: "",
            exe_name,
            labels: &[],
        }
    }

    #[test]
    fn a_program_is_matched_by_what_runs_not_where_it_is_installed() {
        let none: [&str; 0] = [];
        let p = MatchPolicy::new(["gunicorn"], none, &[], None).unwrap();
        // A uvicorn worker whose venv's path says gunicorn: not a gunicorn.
        let uvicorn = "/srv/gunicorn/venv/bin/python /srv/gunicorn/venv/bin/uvicorn app:app";
        assert!(!p.matches(&facts(1, uvicorn, "python3.12")));
        // gunicorn by its launcher, its title or its name.
        assert!(p.matches(&facts(
            2,
            "/srv/venv/bin/python /srv/venv/bin/gunicorn app",
            "python3"
        )));
        assert!(p.matches(&facts(3, "gunicorn: worker [app]", "python3.12")));
        let named = ProcessFacts {
            name: "gunicorn",
            ..facts(4, "python3 -m something", "python3")
        };
        assert!(p.matches(&named));
        // The full command line only when asked.
        let full = MatchPolicy::new(none, none, &[], None)
            .unwrap()
            .with_cmdline_rules(["/srv/gunicorn/"])
            .unwrap();
        assert!(full.matches(&facts(1, uvicorn, "python3.12")));
        assert!(!full.matches_everything());
        // Excluding by an install path still works.
        let ex = MatchPolicy::new(none, ["/srv/gunicorn/"], &[], None).unwrap();
        assert!(!ex.matches(&facts(1, uvicorn, "python3.12")));
        assert_eq!(
            without_directories("python3 app/ /a/b/c.py -x"),
            "python3 app c.py -x"
        );
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

    #[test]
    fn label_rules_narrow_and_exclude() {
        let none: [&str; 0] = [];
        let p = MatchPolicy::new(["gunicorn"], none, &[], None)
            .unwrap()
            .with_label_rules(["namespace=^prod$", "service=api|web"], ["pod=canary"])
            .unwrap();
        assert!(p.uses_labels());
        let prod_api: &[(&str, &str)] =
            &[("namespace", "prod"), ("service", "api"), ("pod", "api-1")];
        let with = |labels| ProcessFacts {
            pid: 1,
            name: "",
            cmdline: "gunicorn app:app",
            exe_name: "python3.12",
            labels,
        };
        assert!(p.matches(&with(prod_api)));
        // Every include rule must match; a missing label does not.
        assert!(!p.matches(&with(&[("namespace", "prod")])));
        assert!(!p.matches(&with(&[("namespace", "staging"), ("service", "api")])));
        // Any exclude rule excludes.
        let canary: &[(&str, &str)] = &[
            ("namespace", "prod"),
            ("service", "web"),
            ("pod", "web-canary"),
        ];
        assert!(!p.matches(&with(canary)));
        assert!(p.excludes(&with(canary)));
        // Label rules alone select among every Python process.
        let only = MatchPolicy::new(none, none, &[], None)
            .unwrap()
            .with_label_rules(["namespace=prod"], none)
            .unwrap();
        assert!(only.matches(&with(prod_api)));
        assert!(!only.matches(&with(&[])));
    }

    #[test]
    fn bad_label_rules_say_why_in_one_line() {
        let none: [&str; 0] = [];
        let base = || MatchPolicy::new(none, none, &[], None).unwrap();
        for (rule, says) in [
            ("namespace", "is not KEY=REGEX"),
            ("color=red", "unknown label 'color'"),
            ("pod=(", "invalid regex"),
        ] {
            let e = base()
                .with_label_rules([rule], none)
                .unwrap_err()
                .to_string();
            assert!(e.contains(says), "{rule}: {e}");
            assert!(!e.contains('\n'), "{e}");
        }
    }
}
