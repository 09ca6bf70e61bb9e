//! Who a process is beyond its short name: the labels a profile store files it under. Found
//! once per process (pid and start time), when a scan first lists it as Python:
//!
//! - `service`: the target's `OTEL_SERVICE_NAME`, else its `PYROSCOPE_APPLICATION_NAME`, else
//!   its short name;
//! - `container_id` and `pod_uid`: from `/proc/PID/cgroup` (cgroup v1 and v2 lines; the path
//!   shapes of Docker, containerd, CRI-O and Podman under the cgroupfs and systemd drivers);
//! - on Kubernetes (a pod uid was found, or the service-account namespace file exists):
//!   `namespace`, from that file inside the target's root, and `pod`, the target's `HOSTNAME`
//!   (Kubernetes sets it to the pod's name).
//!
//! Everything here comes from the target, which may be hostile. Reads are bounded (the
//! environment's first [`MAX_ENVIRON`] bytes, the cgroup file's first [`MAX_CGROUP`]); the
//! namespace file is opened with the target's root as the root of path resolution (its
//! symlinks cannot lead out of it), without blocking, and read only if it is a regular file;
//! every value is [`sanitised`](sanitise) (at most [`MAX_VALUE`] bytes of `[A-Za-z0-9._:/-]`)
//! before anything else sees it.

use std::fs::File;
use std::io::Read;
use std::os::unix::fs::FileTypeExt;

use pyfleet_actors::Labels;

/// Most bytes of a target's environment read (the variables looked for are usually early).
pub const MAX_ENVIRON: u64 = 128 * 1024;
/// Most bytes of `/proc/PID/cgroup` read (one line per hierarchy).
pub const MAX_CGROUP: u64 = 16 * 1024;
/// Most bytes of a label value.
pub const MAX_VALUE: usize = 128;
/// Where Kubernetes mounts a pod's service-account namespace, inside the container.
const NAMESPACE_FILE: &str = "var/run/secrets/kubernetes.io/serviceaccount/namespace";

/// The labels of process `pid`; `short_name` is its service when its environment names none.
pub fn of_process(pid: i32, short_name: &str) -> Labels {
    let environ = read_bounded(&format!("/proc/{pid}/environ"), MAX_ENVIRON).unwrap_or_default();
    let cgroup = read_bounded(&format!("/proc/{pid}/cgroup"), MAX_CGROUP).unwrap_or_default();
    let namespace = namespace_file(pid);
    from_facts(
        &environ,
        &String::from_utf8_lossy(&cgroup),
        namespace.as_deref(),
        short_name,
    )
}

/// The labels from what was read of a process (see the module documentation).
pub fn from_facts(
    environ: &[u8],
    cgroup: &str,
    namespace_file: Option<&[u8]>,
    short_name: &str,
) -> Labels {
    let var = |name: &str| {
        env_var(environ, name)
            .map(sanitise)
            .filter(|v| !v.is_empty())
    };
    let service = var("OTEL_SERVICE_NAME")
        .or_else(|| var("PYROSCOPE_APPLICATION_NAME"))
        .unwrap_or_else(|| sanitise(short_name.as_bytes()));
    let container = container_of(cgroup);
    let namespace = namespace_file
        .map(|b| sanitise(b.trim_ascii()))
        .filter(|v| !v.is_empty());
    let on_kubernetes = container.pod_uid.is_some() || namespace.is_some();
    let mut labels = Labels::default();
    labels.set("service", service);
    if let Some(id) = container.container_id {
        labels.set("container_id", id);
    }
    if let Some(uid) = container.pod_uid {
        labels.set("pod_uid", uid);
    }
    if let Some(ns) = namespace {
        labels.set("namespace", ns);
    }
    if on_kubernetes {
        if let Some(pod) = var("HOSTNAME") {
            labels.set("pod", pod);
        }
    }
    labels
}

/// A value from a target made safe for file names, metric labels and terminals: at most
/// [`MAX_VALUE`] bytes, every byte outside `[A-Za-z0-9._:/-]` replaced by `_`.
pub fn sanitise(raw: &[u8]) -> String {
    raw.iter()
        .take(MAX_VALUE)
        .map(|&b| match b {
            b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' | b'.' | b'_' | b':' | b'/' | b'-' => b as char,
            _ => '_',
        })
        .collect()
}

