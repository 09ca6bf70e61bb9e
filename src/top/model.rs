//! What `pyfleet top` shows, counted: every sample since the start (or the last reset), per
//! process, by function (`function (file's base name)`): own (the innermost frame) and total
//! (anywhere in the stack, once per sample), with each process's shares of samples on a CPU,
//! holding the GIL and waiting for it. Pure: fed samples, asked for rows.
//!
//! Bounded: at most [`MAX_PROCESSES`] processes and [`MAX_FUNCTIONS`] functions per process
//! (samples past either bound are counted under `[other]`); labels at most [`MAX_LABEL`]
//! characters. Labels are target strings: the view makes them safe for the terminal.

use pyfleet_actors::{FrameInfo, Snapshot, ThreadStatus};
use std::collections::{BTreeMap, HashMap, HashSet};

/// Processes counted; samples of others go to an `[other]` process.
pub const MAX_PROCESSES: usize = 4096;
/// Functions counted per process; samples whose functions are past it count as `[other]`.
pub const MAX_FUNCTIONS: usize = 20_000;
/// Characters of a function's label.
pub const MAX_LABEL: usize = 160;
/// The label standing for what is past a bound.
pub const OTHER: &str = "[other]";

/// Which processes the table counts.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Scope {
    Fleet,
    Process(i32),
}

/// The table's order.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SortKey {
    Own,
    Total,
    Name,
}

impl SortKey {
    pub fn as_str(self) -> &'static str {
        match self {
            SortKey::Own => "own",
            SortKey::Total => "total",
            SortKey::Name => "name",
        }
    }
}

/// One function's row.
#[derive(Debug, Clone, PartialEq)]
pub struct Row {
    pub label: String,
    pub own: u64,
    pub total: u64,
    /// Of the scope's samples, 0 to 1.
    pub own_share: f64,
    pub total_share: f64,
    /// With several processes in scope: the one with most of the function's samples
    /// (`name-pid`), and how many others have some.
    pub process: Option<(String, usize)>,
}

impl Row {
    /// The label, naming the process when the row has one: `fib (app.py) in web-4243 and 2
    /// others`.
    pub fn shown(&self) -> String {
        match &self.process {
            Some((name, 0)) => format!("{} in {name}", self.label),
            Some((name, 1)) => format!("{} in {name} and 1 other", self.label),
            Some((name, n)) => format!("{} in {name} and {n} others", self.label),
            None => self.label.clone(),
        }
    }
}

/// The scope's samples and their states.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct Summary {
    pub processes: usize,
    pub samples: u64,
    pub on_cpu: u64,
    pub holds_gil: u64,
    pub waits_gil: u64,
    /// The rate the scope's samples were taken at (samples over the time they stand for),
    /// when the snapshots said that time.
    pub rate_hz: Option<f64>,
}

#[derive(Debug, Default)]
struct Process {
    name: String,
    samples: u64,
    on_cpu: u64,
    holds_gil: u64,
    waits_gil: u64,
    /// Samples whose time the snapshots said, and that time.
    timed: u64,
    sampled: std::time::Duration,
    /// (own, total) by label.
    functions: HashMap<String, (u64, u64)>,
}

/// Samples counted since the start or the last [`reset`](TopModel::reset).
#[derive(Debug, Default)]
pub struct TopModel {
    processes: BTreeMap<i32, Process>,
}

/// `function (file's base name)`, at most [`MAX_LABEL`] characters.
pub fn label(f: &FrameInfo) -> String {
    let base = f.file.rsplit('/').next().unwrap_or(&f.file);
    format!("{} ({base})", f.function)
        .chars()
        .take(MAX_LABEL)
        .collect()
}

impl TopModel {
    /// Forgets every count.
    pub fn reset(&mut self) {
        self.processes.clear();
    }

