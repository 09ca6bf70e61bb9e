//! The image: the Dockerfile passes hadolint and fits the DaemonSet.

use super::*;
use serde_json::json;
use std::process::Command;

/// deploy/Dockerfile passes hadolint (no finding at any level), and the image is the one the
/// DaemonSet expects: the binary where its `command` runs it, the port it names, and a
/// non-root default user that the DaemonSet overrides with uid 0 (added capabilities are
/// given to root only). No Docker engine runs here: the build itself is not exercised.
#[test]
fn dockerfile_passes_hadolint_and_fits_the_daemonset() {
    let _machine = shared();
    let (Some(hadolint), Some(venv)) = (
        provided(
            "hadolint",
            venvs_dir().join("hadolint/bin/hadolint"),
            SETUP_DEPLOY_TOOLS,
        ),
        deploy_tools_venv(),
    ) else {
        return;
    };
    let dockerfile = deploy("Dockerfile");
    let mut cmd = Command::new(&hadolint);
    cmd.args(["--failure-threshold", "style", "--format", "tty"])
        .arg(&dockerfile);
    let out = run(cmd);
    assert!(out.success(), "hadolint:\n{}", out.describe());

    let text = read(&dockerfile);
    let instruction = |name: &str| -> Vec<String> {
        text.lines()
            .filter_map(|l| l.strip_prefix(&format!("{name} ")))
            .map(str::to_string)
            .collect()
    };
    let froms = instruction("FROM");
    assert_eq!(
        froms.len(),
        2,
        "a build stage and a runtime stage: {froms:?}"
    );
    assert!(
        instruction("COPY")
            .iter()
            .any(|c| c.starts_with("--from=build ") && c.ends_with(" /usr/local/bin/pyfleet")),
        "the runtime stage holds the built binary at /usr/local/bin/pyfleet"
    );
    let user = instruction("USER");
    assert!(
        user.last()
            .is_some_and(|u| !u.starts_with('0') && !u.starts_with("root")),
        "the image's default user is not root: {user:?}"
    );
    let ds = yaml_documents(&venv, &deploy("kubernetes/daemonset.yaml"))
        .into_iter()
        .find(|d| d["kind"] == "DaemonSet")
        .unwrap();
    let container = &ds["spec"]["template"]["spec"]["containers"][0];
    assert_eq!(container["command"], json!(["/usr/local/bin/pyfleet"]));
    assert_eq!(container["securityContext"]["runAsUser"], 0);
    let ports: Vec<String> = container["ports"]
        .as_array()
        .unwrap()
        .iter()
        .map(|p| p["containerPort"].to_string())
        .collect();
    assert_eq!(instruction("EXPOSE"), vec![ports.join(" ")]);
    // The image's own command serves what the DaemonSet's does.
    let cmd = instruction("CMD");
    for arg in container["args"].as_array().unwrap() {
        let arg = arg.as_str().unwrap();
        assert!(
            cmd.iter().any(|c| c.contains(&format!("\"{arg}\""))),
            "{arg} not in the image's CMD {cmd:?}"
        );
    }
    // The build context leaves out what the build does not need.
    let ignored = read(&deploy("Dockerfile.dockerignore"));
    for p in ["target", ".git"] {
        assert!(
            ignored.lines().any(|l| l.trim() == p),
            "{p} not in the .dockerignore"
        );
    }
}
