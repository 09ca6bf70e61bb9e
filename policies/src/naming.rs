//! The short name a user knows a process by, for snapshot file names and metric labels.
//!
//! Owns reading a command line the way CPython does, just enough to find what runs, and the
//! sanitising that makes any string safe as a file name and a label value. It must not read
//! anything itself (the caller passes `/proc/PID/cmdline` split at NULs, and the file name of
//! `/proc/PID/exe`) and must not trust argv: any process can write anything there.
//!
//! [`short_name`], in order:
//! 1. argv empty: the executable's name.
//! 2. `argv[0]`'s file name is a Python interpreter (`python`, `python3`, `python3.12`,
//!    `python3.13t`, `python3.12d`, `python3.11-dbg`, ...): interpreter options are skipped as
//!    CPython's getopt does (`-X`, `-W`, `-Q`, `--check-hash-based-pycs` take an argument,
//!    attached or in the next word; flags may be grouped, `-uOO`; `--` ends the options), then
//!    - `-m mod` or `-mmod`: the module as given (`http.server`), less a final `.__main__`;
//!    - `-c code`: `python-c`; `-` (script from stdin): `python-stdin`; nothing (a REPL):
//!      `python`;
//!    - a script path: its file name without `.py`, `.pyw`, `.pyc` or `.pyz` (`tool.pyz` is
//!      `tool`, a directory `app/` is `app`); for `pkg/__main__.py`, the directory's name.
//! 3. `argv[0]` holds a whole command line that starts with an interpreter (setproctitle
//!    rewrote it as `python3 app.py worker`): its words are read as in 2.
//! 4. Otherwise (a title like `gunicorn: worker [app]`, a console-script launcher such as
//!    `/srv/venv/bin/celery`, an embedding binary like `uwsgi`): the file name of `argv[0]`'s
//!    first word, without punctuation around it.
//!
//! A candidate left with no letter or digit once sanitised (`python3 ..`, `python3 -m 日本`)
//! falls back to the executable's name, and that to `python`. The result is always sanitised.
//!
//! [`sanitize`]: characters other than `A-Z a-z 0-9 . _ -` become `_`; runs of `_` collapse to
//! one; a leading run of `.`, `-`, `_` is dropped when it holds a `.` or `-` (so nothing starts
//! with `.` or `-`, and `.`, `..` cannot come out); at most 64 bytes; `_` when nothing is left.

/// Longest name [`sanitize`] returns, in bytes (all of them ASCII).
pub const MAX_NAME_BYTES: usize = 64;

/// Name for `python -c code`.
const COMMAND_NAME: &str = "python-c";
/// Name for `python -` (a script read from stdin).
const STDIN_NAME: &str = "python-stdin";
/// Name for an interpreter with no script (a REPL), and the last fallback.
const INTERPRETER_NAME: &str = "python";

/// argv of the process (untrusted), and the executable's file name.
pub fn short_name(argv: &[String], exe_name: &str) -> String {
    let fallback = || meaningful(exe_name).unwrap_or_else(|| INTERPRETER_NAME.to_string());
    let Some(argv0) = argv.first() else {
        return fallback();
    };
    let rest = argv[1..].iter().map(String::as_str);

    // 2. An interpreter, possibly under a path with spaces in it.
    if is_python(file_name(argv0)) {
        return from_python_args(rest).unwrap_or_else(fallback);
    }
    let mut words = argv0.split_whitespace();
    let Some(first) = words.next() else {
        return fallback();
    };
    // 3. A command line rewritten into argv[0].
    if is_python(file_name(first)) {
        return from_python_args(words.chain(rest)).unwrap_or_else(fallback);
    }
    // 4. Anything else: the program's own name.
    let word = file_name(first).trim_matches(|c: char| !c.is_ascii_alphanumeric());
    meaningful(word).unwrap_or_else(fallback)
}

