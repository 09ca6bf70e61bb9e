//! What to sample and how: the options `run` and `record` share, defined once with their
//! docs. Each command flattens [`SamplingOptions`] into its clap arguments, and `run`'s config
//! file takes them under the same names (`config`); [`SamplingOptions::resolve`] validates
//! them the same way for both, so a mistake is the same one-line error wherever it is made.
//!
//! Owns parsing and validation only.

use pyfleet_policies::{FileMode, MatchPolicy, Mode, RatePolicy, Role};
use serde::Deserialize;

/// The shared options, as clap parses them and as a config file holds them (which keys are
/// unknown is for the file's reader to say: it holds other options too).
#[derive(Debug, Clone, Default, clap::Args, Deserialize)]
#[serde(default, rename_all = "kebab-case")]
pub struct SamplingOptions {
    /// Profile the Python processes whose program matches REGEX: its name (see `pyfleet
    /// list`), its executable's name, or its command line without directories (where an
    /// interpreter or a script is installed is left out); repeatable: any may match; those
    /// that start later too. `run` with no --match, --pid or --match-label profiles every
    /// Python process on the host.
    #[arg(long = "match", short = 'm', value_name = "REGEX")]
    #[serde(rename = "match")]
    pub matches: Vec<String>,
    /// Profile the Python processes whose full command line matches REGEX, directories
    /// included (repeatable).
    #[arg(long, value_name = "REGEX")]
    pub match_cmdline: Vec<String>,
    /// Never profile processes matching REGEX (repeatable; wins over --match and --pid).
    #[arg(long, value_name = "REGEX")]
    pub exclude: Vec<String>,
    /// Profile this process (repeatable).
    #[arg(long = "pid", short = 'p', value_name = "PID")]
    #[serde(rename = "pid")]
    pub pids: Vec<i32>,
    /// Profile the Python processes whose label KEY matches REGEX, as KEY=REGEX (repeatable:
    /// every one must match; keys: service, namespace, pod, pod_uid, container_id; see
    /// `pyfleet list`). A process without that label does not match.
    #[arg(long, value_name = "KEY=REGEX")]
    pub match_label: Vec<String>,
    /// Never profile processes whose label KEY matches REGEX (repeatable).
    #[arg(long, value_name = "KEY=REGEX")]
    pub exclude_label: Vec<String>,
    /// Never profile processes in this role: master (the parent of workers of its own name,
    /// such as a gunicorn master), worker, helper (multiprocessing's resource tracker or
    /// forkserver) or single (repeatable; see `pyfleet list`).
    #[arg(long, value_name = "ROLE")]
    pub exclude_role: Vec<String>,
    /// Also profile every Python descendant of a matched process, however it was started
    /// (fork, multiprocessing's spawn or forkserver, subprocess), found within a scan.
    #[arg(long)]
    pub subprocesses: bool,
    /// Samples per second per process [default: 100].
    #[arg(long, short = 'r', value_name = "HZ")]
    pub rate: Option<f64>,
    /// Which thread samples count: cpu (threads on a CPU: where the CPU goes), wall (every
    /// thread, waiting too: where the time goes), gil (the thread holding the GIL)
    /// [default: cpu].
    #[arg(long, value_name = "cpu|wall|gil")]
    pub mode: Option<String>,
    /// How stacks are taken: kernel (the kernel copies a running thread's frames at its
    /// CPU's sampling interrupt, and in wall and gil modes a thread's as it leaves its CPU:
    /// one instant each, never stopping it; needs root), reads (pyfleet reads each target's
    /// memory at each tick), or auto (kernel where it can, else reads) [default: auto].
    #[arg(long, value_name = "auto|reads|kernel")]
    pub capture: Option<String>,
    /// Never write to target processes (no 3.15 frame-cache marker; results stay exact).
    #[arg(long)]
    pub read_only: bool,
    /// Pause the target's threads for each sample (ptrace), so that every stack is one
    /// instant's; costs the target a short stop per sample (see docs/reference.md).
    #[arg(long)]
    pub blocking: bool,
    /// Tell idle threads by the kernel's log of context switches (needs CAP_PERFMON): a sample
    /// of a process that has not run costs no syscall, but every context switch on the host
    /// costs a little more while pyfleet runs (see docs/reference.md).
    #[arg(long)]
    pub switch_log: bool,
    /// Permission bits of the files written, octal: read and write bits only, the owner's
    /// always; directories get search where read is allowed (0640 gives 0750). Set exactly,
    /// whatever the umask [default: 0600, the owner only].
    #[arg(long, value_name = "OCTAL")]
    pub file_mode: Option<String>,
    /// Fold frames by function, without line numbers: one box per function however many of
    /// its lines were sampled.
    #[arg(long)]
    pub function: bool,
    /// Root each thread's stacks at a frame naming the thread (`thread NAME`, the threading
    /// module's name of the thread, else the kernel's, in file `tid TID`).
    #[arg(long)]
    pub threads: bool,
    /// What stacks are told apart by besides their process (repeatable, or comma-separated):
    /// thread (each thread's stacks rooted at a frame naming it, as --threads), task (with
    /// --async, each asyncio task's frames topped by a frame naming it). By default the tasks
    /// that run the same code merge, as all requests to one endpoint do, and pprof labels
    /// each sample with its task.
    #[arg(long, value_name = "thread|task", value_delimiter = ',')]
    pub group_by: Vec<String>,
    /// Wall mode: keep the samples of threads off their CPU that wait for work (a pool's
    /// idle workers, an idle event loop); by default they are left out.
    #[arg(long, conflicts_with = "no_idle")]
    pub idle: bool,
    /// Wall mode: leave out the samples of threads off their CPU that wait for work (the
    /// default).
    #[arg(long)]
    pub no_idle: bool,
    /// asyncio task stacks (Python 3.14+): a sample of a thread that runs a task shows the
    /// task's frames under the frames of the tasks awaiting it, each task's topped by a frame
    /// naming it (`task NAME`) (see docs/reference.md).
    #[arg(long = "async")]
    #[serde(rename = "async")]
    pub tasks: bool,
    /// With --async: running (the task each thread runs, in place of its stack) or all (every
    /// task at each tick, waiting ones too, read from outside; wall mode, the mode it implies)
    /// [default: running].
    #[arg(long, value_name = "running|all")]
    pub async_mode: Option<String>,
    /// After `--`: a program to start and profile, with its Python subprocesses, from its
    /// start until it exits (`pyfleet run -- gunicorn app:app`, `pyfleet record -o out.svg --
    /// python app.py`); Ctrl-C goes to it, and its exit status becomes pyfleet's.
    #[arg(last = true, value_name = "COMMAND")]
    #[serde(skip)]
    pub command: Vec<String>,
}