    /// Counts `count` samples of one stack (`frames` innermost first) of process `pid`.
    pub fn add(
        &mut self,
        pid: i32,
        name: &str,
        status: ThreadStatus,
        frames: &[FrameInfo],
        count: u64,
    ) {
        if count == 0 {
            return;
        }
        let pid = match self.processes.len() < MAX_PROCESSES || self.processes.contains_key(&pid) {
            true => pid,
            false => -1,
        };
        let p = self.processes.entry(pid).or_insert_with(|| Process {
            name: match pid {
                -1 => OTHER.to_string(),
                _ => name.chars().take(MAX_LABEL).collect(),
            },
            ..Process::default()
        });
        p.samples += count;
        p.on_cpu += u64::from(status.on_cpu) * count;
        p.holds_gil += u64::from(status.holds_gil) * count;
        p.waits_gil += u64::from(status.waits_gil) * count;
        let mut seen: HashSet<String> = HashSet::with_capacity(frames.len());
        for (i, f) in frames.iter().enumerate() {
            // A task is what its coroutines are: the frames naming tasks are no functions.
            if crate::output::views::is_task_frame(f) {
                continue;
            }
            let mut l = label(f);
            if p.functions.len() >= MAX_FUNCTIONS && !p.functions.contains_key(&l) {
                l = OTHER.to_string();
            }
            if !seen.insert(l.clone()) {
                continue;
            }
            let e = p.functions.entry(l).or_default();
            if i == 0 {
                e.0 += count;
            }
            e.1 += count;
        }
    }

    /// Counts every sample of `snap`.
    pub fn add_snapshot(&mut self, snap: &Snapshot) {
        for p in &snap.processes {
            for (status, frames, count) in &p.samples {
                self.add(p.pid, &p.name, *status, frames, *count);
            }
            if p.sampled.is_zero() {
                continue;
            }
            let key = match self.processes.contains_key(&p.pid) {
                true => p.pid,
                false => -1,
            };
            if let Some(q) = self.processes.get_mut(&key) {
                q.timed += p.total();
                q.sampled = q.sampled.saturating_add(p.sampled);
            }
        }
    }

    /// The processes counted, by pid, with their names.
    pub fn processes(&self) -> Vec<(i32, &str)> {
        self.processes
            .iter()
            .map(|(&pid, p)| (pid, p.name.as_str()))
            .collect()
    }

    fn in_scope(&self, scope: Scope) -> impl Iterator<Item = &Process> {
        self.processes
            .iter()
            .filter(move |(&pid, _)| scope == Scope::Fleet || scope == Scope::Process(pid))
            .map(|(_, p)| p)
    }

    pub fn summary(&self, scope: Scope) -> Summary {
        let mut s = Summary::default();
        let (mut timed, mut sampled) = (0u64, std::time::Duration::ZERO);
        for p in self.in_scope(scope) {
            s.processes += 1;
            s.samples += p.samples;
            s.on_cpu += p.on_cpu;
            s.holds_gil += p.holds_gil;
            s.waits_gil += p.waits_gil;
            timed += p.timed;
            sampled = sampled.saturating_add(p.sampled);
        }
        s.rate_hz = pyfleet_actors::rate_hz(timed, sampled);
        s
    }