/// Whether argv is one of multiprocessing's children: `python -c "from multiprocessing.spawn
/// import spawn_main; ..." --multiprocessing-fork` (spawn), the forkserver, the resource
/// tracker. Such a process is named after the program it works for (see
/// [`Family`](crate::Family)).
pub fn is_multiprocessing_child(argv: &[String]) -> bool {
    argv.iter().take(MAX_ARGS_LOOKED_AT).any(|a| {
        a == "--multiprocessing-fork" || a.trim_start().starts_with("from multiprocessing")
    })
}

/// Whether a command line is one of multiprocessing's helpers: the resource tracker
/// (`from multiprocessing.resource_tracker import main`; `semaphore_tracker` before 3.8) or
/// the forkserver (`from multiprocessing.forkserver import main`).
pub fn is_multiprocessing_helper(argv: &[String]) -> bool {
    argv.iter().take(MAX_ARGS_LOOKED_AT).any(|a| {
        let a = a.trim_start();
        ["resource_tracker", "semaphore_tracker", "forkserver"]
            .iter()
            .any(|m| a.starts_with(&format!("from multiprocessing.{m} import")))
    })
}

/// Arguments [`is_multiprocessing_child`] looks at.
const MAX_ARGS_LOOKED_AT: usize = 8;

/// Makes `s` safe as a file name and a metric label value; see the module documentation.
pub fn sanitize(s: &str) -> String {
    let out = clean(s);
    if out.is_empty() {
        "_".to_string()
    } else {
        out
    }
}

/// [`sanitize`] without the `_` for an empty result.
fn clean(s: &str) -> String {
    let mut out = String::with_capacity(s.len().min(MAX_NAME_BYTES));
    // The leading run of `.`, `-`, `_`, until the first letter or digit decides its fate.
    let mut lead_dot_or_dash = false;
    let mut lead_underscore = false;
    for c in s.chars() {
        let c = if c.is_ascii_alphanumeric() || matches!(c, '.' | '-') {
            c
        } else {
            '_'
        };
        if out.is_empty() && !c.is_ascii_alphanumeric() {
            match c {
                '_' => lead_underscore = true,
                _ => lead_dot_or_dash = true,
            }
            continue;
        }
        if out.is_empty() && lead_underscore && !lead_dot_or_dash {
            out.push('_');
        }
        if c == '_' && out.ends_with('_') {
            continue;
        }
        out.push(c);
        if out.len() >= MAX_NAME_BYTES {
            break;
        }
    }
    if out.is_empty() && lead_underscore && !lead_dot_or_dash {
        out.push('_');
    }
    out
}

/// The sanitised name, if it has a letter or digit in it.
fn meaningful(s: &str) -> Option<String> {
    let out = clean(s);
    out.bytes()
        .any(|b| b.is_ascii_alphanumeric())
        .then_some(out)
}

/// The last component of a path, ignoring trailing slashes.
fn file_name(path: &str) -> &str {
    let path = path.trim_end_matches('/');
    path.rsplit('/').next().unwrap_or(path)
}

/// Whether a file name is a CPython interpreter's: `python`, then an optional version
/// (`3`, `3.12`), ABI flags (`d`, `m`, `t`, `u`) and a Debian `-dbg` suffix.
fn is_python(name: &str) -> bool {
    let Some(rest) = name.strip_prefix("python") else {
        return false;
    };
    let rest = rest.strip_suffix("-dbg").unwrap_or(rest);
    let rest = rest.trim_start_matches(|c: char| c.is_ascii_digit() || c == '.');
    rest.len() <= 3 && rest.bytes().all(|b| matches!(b, b'd' | b'm' | b't' | b'u'))
}