/// The shared options, validated.
#[derive(Debug, Clone)]
pub struct Sampling {
    pub policy: MatchPolicy,
    pub matches: Vec<String>,
    /// The `--match-cmdline` rules.
    pub match_cmdline: Vec<String>,
    pub pids: Vec<i32>,
    /// The `--match-label` rules.
    pub labels: Vec<String>,
    pub exclude_roles: Vec<Role>,
    /// Descendants profiled too (`--subprocesses`, and always for a program started).
    pub subprocesses: bool,
    pub rate: RatePolicy,
    pub mode: Mode,
    /// `--capture`, resolved for the mode and the other options (`Auto`: the kernel capture
    /// if it starts).
    pub capture: crate::capture::Capture,
    pub read_only: bool,
    pub blocking: bool,
    pub switch_log: bool,
    /// The bits of the files (and directories) written.
    pub file_mode: FileMode,
    /// Frames folded by function (`--function`).
    pub by_function: bool,
    /// Stacks rooted at their thread (`--threads`, `--group-by thread`).
    pub threads: bool,
    /// Whether asyncio tasks' frames naming them are kept (`--group-by task`).
    pub task_frames: crate::output::views::TaskFrames,
    /// Wall mode without `--idle`: threads and tasks waiting for work left out, and helper
    /// processes not named by pid.
    pub leave_out_idle: bool,
    /// `--async`: which tasks a sample shows.
    pub tasks: Option<crate::cpython::asyncio::TaskScope>,
    /// The program to start (`-- COMMAND`), if any: the policy then matches nothing until
    /// the command names the program's pid.
    pub command: Vec<String>,
}

/// `--group-by` values, checked: (by thread, by task).
fn parse_group_by(keys: &[String]) -> Result<(bool, bool), String> {
    let (mut thread, mut task) = (false, false);
    for key in keys {
        match key.trim() {
            "thread" => thread = true,
            "task" => task = true,
            // Every profile is told apart by process.
            "process" => {}
            other => {
                return Err(format!(
                    "--group-by: unknown key '{}' (expected thread, task or process)",
                    crate::output::for_terminal(other)
                ))
            }
        }
    }
    Ok((thread, task))
}

/// `--exclude-role` values, checked.
fn parse_roles(names: &[String]) -> Result<Vec<Role>, String> {
    names
        .iter()
        .map(|n| {
            n.parse::<Role>()
                .map_err(|e| format!("--exclude-role: {e}"))
        })
        .collect()
}

impl Sampling {
    /// The host scan these options ask for: which processes, with their Python descendants
    /// or not, roles left out, and helpers when idle ones are.
    pub fn discovery(&self) -> crate::discovery::HostDiscovery {
        crate::discovery::HostDiscovery::new(self.policy.clone())
            .with_subprocesses(self.subprocesses)
            .excluding_roles(&self.exclude_roles)
            .leaving_out_helpers(self.leave_out_idle)
    }
}

