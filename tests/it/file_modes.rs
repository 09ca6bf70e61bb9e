//! Who may read what pyfleet writes (issue #33): `record`'s file and `run`'s snapshot
//! directories and files get the documented permission bits whatever the umask: the owner
//! only by default (files 0600, directories 0700), or `--file-mode`'s (0640: directories
//! 0750); a mode that is not one is refused with one line. `record` run through sudo hands
//! its file to the user who ran sudo.

use crate::common::*;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::Command;

/// `pyfleet ARGS` started under `umask`.
fn under_umask(umask: u32, args: &[String]) -> Command {
    let mut cmd = Command::new("sh");
    cmd.arg("-c")
        .arg(format!("umask {umask:03o}; exec \"$0\" \"$@\""))
        .arg(pyfleet_exe())
        .args(args)
        .env_remove("RUST_LOG")
        .env_remove("RUST_BACKTRACE");
    cmd
}

fn bits(path: &Path) -> u32 {
    std::fs::symlink_metadata(path)
        .unwrap_or_else(|e| panic!("{}: {e}", path.display()))
        .permissions()
        .mode()
        & 0o7777
}

/// Every file and directory under `dir` (itself not included).
fn tree(dir: &Path) -> Vec<PathBuf> {
    let mut all = Vec::new();
    for e in std::fs::read_dir(dir).unwrap().flatten() {
        let p = e.path();
        if p.is_dir() {
            all.extend(tree(&p));
        }
        all.push(p);
    }
    all
}

#[test]
fn record_and_run_write_files_with_the_documented_modes_whatever_the_umask() {
    let _machine = shared();
    let interp = any_interpreter();
    let dir = tempdir("pyfleet-file-modes-");
    let mut target = Proc::python(
        &interp.label,
        &interp.path,
        "gil_busy.py",
        &[dir.path().to_str().unwrap()],
    );
    target.wait_for_path(&dir.path().join("threads.json"), READY_TIMEOUT);
    let pid = target.pid().to_string();
    let mut failures = Vec::new();
    for umask in [0o000, 0o077, 0o022] {
        for (mode_arg, file, directory) in [(None, 0o600, 0o700), (Some("0640"), 0o640, 0o750)] {
            let case = format!("umask {umask:03o}, --file-mode {mode_arg:?}");
            let extra: Vec<String> = mode_arg
                .map(|m| vec!["--file-mode".to_string(), m.to_string()])
                .unwrap_or_default();
            let tag = format!("{umask:03o}-{}", mode_arg.unwrap_or("default"));

            let out = dir.path().join(format!("record-{tag}.folded"));
            let mut args: Vec<String> = ["record", "--pid", &pid, "--capture", "reads"]
                .iter()
                .map(|s| s.to_string())
                .collect();
            args.extend(["--duration", "1", "-o"].map(String::from));
            args.push(out.to_str().unwrap().to_string());
            args.extend(extra.clone());
            let run = run_with_timeout(under_umask(umask, &args), PYFLEET_TIMEOUT);
            if !run.success() || !out.exists() {
                failures.push(format!("{case}: record failed: {}", run.describe()));
            } else if bits(&out) != file {
                failures.push(format!(
                    "{case}: record's file is {:04o}, not {file:04o}",
                    bits(&out)
                ));
            }

            let snaps = dir.path().join(format!("snapshots-{tag}"));
            let mut args: Vec<String> = ["run", "--pid", &pid, "--capture", "reads"]
                .iter()
                .map(|s| s.to_string())
                .collect();
            args.extend(["--duration", "2", "--metrics-addr", "off", "--out"].map(String::from));
            args.push(snaps.to_str().unwrap().to_string());
            args.extend(extra);
            let run = run_with_timeout(under_umask(umask, &args), PYFLEET_TIMEOUT);
            if !run.success() || !snaps.is_dir() {
                failures.push(format!("{case}: run failed: {}", run.describe()));
                continue;
            }
            let written = tree(&snaps);
            if !written
                .iter()
                .any(|p| p.extension().is_some_and(|e| e == "svg"))
            {
                failures.push(format!("{case}: no snapshot written: {written:?}"));
            }
            for p in std::iter::once(snaps.clone()).chain(written) {
                let want = if p.is_dir() { directory } else { file };
                if bits(&p) != want {
                    failures.push(format!(
                        "{case}: {} is {:04o}, not {want:04o}",
                        p.display(),
                        bits(&p)
                    ));
                }
            }
        }
    }
    // Through sudo (as root, SUDO_UID and SUDO_GID set): the file is the invoking user's.
    if is_root() {
        use std::os::unix::fs::MetadataExt;
        let out = dir.path().join("sudo.folded");
        let args: Vec<String> = [
            "record",
            "--pid",
            &pid,
            "--capture",
            "reads",
            "--duration",
            "1",
            "-o",
            out.to_str().unwrap(),
        ]
        .iter()
        .map(|s| s.to_string())
        .collect();
        let mut cmd = under_umask(0o022, &args);
        cmd.env("SUDO_UID", "65534").env("SUDO_GID", "65533");
        let run = run_with_timeout(cmd, PYFLEET_TIMEOUT);
        match std::fs::metadata(&out) {
            Ok(m) if (m.uid(), m.gid(), bits(&out)) == (65534, 65533, 0o600) => {}
            Ok(m) => failures.push(format!(
                "through sudo: the file is {}:{} {:04o}, not 65534:65533 0600",
                m.uid(),
                m.gid(),
                bits(&out)
            )),
            Err(e) => failures.push(format!("through sudo: {e}: {}", run.describe())),
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}

#[test]
fn a_file_mode_that_is_not_one_is_refused_with_one_line() {
    let _machine = shared();
    let dir = tempdir("pyfleet-file-modes-bad-");
    let out = dir.path().join("x.folded");
    for (mode, says) in [
        ("0755", "bits other than read and write"),
        ("0044", "does not let the owner read and write"),
        ("rw-r-----", "is not an octal mode"),
    ] {
        for command in ["record", "run"] {
            let mut args = vec![command, "--pid", "1", "--file-mode", mode];
            let out_arg = out.to_str().unwrap();
            if command == "record" {
                args.extend(["-o", out_arg]);
            } else {
                args.extend(["--out", out_arg, "--metrics-addr", "off"]);
            }
            let run = pyfleet(&args);
            assert_error_contract(&run, Some(says));
            assert!(!out.exists(), "pyfleet {args:?} wrote {}", out.display());
        }
    }
}