/// Reads the arguments after the interpreter the way CPython's getopt does (options
/// `bBc:dEhiIm:OPqRsStuvVW:xX:?`, Python 2's `Q:`, and `--check-hash-based-pycs ARG`) and
/// names what runs. `None` when the name it finds has nothing left after sanitising.
fn from_python_args<'a>(args: impl Iterator<Item = &'a str>) -> Option<String> {
    let mut args = args;
    while let Some(arg) = args.next() {
        if arg == "--" {
            return match args.next() {
                Some(script) => script_name(script),
                None => Some(INTERPRETER_NAME.to_string()),
            };
        }
        if arg == "-" {
            return Some(STDIN_NAME.to_string());
        }
        let Some(cluster) = arg.strip_prefix('-') else {
            return script_name(arg);
        };
        if let Some(long) = cluster.strip_prefix('-') {
            // --help, --version, --help-all...: flags; this one takes the next word.
            if long == "check-hash-based-pycs" {
                args.next();
            }
            continue;
        }
        for (pos, option) in cluster.char_indices() {
            let attached = &cluster[pos + option.len_utf8()..];
            match option {
                'c' => return Some(COMMAND_NAME.to_string()),
                'm' => {
                    let module = if attached.is_empty() {
                        args.next()
                    } else {
                        Some(attached)
                    };
                    return match module {
                        Some(module) => module_name(module),
                        None => Some(INTERPRETER_NAME.to_string()),
                    };
                }
                'W' | 'X' | 'Q' => {
                    if attached.is_empty() {
                        args.next();
                    }
                    break;
                }
                // Flags, and options CPython does not know (it would have refused to start).
                _ => {}
            }
        }
    }
    Some(INTERPRETER_NAME.to_string())
}

/// `http.server` for `http.server`, `pip` for `pip.__main__`.
fn module_name(module: &str) -> Option<String> {
    meaningful(module.strip_suffix(".__main__").unwrap_or(module))
}