impl SamplingOptions {
    /// These options over `file`'s (a config file's): a value given here wins, lists given
    /// here replace the file's.
    pub fn over(self, file: SamplingOptions) -> SamplingOptions {
        fn list<T>(a: Vec<T>, b: Vec<T>) -> Vec<T> {
            if a.is_empty() {
                b
            } else {
                a
            }
        }
        // The command line's choice between --idle and --no-idle, if it makes one.
        let idle_given = self.idle || self.no_idle;
        SamplingOptions {
            matches: list(self.matches, file.matches),
            match_cmdline: list(self.match_cmdline, file.match_cmdline),
            exclude: list(self.exclude, file.exclude),
            pids: list(self.pids, file.pids),
            match_label: list(self.match_label, file.match_label),
            exclude_label: list(self.exclude_label, file.exclude_label),
            exclude_role: list(self.exclude_role, file.exclude_role),
            subprocesses: self.subprocesses || file.subprocesses,
            rate: self.rate.or(file.rate),
            mode: self.mode.or(file.mode),
            capture: self.capture.or(file.capture),
            read_only: self.read_only || file.read_only,
            blocking: self.blocking || file.blocking,
            switch_log: self.switch_log || file.switch_log,
            file_mode: self.file_mode.or(file.file_mode),
            function: self.function || file.function,
            threads: self.threads || file.threads,
            group_by: list(self.group_by, file.group_by),
            tasks: self.tasks || file.tasks,
            async_mode: self.async_mode.or(file.async_mode),
            idle: if idle_given { self.idle } else { file.idle },
            no_idle: if idle_given {
                self.no_idle
            } else {
                file.no_idle
            },
            command: self.command,
        }
    }

    /// Validates the options; `self_pid` is never matched, `max_cpu_percent` is the command's
    /// budget. Errors are one line.
    pub fn resolve(self, self_pid: i32, max_cpu_percent: f64) -> Result<Sampling, String> {
        let o = self;
        if let Some(bad) = o.pids.iter().find(|p| **p <= 0) {
            return Err(format!("--pid must be a positive process id (got {bad})"));
        }
        let processes_named = !(o.pids.is_empty()
            && o.matches.is_empty()
            && o.match_cmdline.is_empty()
            && o.match_label.is_empty());
        if !o.command.is_empty() && processes_named {
            return Err(
                "give either a program after -- or processes to profile (--pid, \
                        --match, --match-label), not both"
                    .into(),
            );
        }
        let policy = MatchPolicy::new(&o.matches, &o.exclude, &o.pids, Some(self_pid))
            .and_then(|p| p.with_cmdline_rules(&o.match_cmdline))
            .map_err(|e| e.to_string())?
            .with_label_rules(&o.match_label, &o.exclude_label)
            .map_err(|e| e.to_string())?;
        let rate = RatePolicy::new(
            o.rate.unwrap_or(pyfleet_policies::rate::DEFAULT_RATE_HZ),
            max_cpu_percent,
        )
        .map_err(|e| e.to_string())?;
        let mode: Mode = match &o.mode {
            Some(m) => m
                .parse()
                .map_err(|e: pyfleet_policies::ModeError| e.to_string())?,
            None => Mode::default(),
        };
        let capture: crate::capture::Capture = o
            .capture
            .as_deref()
            .unwrap_or("auto")
            .parse()
            .map_err(|e| format!("--capture {e}"))?;
        let tasks = match (o.tasks, &o.async_mode) {
            (false, Some(_)) => return Err("--async-mode goes with --async".into()),
            (false, None) => None,
            (true, m) => Some(
                m.as_deref()
                    .unwrap_or("running")
                    .parse::<crate::cpython::asyncio::TaskScope>()
                    .map_err(|e| format!("--async-mode {e}"))?,
            ),
        };
        // Every task at each tick is where the time goes: wall mode, unless another is asked.
        let mode = match (tasks, &o.mode) {
            (Some(crate::cpython::asyncio::TaskScope::All), None) => Mode::Wall,
            _ => mode,
        };
        if tasks == Some(crate::cpython::asyncio::TaskScope::All) && mode != Mode::Wall {
            return Err(format!(
                "--async-mode all goes with --mode wall (a waiting task uses no CPU and holds no \
                 GIL; got --mode {mode})"
            ));
        }
        let capture = capture.resolve(o.blocking, o.switch_log, "--capture")?;
        let (by_thread, by_task) = parse_group_by(&o.group_by)?;
        if by_task && tasks.is_none() {
            return Err("--group-by task goes with --async (tasks are read with it)".into());
        }
        let file_mode = match &o.file_mode {
            Some(m) => m.parse().map_err(|e| format!("--file-mode: {e}"))?,
            None => FileMode::default(),
        };
        Ok(Sampling {
            policy,
            exclude_roles: parse_roles(&o.exclude_role)?,
            subprocesses: o.subprocesses || !o.command.is_empty(),
            matches: o.matches,
            match_cmdline: o.match_cmdline,
            pids: o.pids,
            labels: o.match_label,
            rate,
            mode,
            capture,
            read_only: o.read_only,
            blocking: o.blocking,
            switch_log: o.switch_log,
            file_mode,
            by_function: o.function,
            threads: o.threads || by_thread,
            task_frames: match by_task {
                true => crate::output::views::TaskFrames::Kept,
                false => crate::output::views::TaskFrames::Merged,
            },
            leave_out_idle: pyfleet_policies::leave_out_idle(mode, o.idle, o.no_idle)?,
            tasks,
            command: o.command,
        })
    }
}
