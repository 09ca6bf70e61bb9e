//! Who each process is (`discovery::labels`), on real processes of every version: started in a
//! fresh cgroup (v2) at a Kubernetes pod's path (systemd driver, containerd), in a mount
//! namespace where the service-account namespace file exists, with `OTEL_SERVICE_NAME` and
//! `HOSTNAME` set, beside a plain process. `list` shows the labels, label rules select, the
//! daemon's snapshot holds them in `labels.json`, `record`'s pprof carries them, and hostile
//! values (a service name of escapes and 5,000 bytes, a FIFO where the namespace file
//! should be) are bounded and never block.

use crate::common::*;
use std::collections::BTreeMap;
use std::fs;
use std::path::{Path, PathBuf};
use std::time::Duration;

const NAMESPACE: &str = "payments";
const SERVICE: &str = "checkout";

/// Where cgroup v2 is mounted (`/sys/fs/cgroup`, or `/sys/fs/cgroup/unified` on a hybrid
/// host), from this process's mount table.
fn cgroup2_root() -> Option<PathBuf> {
    let mounts = fs::read_to_string("/proc/self/mountinfo").ok()?;
    mounts.lines().find_map(|l| {
        let (left, right) = l.split_once(" - ")?;
        let mount = left.split_whitespace().nth(4)?;
        (right.split_whitespace().next() == Some("cgroup2")).then(|| PathBuf::from(mount))
    })
}

/// A pod's container cgroup, made for the test and removed (deepest first) when dropped.
struct PodCgroup {
    dirs: Vec<PathBuf>,
    uid: String,
    id: String,
}

impl PodCgroup {
    fn new(root: &Path, n: u32) -> PodCgroup {
        let uid = format!("0e1d2c3b-4a59-6877-8695-a4b3c2d1e{n:03x}");
        let id = format!("{:0>64}", format!("c0ffee{n:02}"));
        let uid_ = uid.replace('-', "_");
        let mut dirs = Vec::new();
        let mut dir = root.to_path_buf();
        for part in [
            "kubepods.slice".to_string(),
            "kubepods-burstable.slice".to_string(),
            format!("kubepods-burstable-pod{uid_}.slice"),
            format!("cri-containerd-{id}.scope"),
        ] {
            dir = dir.join(part);
            if !dir.exists() {
                fs::create_dir(&dir)
                    .unwrap_or_else(|e| panic!("cannot make cgroup {}: {e}", dir.display()));
                dirs.push(dir.clone());
            }
        }
        PodCgroup { dirs, uid, id }
    }

    fn leaf(&self) -> &Path {
        self.dirs.last().expect("the container's cgroup")
    }
}

impl Drop for PodCgroup {
    fn drop(&mut self) {
        for d in self.dirs.iter().rev() {
            // Its process is gone by now (killed before this is dropped); a moment for the
            // kernel to empty the cgroup.
            for _ in 0..50 {
                if fs::remove_dir(d).is_ok() || !d.exists() {
                    break;
                }
                std::thread::sleep(Duration::from_millis(20));
            }
        }
    }
}

/// `sleeper.py` in `cgroup`, in its own mount namespace whose `/run` (and so `/var/run`)
/// holds the service-account namespace file (`namespace_file`: its content, or `None` for a
/// FIFO there), with `env` set.
fn in_pod(
    unshare: &Path,
    interp: &Interp,
    cgroup: &Path,
    namespace_file: Option<&str>,
    env: &[(&str, &str)],
    marker: &str,
) -> Proc {
    let dir = "/run/secrets/kubernetes.io/serviceaccount";
    let make_file = match namespace_file {
        Some(content) => format!("printf '%s\\n' '{content}' > {dir}/namespace"),
        None => format!("mkfifo {dir}/namespace"),
    };
    let env_args: Vec<String> = env.iter().map(|(k, v)| format!("{k}={v}")).collect();
    let script = format!(
        "set -e; echo $$ > '{}/cgroup.procs'; mount -t tmpfs tmpfs /run; mkdir -p {dir}; \
         {make_file}; exec env \"$@\"",
        cgroup.display()
    );
    let mut args: Vec<String> = vec![
        "-m".into(),
        "/bin/sh".into(),
        "-c".into(),
        script,
        "sh".into(),
    ];
    args.extend(env_args);
    args.push(interp.path.display().to_string());
    args.push(target_script("sleeper.py").display().to_string());
    args.push("ready".into());
    args.push(marker.into());
    Proc::spawn(
        &format!("sleeper.py [{}] in a pod", interp.label),
        unshare,
        &args,
    )
}