/// `app` for `./app.py`, `pkg` for `pkg/__main__.py`, `tool` for `tool.pyz` or `tool/`.
fn script_name(path: &str) -> Option<String> {
    let path = path.trim_end_matches('/');
    let name = file_name(path);
    let stem = [".py", ".pyw", ".pyc", ".pyz"]
        .iter()
        .find_map(|ext| name.strip_suffix(ext))
        .filter(|stem| !stem.is_empty())
        .unwrap_or(name);
    if stem == "__main__" {
        let parent = path[..path.len() - name.len()].trim_end_matches('/');
        if let Some(dir) = meaningful(file_name(parent)) {
            return Some(dir);
        }
    }
    meaningful(stem)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn name(argv: &[&str]) -> String {
        name_exe(argv, "python3.12")
    }

    fn name_exe(argv: &[&str], exe: &str) -> String {
        let argv: Vec<String> = argv.iter().map(|s| s.to_string()).collect();
        short_name(&argv, exe)
    }

    fn assert_sane(s: &str) {
        assert!(!s.is_empty());
        assert!(s.len() <= MAX_NAME_BYTES, "{s}");
        assert!(!s.starts_with('.') && !s.starts_with('-'), "{s}");
        assert!(
            s.bytes()
                .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'.' | b'_' | b'-')),
            "{s:?}"
        );
        assert!(!s.contains("__"), "{s}");
        assert_eq!(sanitize(s), s, "sanitize is idempotent");
    }

    #[test]
    fn modules() {
        for (argv, want) in [
            (&["python", "-m", "celery", "worker"][..], "celery"),
            (
                &["/usr/bin/python3", "-m", "celery", "-A", "proj", "worker"],
                "celery",
            ),
            (&["python", "-mcelery", "worker"], "celery"),
            (&["python3", "-Bm", "celery"], "celery"),
            (&["python3", "-uBmcelery"], "celery"),
            (&["python3", "-m", "http.server", "8000"], "http.server"),
            (
                &["python3", "-m", "uvicorn", "main:app", "--port", "80"],
                "uvicorn",
            ),
            (&["python3", "-m", "pip.__main__", "install"], "pip"),
            (
                &["python3", "-m", "gunicorn.app.wsgiapp"],
                "gunicorn.app.wsgiapp",
            ),
            // Arguments after the module are the module's, even ones that look like options.
            (&["python3", "-m", "celery", "-c", "4", "-X", "q"], "celery"),
            (
                &["python3", "-m", "ray.util.client.server", "--port=1"],
                "ray.util.client.server",
            ),
            // -m with nothing after it: CPython refuses to start; call it what it is.
            (&["python3", "-m"], "python"),
        ] {
            assert_eq!(name(argv), want, "{argv:?}");
        }
    }

    #[test]
    fn scripts() {
        for (argv, want) in [
            (&["python3", "app.py"][..], "app"),
            (
                &["/srv/venv/bin/python", "/srv/venv/bin/gunicorn", "app:wsgi"],
                "gunicorn",
            ),
            (
                &[
                    "/usr/bin/python3",
                    "/usr/local/bin/celery",
                    "-A",
                    "proj",
                    "worker",
                ],
                "celery",
            ),
            (
                &["/usr/bin/python3", "manage.py", "runserver", "0.0.0.0:8000"],
                "manage",
            ),
            (
                &["python3", "./scripts/etl_job.py", "--date", "2026-01-01"],
                "etl_job",
            ),
            (&["python3", "pkg/__main__.py"], "pkg"),
            (&["python3", "/srv/pkg/__main__.pyc"], "pkg"),
            (&["python3", "__main__.py"], "_main_"),
            (&["python3", "myapp/"], "myapp"),
            (&["python3", "tool.pyz", "run"], "tool"),
            (&["python3", "gui.pyw"], "gui"),
            (&["python3", ".py"], "py"),
            (&["python3", "archive.tar.gz"], "archive.tar.gz"),
            (&["python3", "job.PY"], "job.PY"),
            // The script's own -c and -m are its business.
            (
                &[
                    "/usr/bin/python3",
                    "/usr/bin/supervisord",
                    "-n",
                    "-c",
                    "/etc/s.conf",
                ],
                "supervisord",
            ),
            (
                &[
                    "/usr/bin/python3",
                    "-s",
                    "/usr/bin/ansible-playbook",
                    "site.yml",
                ],
                "ansible-playbook",
            ),
            (&["python2.7", "-3", "legacy.py"], "legacy"),
        ] {
            assert_eq!(name(argv), want, "{argv:?}");
        }
    }

    #[test]
    fn interpreter_options() {
        for argv in [
            &["python3", "-u", "svc.py"][..],
            &["python3", "-O", "svc.py"],
            &[
                "python3", "-OO", "-B", "-E", "-s", "-S", "-I", "-P", "-q", "svc.py",
            ],
            &["python3", "-X", "dev", "svc.py"],
            &["python3", "-Xdev", "svc.py"],
            &[
                "python3",
                "-X",
                "importtime",
                "-X",
                "frozen_modules=off",
                "svc.py",
            ],
            &["python3", "-W", "ignore", "svc.py"],
            &["python3", "-Wignore::DeprecationWarning", "svc.py"],
            &[
                "python3", "-W", "error", "-X", "dev", "-u", "svc.py", "-m", "x",
            ],
            &["python3", "-uX", "dev", "svc.py"],
            &["python3", "-uWignore", "svc.py"],
            &["python3", "-uOX", "-m", "svc.py"], // -X's argument is "-m"
            &["python3", "-W", "-c", "svc.py"],   // -W's argument is "-c"
            &["python2", "-Q", "new", "svc.py"],
            &["python2", "-Qnew", "svc.py"],
            &["python3", "--check-hash-based-pycs", "always", "svc.py"],
            &["python3", "--help-all", "svc.py"],
            &["python3", "--", "svc.py", "--", "-m", "x"],
            &["python3", "-i", "svc.py"],
            &["python3", "-bb", "-vv", "-d", "-x", "-R", "-t", "svc.py"],
            &["python3", "-é", "svc.py"],
        ] {
            assert_eq!(name(argv), "svc", "{argv:?}");
        }
    }

    #[test]
    fn commands_stdin_and_repl() {
        for (argv, want) in [
            (
                &["python3", "-c", "import time; time.sleep(100)"][..],
                "python-c",
            ),
            (&["python3", "-uc", "print(1)"], "python-c"),
            (&["python3", "-cprint(1)"], "python-c"),
            (
                &["python3", "-X", "dev", "-c", "pass", "app.py"],
                "python-c",
            ),
            (&["python3", "-c"], "python-c"),
            (&["python3", "-"], "python-stdin"),
            (&["python3", "-u", "-", "arg"], "python-stdin"),
            (&["python3"], "python"),
            (&["python3", "-i"], "python"),
            (&["python3", "-X", "dev"], "python"),
            (&["python3", "-X"], "python"),
            (&["python3", "--"], "python"),
            (&["python3", "--check-hash-based-pycs"], "python"),
        ] {
            assert_eq!(name(argv), want, "{argv:?}");
        }
    }

    #[test]
    fn interpreter_names() {
        for exe in [
            "python",
            "python3",
            "python3.12",
            "python3.13t",
            "python3.12d",
            "python3.7m",
            "python3.11-dbg",
            "python3.14td",
            "/usr/bin/python3.15",
            "/root/.pyenv/versions/3.12.8/bin/python3.12",
            "/srv/venv/bin/python",
        ] {
            assert_eq!(name(&[exe, "-u", "job.py"]), "job", "{exe}");
        }
        for not in [
            "pythonista",
            "python-config",
            "python3.12-config",
            "ipython",
            "cpython",
            "pypy3",
            "Python",
            "py",
            "python3.12x",
            "python3.12dmtu",
        ] {
            assert!(!is_python(not), "{not}");
            assert_eq!(name(&[not, "-u", "job.py"]), sanitize(not), "{not}");
        }
    }

    #[test]
    fn not_python_argv0() {
        for (argv, want) in [
            (&["gunicorn: worker [app]"][..], "gunicorn"),
            (&["gunicorn: master [app:wsgi]", "", ""], "gunicorn"),
            (&["gunicorn: worker [/srv/app]"], "gunicorn"),
            (
                &["/srv/venv/bin/gunicorn", "app:wsgi", "-w", "4"],
                "gunicorn",
            ),
            (&["/srv/venv/bin/celery", "-A", "proj", "worker"], "celery"),
            (&["celery", "-A", "proj", "worker"], "celery"),
            (
                &["[celeryd: celery@host:MainProcess] -active- (worker)"],
                "celeryd",
            ),
            (&["uwsgi", "--ini", "/etc/uwsgi/app.ini"], "uwsgi"),
            (&["uWSGI master"], "uWSGI"),
            (&["/usr/sbin/uwsgi"], "uwsgi"),
            (&["airflow scheduler -- DagFileProcessorManager"], "airflow"),
            (&["ray::IDLE"], "ray_IDLE"),
            (&["-python3"], "python3"),
        ] {
            assert_eq!(name(argv), want, "{argv:?}");
        }
    }

    #[test]
    fn command_line_rewritten_into_argv0() {
        for (argv, want) in [
            (&["python3 app.py worker"][..], "app"),
            (&["/usr/bin/python3 -m celery worker", "", ""], "celery"),
            (&["python3 -c pass"], "python-c"),
            (&["python3 -X dev"], "python"),
            (&["python3   svc.py"], "svc"),
            // A split title continues into the remaining arguments.
            (&["python3 -X", "dev", "svc.py"], "svc"),
        ] {
            assert_eq!(name(argv), want, "{argv:?}");
        }
        // An interpreter under a path with spaces is still an interpreter.
        assert_eq!(name(&["/opt/My Python/bin/python3", "svc.py"]), "svc");
        assert_eq!(name(&["/opt/My Python/bin/python3"]), "python");
    }

    #[test]
    fn fallbacks() {
        assert_eq!(name_exe(&[], "python3.12"), "python3.12");
        assert_eq!(name_exe(&[], ""), "python");
        assert_eq!(name_exe(&[], "../.."), "python");
        assert_eq!(name_exe(&[], "my app"), "my_app");
        assert_eq!(name_exe(&[""], "python3.12"), "python3.12");
        assert_eq!(name_exe(&["   "], "python3.12"), "python3.12");
        assert_eq!(name_exe(&["", "app.py"], "python3.12"), "python3.12");
        assert_eq!(name_exe(&["::"], "python3.12"), "python3.12");
        assert_eq!(name_exe(&["/"], "python3.12"), "python3.12");
        // Candidates with nothing left fall back to the executable.
        assert_eq!(name_exe(&["python3", "."], "python3.11"), "python3.11");
        assert_eq!(name_exe(&["python3", ".."], "python3.11"), "python3.11");
        assert_eq!(name_exe(&["python3", "/"], "python3.11"), "python3.11");
        assert_eq!(name_exe(&["python3", "..."], "python3.11"), "python3.11");
        assert_eq!(
            name_exe(&["python3", "-m", "日本"], "python3.11"),
            "python3.11"
        );
        assert_eq!(
            name_exe(&["python3", "-m", "-"], "python3.11"),
            "python3.11"
        );
        assert_eq!(name_exe(&["python3", "-m", ""], "python3.11"), "python3.11");
        assert_eq!(name_exe(&["python3", ""], "python3.11"), "python3.11");
        assert_eq!(name_exe(&["python3", "日本.py"], "\n"), "python");
    }

    #[test]
    fn hostile_command_lines() {
        let long = format!("{}.py", "a".repeat(10_000));
        let long_path = format!("{}x.py", "../".repeat(5_000));
        let cases: Vec<(Vec<&str>, &str)> = vec![
            (vec!["python3", "../../etc/passwd"], "passwd"),
            (vec!["python3", "-m", "../../etc/passwd"], "etc_passwd"),
            (vec!["../../etc/passwd"], "passwd"),
            (vec!["python3", "/etc/../../.."], "python3.12"),
            (vec!["python3", "evil\nname.py"], "evil_name"),
            (vec!["python3", "evil\r\n\r\nname.py"], "evil_name"),
            (vec!["python3", "a\0b.py"], "a_b"),
            (vec!["python3", "\"quoted\".py"], "_quoted_"),
            (vec!["python3", "it's.py"], "it_s"),
            (vec!["python3", "`rm -rf /`.py"], "python3.12"), // file name "`.py"
            (vec!["python3", "`rm -rf`.py"], "_rm_-rf_"),
            (vec!["python3", "$(reboot).py"], "_reboot_"),
            (vec!["<svg onload=alert(1)>"], "svg"),
            (
                vec!["python3", "<svg onload=alert(1)>.py"],
                "_svg_onload_alert_1_",
            ),
            (vec!["python3", "-m", "a{b=\"c\"}"], "a_b_c_"),
            (vec!["python3", "données.py"], "donn_es"),
            (vec!["python3", "日本語アプリ.py"], "python3.12"),
            (vec!["python3", "app\u{202e}yp.py"], "app_yp"),
            (vec!["python3", "-.py"], "python"), // options, as CPython reads it
            (vec!["python3", "--.py"], "python"),
            (vec!["python3", ".hidden.py"], "hidden"),
            (vec!["python3", "-m", ".hidden"], "hidden"),
            (vec!["python3", "-m", "-rf"], "rf"),
            (vec!["python3", "--", "-rf.py"], "rf"),
            (vec!["python3", "--", "--"], "python3.12"),
            (vec!["python3", &long], &long[..64]),
            (vec!["python3", &long_path], "x"),
            (vec!["\u{0}\u{0}"], "python3.12"),
            (vec!["python3\u{0}app.py"], "python3_app.py"),
        ];
        for (argv, want) in cases {
            let got = name(&argv);
            assert_eq!(got, want, "{argv:?}");
            assert_sane(&got);
        }
    }

    #[test]
    fn short_name_is_always_sane() {
        let nasty = [
            "",
            ".",
            "..",
            "...",
            "-",
            "--",
            "-m",
            "-c",
            "-X",
            "/",
            "//",
            "./",
            "../",
            "\0",
            "\n",
            " ",
            "\t",
            "é",
            "日本",
            "\u{FEFF}",
            "a/b/c.py",
            "python3",
            "python",
            "-mcelery",
            "x.py",
            "_",
            "__",
            "._",
            "-_-",
            "a..b",
            "a--b",
            "<>",
            "%00",
            "$HOME",
            "\u{7f}",
            "\u{1b}[31m",
            "a\u{0301}",
        ];
        for a in nasty {
            for b in nasty {
                for c in ["python3", "", "..", "\u{1b}"] {
                    for argv in [vec![a, b], vec![c, a, b], vec![a], vec![c, "-m", a, b]] {
                        let got = name_exe(&argv, b);
                        assert_sane(&got);
                        assert_ne!(got, "_", "{argv:?}");
                    }
                }
            }
        }
    }

    #[test]
    fn sanitize_rules() {
        for (input, want) in [
            ("celery", "celery"),
            ("http.server", "http.server"),
            ("my-app_2", "my-app_2"),
            ("", "_"),
            (".", "_"),
            ("..", "_"),
            ("...", "_"),
            ("-", "_"),
            ("_", "_"),
            ("__", "_"),
            ("_x", "_x"),
            ("__main__", "_main_"),
            ("._x", "x"),
            ("_.x", "x"),
            ("-rf", "rf"),
            ("--help", "help"),
            (".bashrc", "bashrc"),
            ("../../etc/passwd", "etc_passwd"),
            ("a/b", "a_b"),
            ("a//b", "a_b"),
            ("a b\tc\nd", "a_b_c_d"),
            ("a  \n\n b", "a_b"),
            ("a__b", "a_b"),
            ("a_ _b", "a_b"),
            ("a..b", "a..b"),
            ("a--b", "a--b"),
            ("x.", "x."),
            ("x-", "x-"),
            ("\0", "_"),
            ("a\0b", "a_b"),
            ("café", "caf_"),
            ("日本", "_"),
            ("日本x", "_x"),
            ("<svg/onload=alert(1)>", "_svg_onload_alert_1_"),
            ("\"';", "_"),
            ("gunicorn: worker [app]", "gunicorn_worker_app_"),
            ("UPPER.lower-09", "UPPER.lower-09"),
        ] {
            assert_eq!(sanitize(input), want, "{input:?}");
        }
    }

    #[test]
    fn sanitize_caps_at_64_bytes() {
        let s = sanitize(&"x".repeat(1000));
        assert_eq!(s, "x".repeat(64));
        let s = sanitize(&format!("{}{}", ".".repeat(1000), "y".repeat(1000)));
        assert_eq!(s, "y".repeat(64));
        let s = sanitize(&"é".repeat(1000));
        assert_eq!(s, "_");
        let s = sanitize(&"ab€".repeat(100));
        assert_eq!(s.len(), 64);
        assert!(s.starts_with("ab_ab_"));
        assert_sane(&s);
    }

    #[test]
    fn sanitize_output_is_always_sane() {
        let pieces = [
            "", ".", "..", "-", "_", "/", "a", "Z9", "é", "\0", "\n", " ", "日", ".-_", "x.y",
        ];
        for a in pieces {
            for b in pieces {
                for c in pieces {
                    let s = sanitize(&format!("{a}{b}{c}"));
                    assert_sane(&s);
                    assert!(s != "." && s != "..");
                }
            }
        }
    }
}