/// The value of `name` in a NUL-separated environment block (the first definition wins, as
/// `getenv` finds it).
fn env_var<'a>(environ: &'a [u8], name: &str) -> Option<&'a [u8]> {
    environ.split(|&b| b == 0).find_map(|entry| {
        let rest = entry.strip_prefix(name.as_bytes())?;
        rest.strip_prefix(b"=")
    })
}

/// What a cgroup path says of the container a process runs in.
#[derive(Debug, Default, PartialEq, Eq)]
struct Container {
    container_id: Option<String>,
    pod_uid: Option<String>,
}

/// The container and pod from `/proc/PID/cgroup` (`ID:CONTROLLERS:PATH` lines). The v2
/// line (`0::PATH`) is preferred; v1 lines are looked at when it says nothing.
///
/// Path shapes: `.../docker/<id>`, `.../docker-<id>.scope`, `.../cri-containerd-<id>.scope`,
/// `.../crio-<id>.scope`, `.../libpod-<id>.scope[/container]`, `.../kubepods/<qos>/pod<uid>/<id>`
/// and `.../kubepods-<qos>-pod<uid_with_underscores>.slice/...`: an id is 64 hex digits; a pod
/// uid is a UUID (its `_` read as `-`).
fn container_of(cgroup: &str) -> Container {
    let lines: Vec<(bool, &str)> = cgroup
        .lines()
        .filter_map(|l| {
            let mut parts = l.splitn(3, ':');
            let id = parts.next()?;
            let _controllers = parts.next()?;
            Some((id == "0", parts.next()?))
        })
        .filter(|(_, path)| *path != "/")
        .collect();
    let v2 = lines.iter().filter(|(v2, _)| *v2);
    let v1 = lines.iter().filter(|(v2, _)| !*v2);
    let mut found = Container::default();
    for (_, path) in v2.chain(v1) {
        for component in path.split('/').rev() {
            if found.container_id.is_none() {
                found.container_id = container_id_in(component);
            }
            if found.pod_uid.is_none() {
                found.pod_uid = pod_uid_in(component);
            }
        }
        if found.container_id.is_some() || found.pod_uid.is_some() {
            break;
        }
    }
    found
}

/// A container id (64 hex digits) that is this path component, or its part after a runtime's
/// prefix (`docker-`, `cri-containerd-`, `crio-`, `libpod-`, and others ending in `-`) and
/// before `.scope`.
fn container_id_in(component: &str) -> Option<String> {
    let name = component.strip_suffix(".scope").unwrap_or(component);
    let id = name.rsplit('-').next()?;
    let id = id.rsplit(':').next()?;
    (id.len() == 64 && id.bytes().all(|b| b.is_ascii_hexdigit())).then(|| id.to_ascii_lowercase())
}

/// A pod uid in a path component: `pod<uuid>` (cgroupfs driver) or
/// `kubepods[-<qos>]-pod<uuid with _>.slice` (systemd driver).
fn pod_uid_in(component: &str) -> Option<String> {
    let name = component.strip_suffix(".slice").unwrap_or(component);
    let at = name.rfind("pod")?;
    let uid = name[at + 3..].replace('_', "-");
    let groups: Vec<&str> = uid.split('-').collect();
    let shape = [8, 4, 4, 4, 12];
    let is_uuid = groups.len() == shape.len()
        && groups
            .iter()
            .zip(shape)
            .all(|(g, n)| g.len() == n && g.bytes().all(|b| b.is_ascii_hexdigit()));
    is_uuid.then(|| uid.to_ascii_lowercase())
}

/// At most `max` bytes of a procfs file (`None` if it cannot be read).
fn read_bounded(path: &str, max: u64) -> Option<Vec<u8>> {
    let mut out = Vec::new();
    File::open(path)
        .and_then(|f| f.take(max).read_to_end(&mut out))
        .ok()?;
    Some(out)
}