/// `list`'s rows by pid: (name, service, labels `key=value` by key).
fn listed(out: &RunOutput) -> BTreeMap<i32, (String, String, BTreeMap<String, String>)> {
    assert!(out.success(), "`pyfleet list` failed\n{}", out.describe());
    let mut rows = BTreeMap::new();
    for line in out.stdout.lines().skip(1) {
        let cols: Vec<&str> = line.split_whitespace().collect();
        let (Some(pid), Some(name), Some(service), Some(labels)) = (
            cols.first().and_then(|p| p.parse::<i32>().ok()),
            cols.get(3),
            cols.get(5),
            cols.get(6),
        ) else {
            panic!(
                "row {line:?} is not PID PPID PYTHON NAME ROLE SERVICE LABELS COMMAND\n{}",
                out.describe()
            );
        };
        let labels = labels
            .split(',')
            .filter_map(|kv| kv.split_once('='))
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect();
        rows.insert(pid, (name.to_string(), service.to_string(), labels));
    }
    rows
}

#[test]
fn labels_say_who_a_process_is_on_every_version() {
    let _machine = shared();
    let Some(unshare) = tool("unshare", SETUP_DEPLOY_TOOLS) else {
        return;
    };
    let Some(root) = cgroup2_root() else {
        skip_or_fail(&[Missing {
            what: "a cgroup v2 hierarchy (/proc/self/mountinfo)".into(),
            setup: "a kernel with cgroup2 mounted".into(),
            part: None,
        }]);
        return;
    };
    let token = unique_token("pyfleetlabels");
    let mut pods = Vec::new();
    let mut procs = Vec::new();
    for (n, interp) in interpreters().into_iter().enumerate() {
        let cgroup = PodCgroup::new(&root, n as u32);
        let pod = format!("api-{}-x{n}", interp.minor);
        let env = [("OTEL_SERVICE_NAME", SERVICE), ("HOSTNAME", pod.as_str())];
        let marker = format!("{token}-{}", interp.label);
        let mut p = in_pod(
            &unshare,
            &interp,
            cgroup.leaf(),
            Some(NAMESPACE),
            &env,
            &marker,
        );
        p.wait_for_file("ready", READY_TIMEOUT);
        procs.push((interp, p, pod));
        pods.push(cgroup);
    }
    assert!(!procs.is_empty(), "no interpreters");
    // A plain process: its name is its service, and it has no other label.
    let any = any_interpreter();
    let mut plain = Proc::python(
        &any.label,
        &any.path,
        "sleeper.py",
        &["ready", &format!("{token}-plain")],
    );
    plain.wait_for_file("ready", READY_TIMEOUT);
    // Hostile: a service name of escapes and 5,000 bytes, a FIFO for the namespace file.
    let hostile_cgroup = PodCgroup::new(&root, 99);
    let long = format!("evil\x1b[31m\u{202e}{}", "z".repeat(5000));
    let mut hostile = in_pod(
        &unshare,
        &any,
        hostile_cgroup.leaf(),
        None,
        &[("OTEL_SERVICE_NAME", long.as_str())],
        &format!("{token}-hostile"),
    );
    hostile.wait_for_file("ready", READY_TIMEOUT);

    let out = pyfleet(&["list", "--match", &token]);
    let rows = listed(&out);
    for ((interp, p, pod), cgroup) in procs.iter().zip(&pods) {
        let (_, service, labels) = rows.get(&p.pid()).unwrap_or_else(|| {
            panic!(
                "[{}] pid {} not listed\n{}",
                interp.label,
                p.pid(),
                out.describe()
            )
        });
        let want: BTreeMap<String, String> = [
            ("container", &cgroup.id[..12]),
            ("namespace", NAMESPACE),
            ("pod", pod.as_str()),
            ("pod_uid", cgroup.uid.as_str()),
        ]
        .into_iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect();
        assert_eq!(service, SERVICE, "[{}]\n{}", interp.label, out.describe());
        assert_eq!(labels, &want, "[{}]\n{}", interp.label, out.describe());
    }
    let (name, service, labels) = rows
        .get(&plain.pid())
        .unwrap_or_else(|| panic!("the plain process is not listed\n{}", out.describe()));
    assert_eq!(
        service, name,
        "a process's service is its name when nothing names it"
    );
    // (It may have a container id: the one this test runs in, if any.)
    for k in ["namespace", "pod", "pod_uid"] {
        assert!(
            !labels.contains_key(k),
            "the plain process has {k}: {labels:?}"
        );
    }
    let (_, service, labels) = rows
        .get(&hostile.pid())
        .unwrap_or_else(|| panic!("the hostile process is not listed\n{}", out.describe()));
    assert!(
        service.len() <= 128
            && service.starts_with("evil__31m___zz")
            && !out.stdout.contains('\x1b'),
        "hostile service {service:?}"
    );
    assert!(
        !labels.contains_key("namespace"),
        "a FIFO gave a namespace: {labels:?}"
    );
    assert!(labels.contains_key("pod_uid"), "{labels:?}");

    // Label rules: every include rule must match, any exclude rule excludes.
    let pods_only = listed(&pyfleet(&[
        "list",
        "--match",
        &token,
        "--match-label",
        "namespace=^payments$",
    ]));
    let mut want: Vec<i32> = procs.iter().map(|(_, p, _)| p.pid()).collect();
    want.sort();
    assert_eq!(pods_only.keys().copied().collect::<Vec<_>>(), want);
    let not_checkout = listed(&pyfleet(&[
        "list",
        "--match",
        &token,
        "--exclude-label",
        "service=^checkout$",
    ]));
    let mut want = vec![plain.pid(), hostile.pid()];
    want.sort();
    assert_eq!(not_checkout.keys().copied().collect::<Vec<_>>(), want);
    let bad = pyfleet(&["list", "--match-label", "colour=red"]);
    assert!(
        !bad.success()
            && bad.stderr.trim().lines().count() == 1
            && bad.stderr.contains("unknown label 'colour'"),
        "{}",
        bad.describe()
    );

    // The daemon: /metrics carries the bounded labels, its snapshot's labels.json all of them.
    let out_dir = tempdir("pyfleet-labels-");
    let port = free_port();
    let daemon = Running::start(
        pyfleet_command(&[
            "--match",
            &token,
            "--match-label",
            "service=^checkout$",
            "--mode",
            "wall",
            "--duration",
            "4",
            "--out",
            &out_dir.path().display().to_string(),
            "--metrics-addr",
            &format!("127.0.0.1:{port}"),
        ]),
        Duration::from_secs(60),
    );
    let first = procs[0].1.pid();
    let scrape = || {
        http_get(port, "/metrics")
            .map(|(_, b)| b)
            .unwrap_or_default()
    };
    let series = |page: &str| {
        page.lines()
            .find(|l| {
                l.starts_with("pyfleet_samples_total") && l.contains(&format!("pid=\"{first}\""))
            })
            .map(str::to_string)
    };
    wait_until(
        Duration::from_secs(3),
        "the first pod process's series on /metrics",
        || series(&scrape()).is_some(),
        || truncate(&scrape(), 4000),
    );
    let page = scrape();
    let line = series(&page).unwrap_or_default();
    assert!(
        line.contains("service=\"checkout\"") && line.contains("namespace=\"payments\""),
        "{line}"
    );
    assert!(
        !page.contains("pod_uid="),
        "an unbounded label reached /metrics"
    );
    let run = daemon.finish();
    assert!(run.success(), "{}", run.describe());
    let snapshot = fs::read_dir(out_dir.path())
        .unwrap()
        .flatten()
        .map(|e| e.path())
        .filter(|p| p.join("labels.json").exists())
        .max()
        .unwrap_or_else(|| panic!("no snapshot with labels.json\n{}", run.describe()));
    let doc: serde_json::Value =
        serde_json::from_slice(&fs::read(snapshot.join("labels.json")).unwrap()).unwrap();
    let by_pid: BTreeMap<i64, &serde_json::Value> = doc["processes"]
        .as_array()
        .unwrap()
        .iter()
        .map(|p| (p["pid"].as_i64().unwrap_or(0), &p["labels"]))
        .collect();
    for ((interp, p, pod), cgroup) in procs.iter().zip(&pods) {
        let l = by_pid
            .get(&i64::from(p.pid()))
            .unwrap_or_else(|| panic!("[{}] not in labels.json: {doc}", interp.label));
        assert_eq!(l["service"], SERVICE);
        assert_eq!(l["namespace"], NAMESPACE);
        assert_eq!(l["pod"], pod.as_str());
        assert_eq!(l["pod_uid"], cgroup.uid.as_str());
        assert_eq!(l["container_id"], cgroup.id.as_str());
    }
    assert!(
        !by_pid.contains_key(&i64::from(plain.pid())),
        "the label rule let the plain process in"
    );

    // `record`'s pprof: every sample carries its process's labels.
    let pb = out_dir.path().join("rec.pb.gz");
    let rec = pyfleet(&[
        "record",
        "--match-label",
        "namespace=^payments$",
        "--match",
        &token,
        "--mode",
        "wall",
        "-d",
        "2",
        "-o",
        &pb.display().to_string(),
    ]);
    assert!(rec.success(), "{}", rec.describe());
    let profile = pyfleet::output::pprof::decode(&fs::read(&pb).unwrap()).unwrap();
    let s = |i: i64| profile.string_table[i as usize].as_str();
    let mut seen = BTreeMap::new();
    for sample in &profile.sample {
        let labels: BTreeMap<&str, String> = sample
            .label
            .iter()
            .map(|l| {
                (
                    s(l.key),
                    if l.str != 0 {
                        s(l.str).to_string()
                    } else {
                        l.num.to_string()
                    },
                )
            })
            .collect();
        assert_eq!(
            labels.get("service").map(String::as_str),
            Some(SERVICE),
            "{labels:?}"
        );
        assert_eq!(
            labels.get("namespace").map(String::as_str),
            Some(NAMESPACE),
            "{labels:?}"
        );
        seen.insert(labels["pid"].clone(), labels.get("pod").cloned());
    }
    for (interp, p, pod) in &procs {
        assert_eq!(
            seen.get(&p.pid().to_string()),
            Some(&Some(pod.clone())),
            "[{}] no sample with its pod label",
            interp.label
        );
    }
    drop((plain, hostile, procs));
}
