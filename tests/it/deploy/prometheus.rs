//! Prometheus: the scrape config and rules pass promtool.

use super::*;
use serde_json::json;
use std::collections::BTreeSet;
use std::fs;
use std::process::Command;

#[test]
fn prometheus_config_and_rules_pass_promtool() {
    let _machine = shared();
    let (Some(promtool), Some(venv)) = (deploy_tool("promtool"), deploy_tools_venv()) else {
        return;
    };
    let config = deploy("prometheus/prometheus.yml");
    let rules = deploy("prometheus/pyfleet.rules.yml");
    let rule_tests = deploy("prometheus/pyfleet.rules.test.yml");

    // promtool checks that the token file exists: a copy of the config, its token file in a
    // test place, beside the rules it loads.
    let tmp = tempdir("pyfleet-promtool-");
    let text = read(&config);
    assert!(text.contains(PROMETHEUS_TOKEN_FILE), "{text}");
    let token = listen_token(tmp.path());
    let checked = tmp.path().join("prometheus.yml");
    fs::write(
        &checked,
        text.replace(PROMETHEUS_TOKEN_FILE, token.to_str().unwrap()),
    )
    .unwrap();
    fs::copy(&rules, tmp.path().join("pyfleet.rules.yml")).unwrap();
    let mut cmd = Command::new(&promtool);
    cmd.args(["check", "config"]).arg(&checked);
    let out = must(cmd);
    assert!(
        out.stdout.contains("1 rule files found"),
        "{}",
        out.describe()
    );

    let mut cmd = Command::new(&promtool);
    cmd.args(["check", "rules"]).arg(&rules);
    must(cmd);

    let mut cmd = Command::new(&promtool);
    cmd.args(["test", "rules"])
        .arg(&rule_tests)
        .current_dir(rule_tests.parent().unwrap());
    let out = must(cmd);
    assert!(out.stdout.contains("SUCCESS"), "{}", out.describe());

    let cfg = &yaml_documents(&venv, &config)[0];
    assert_eq!(cfg["rule_files"], json!(["pyfleet.rules.yml"]));
    let job = cfg["scrape_configs"]
        .as_array()
        .unwrap()
        .iter()
        .find(|j| j["job_name"] == "pyfleet")
        .expect("no job pyfleet");
    assert_eq!(
        job["static_configs"][0]["targets"],
        json!(["127.0.0.1:9464"])
    );
    assert_eq!(
        job["authorization"],
        json!({"type": "Bearer", "credentials_file": PROMETHEUS_TOKEN_FILE})
    );

    let alerts: BTreeSet<String> = yaml_documents(&venv, &rules)[0]["groups"]
        .as_array()
        .unwrap()
        .iter()
        .flat_map(|g| g["rules"].as_array().unwrap().iter())
        .filter_map(|r| r["alert"].as_str().map(str::to_string))
        .collect();
    for name in [
        "PyfleetDown",
        "PyfleetHighErrorRate",
        "PyfleetOverCpuBudget",
        "PyfleetSamplerRestarting",
    ] {
        assert!(alerts.contains(name), "no alert {name}: {alerts:?}");
    }
    // Every alert has a unit test that fires it.
    let tests = read(&rule_tests);
    for name in &alerts {
        assert!(
            tests.contains(&format!("alertname: {name}")),
            "no unit test for {name}"
        );
    }
}