/// The service-account namespace file inside the target's root, if it is there: opened with
/// that root as the root of resolution, never blocking, read only if it is a regular file.
fn namespace_file(pid: i32) -> Option<Vec<u8>> {
    use nix::fcntl::{openat2, OFlag, OpenHow, ResolveFlag};
    let root = File::open(format!("/proc/{pid}/root")).ok()?;
    let how = OpenHow::new()
        .flags(OFlag::O_RDONLY | OFlag::O_NONBLOCK | OFlag::O_NOCTTY | OFlag::O_CLOEXEC)
        .resolve(ResolveFlag::RESOLVE_IN_ROOT | ResolveFlag::RESOLVE_NO_MAGICLINKS);
    let file = File::from(openat2(&root, NAMESPACE_FILE, how).ok()?);
    let kind = file.metadata().ok()?.file_type();
    if !kind.is_file() || kind.is_fifo() {
        return None;
    }
    let mut out = Vec::new();
    file.take(MAX_VALUE as u64 + 1).read_to_end(&mut out).ok()?;
    Some(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    const ID: &str = "4f1c2b3a5d6e7f8091a2b3c4d5e6f708192a3b4c5d6e7f8091a2b3c4d5e6f7a8";
    const UID: &str = "0e1d2c3b-4a59-6877-8695-a4b3c2d1e0f9";

    fn container(cgroup: &str) -> (Option<String>, Option<String>) {
        let c = container_of(cgroup);
        (c.container_id, c.pod_uid)
    }

    #[test]
    fn container_and_pod_from_every_runtime_and_driver() {
        let uid_ = UID.replace('-', "_");
        let cases = [
            (format!("0::/system.slice/docker-{ID}.scope\n"), true, false),
            (format!("12:pids:/docker/{ID}\n0::/\n"), true, false),
            (
                format!("0::/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod{uid_}.slice/cri-containerd-{ID}.scope\n"),
                true,
                true,
            ),
            (format!("0::/kubepods/besteffort/pod{UID}/{ID}\n"), true, true),
            (
                format!("0::/kubepods.slice/kubepods-pod{uid_}.slice/crio-{ID}.scope\n"),
                true,
                true,
            ),
            (format!("0::/machine.slice/libpod-{ID}.scope/container\n"), true, false),
            (format!("0::/user.slice/user-1000.slice/user@1000.service/user.slice/libpod-{ID}.scope\n"), true, false),
            ("0::/user.slice/user-1000.slice/session-3.scope\n".to_string(), false, false),
            ("0::/\n".to_string(), false, false),
        ];
        for (cgroup, has_id, has_pod) in cases {
            let (id, pod) = container(&cgroup);
            assert_eq!(id.as_deref(), has_id.then_some(ID), "{cgroup}");
            assert_eq!(pod.as_deref(), has_pod.then_some(UID), "{cgroup}");
        }
    }

    #[test]
    fn service_from_the_environment_else_the_name() {
        let env = b"PATH=/bin\0PYROSCOPE_APPLICATION_NAME=pyro\0OTEL_SERVICE_NAME=checkout\0";
        let l = from_facts(env, "0::/\n", None, "gunicorn");
        assert_eq!(l.get("service"), Some("checkout"));
        let l = from_facts(b"PYROSCOPE_APPLICATION_NAME=pyro\0", "0::/\n", None, "x");
        assert_eq!(l.get("service"), Some("pyro"));
        let l = from_facts(
            b"OTEL_SERVICE_NAME=\0HOSTNAME=h\0",
            "0::/\n",
            None,
            "worker",
        );
        assert_eq!(l.get("service"), Some("worker"));
        // Not on Kubernetes: no pod from HOSTNAME.
        assert_eq!(l.get("pod"), None);
    }

    #[test]
    fn kubernetes_labels_need_a_pod_or_a_namespace() {
        let env = b"HOSTNAME=api-7d9f-xk2\0";
        let cgroup = format!("0::/kubepods/burstable/pod{UID}/{ID}\n");
        let l = from_facts(env, &cgroup, Some(b"payments\n"), "api");
        assert_eq!(l.get("namespace"), Some("payments"));
        assert_eq!(l.get("pod"), Some("api-7d9f-xk2"));
        assert_eq!(l.get("pod_uid"), Some(UID));
        assert_eq!(l.get("container_id"), Some(ID));
    }

    #[test]
    fn hostile_values_are_bounded_and_defanged() {
        let mut env = b"OTEL_SERVICE_NAME=a\x1b[31mb\xe2\x80\xaec\"<x>' ".to_vec();
        env.extend(std::iter::repeat_n(b'z', 10_000));
        env.push(0);
        let l = from_facts(&env, "0::/\n", Some(&[b'n'; 5000]), "x");
        let service = l.get("service").unwrap_or_default();
        assert!(service.len() <= MAX_VALUE);
        assert!(service.starts_with("a__31mb___c__x___z"), "{service}");
        assert!(l.get("namespace").unwrap_or_default().len() <= MAX_VALUE);
        // Not a UUID, not an id: nothing.
        assert_eq!(container("0::/kubepods/podnot-a-uid/xyz\n"), (None, None));
    }
}