    /// The scope's functions whose label holds `filter` (ignoring case; empty: every one),
    /// sorted by `sort` (counts highest first, names alphabetically; ties by name).
    pub fn rows(&self, scope: Scope, sort: SortKey, filter: &str) -> Vec<Row> {
        // (own, total, the process with most of its samples: (total, pid), processes).
        type Counts = (u64, u64, (u64, i32), usize);
        let mut by_label: HashMap<&str, Counts> = HashMap::new();
        let mut samples = 0u64;
        let mut processes = 0usize;
        for (&pid, p) in self
            .processes
            .iter()
            .filter(|(&pid, _)| scope == Scope::Fleet || scope == Scope::Process(pid))
        {
            samples += p.samples;
            processes += 1;
            for (l, (own, total)) in &p.functions {
                let e = by_label.entry(l.as_str()).or_default();
                e.0 += own;
                e.1 += total;
                e.3 += 1;
                if (*total, std::cmp::Reverse(pid)) > (e.2 .0, std::cmp::Reverse(e.2 .1)) {
                    e.2 = (*total, pid);
                }
            }
        }
        let process_name = |pid: i32| match self.processes.get(&pid) {
            Some(p) if pid >= 0 => format!("{}-{pid}", p.name),
            Some(p) => p.name.clone(),
            None => pid.to_string(),
        };
        let filter = filter.to_lowercase();
        let share = |n: u64| n as f64 / samples.max(1) as f64;
        let mut rows: Vec<Row> = by_label
            .into_iter()
            .filter(|(l, _)| filter.is_empty() || l.to_lowercase().contains(&filter))
            .map(|(l, (own, total, (_, top), with))| Row {
                label: l.to_string(),
                own,
                total,
                own_share: share(own),
                total_share: share(total),
                process: (processes > 1).then(|| (process_name(top), with.saturating_sub(1))),
            })
            .collect();
        rows.sort_by(|a, b| {
            let by = match sort {
                SortKey::Own => b.own.cmp(&a.own),
                SortKey::Total => b.total.cmp(&a.total),
                SortKey::Name => std::cmp::Ordering::Equal,
            };
            by.then_with(|| a.label.cmp(&b.label))
        });
        rows
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn f(name: &str) -> FrameInfo {
        FrameInfo::new(name, "/srv/app.py", Some(1))
    }

    fn status(on_cpu: bool, holds_gil: bool, waits_gil: bool) -> ThreadStatus {
        ThreadStatus {
            on_cpu,
            holds_gil,
            waits_gil,
        }
    }

    #[test]
    fn own_and_total_per_process_and_for_the_fleet() {
        let mut m = TopModel::default();
        // Innermost first; recursion counts once in total.
        m.add(
            1,
            "web",
            status(true, true, false),
            &[f("leaf"), f("mid"), f("mid"), f("main")],
            6,
        );
        m.add(
            1,
            "web",
            status(false, false, true),
            &[f("mid"), f("main")],
            2,
        );
        m.add(2, "job", status(true, false, false), &[f("crunch")], 2);
        let fleet = m.rows(Scope::Fleet, SortKey::Own, "");
        assert_eq!(fleet[0].label, "leaf (app.py)");
        assert_eq!((fleet[0].own, fleet[0].total), (6, 6));
        assert!((fleet[0].own_share - 0.6).abs() < 1e-9);
        let mid = fleet.iter().find(|r| r.label == "mid (app.py)").unwrap();
        assert_eq!((mid.own, mid.total), (2, 8));
        let by_total = m.rows(Scope::Fleet, SortKey::Total, "");
        assert_eq!(by_total[0].label, "main (app.py)");
        let by_name = m.rows(Scope::Fleet, SortKey::Name, "");
        assert_eq!(by_name[0].label, "crunch (app.py)");
        let one = m.rows(Scope::Process(2), SortKey::Own, "");
        assert_eq!(one.len(), 1);
        assert!((one[0].own_share - 1.0).abs() < 1e-9);
        // The fleet's rows name the process that burns it; one process's do not.
        assert_eq!(fleet[0].shown(), "leaf (app.py) in web-1");
        assert_eq!(one[0].shown(), "crunch (app.py)");
        assert_eq!(m.rows(Scope::Fleet, SortKey::Own, "MID").len(), 1);
        let s = m.summary(Scope::Process(1));
        assert_eq!(
            (s.samples, s.on_cpu, s.holds_gil, s.waits_gil),
            (8, 6, 6, 2)
        );
        assert_eq!(m.summary(Scope::Fleet).processes, 2);
        m.add(3, "web", status(true, true, false), &[f("leaf")], 1);
        let fleet = m.rows(Scope::Fleet, SortKey::Own, "");
        assert_eq!(fleet[0].shown(), "leaf (app.py) in web-1 and 1 other");
        m.reset();
        assert_eq!(m.summary(Scope::Fleet).samples, 0);
    }

    #[test]
    fn functions_and_processes_past_the_bounds_are_other() {
        let mut m = TopModel::default();
        for i in 0..MAX_FUNCTIONS + 10 {
            m.add(1, "p", ThreadStatus::default(), &[f(&format!("f{i}"))], 1);
        }
        let rows = m.rows(Scope::Fleet, SortKey::Own, "");
        assert_eq!(rows.len(), MAX_FUNCTIONS + 1);
        assert_eq!(rows[0].label, OTHER);
        assert_eq!(rows[0].own, 10);
        for pid in 0..MAX_PROCESSES as i32 + 3 {
            m.add(pid + 10, "q", ThreadStatus::default(), &[f("x")], 1);
        }
        assert!(m.processes().len() <= MAX_PROCESSES + 1);
        assert!(m
            .processes()
            .iter()
            .any(|(pid, name)| *pid == -1 && *name == OTHER));
    }
}
