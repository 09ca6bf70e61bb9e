//! `pyfleet list`: the Python processes of this host, who each is, and what could not be
//! inspected.

use anyhow::Result;
use pyfleet::output::for_terminal;
use pyfleet_policies::MatchPolicy;

pub fn run(
    matches: &[String],
    match_label: &[String],
    exclude_label: &[String],
    subprocesses: bool,
) -> Result<()> {
    use pyfleet_actors::Discovery;
    use pyfleet_policies::Role;
    let own = Some(std::process::id() as i32);
    let policy = MatchPolicy::new(matches, [] as [&str; 0], &[], own)?
        .with_label_rules(match_label, exclude_label)?;
    // The daemon's own scan: the same processes, names, roles and labels as it would list.
    let mut discovery =
        pyfleet::discovery::HostDiscovery::new(policy).with_subprocesses(subprocesses);
    let found = discovery.scan();
    let refused = pyfleet::discovery::refusal_line(&discovery.refused());
    outln!(
        "{:>7}  {:>7}  {:<9}  {:<24}  {:<6}  {:<20}  {:<24}  COMMAND",
        "PID",
        "PPID",
        "PYTHON",
        "NAME",
        "ROLE",
        "SERVICE",
        "LABELS"
    );
    for p in &found {
        // Of its parent (PPID) for a worker.
        let role = match p.role {
            Role::Single => "-",
            r => r.as_str(),
        };
        // Labels are sanitised where they are found; the container id as `docker ps`
        // shortens it.
        let others: Vec<String> = p
            .labels
            .iter()
            .filter(|(k, _)| *k != "service")
            .map(|(k, v)| match k {
                "container_id" => format!("container={}", v.get(..12).unwrap_or(v)),
                _ => format!("{k}={v}"),
            })
            .collect();
        let others = if others.is_empty() {
            "-".to_string()
        } else {
            others.join(",")
        };
        outln!(
            "{:>7}  {:>7}  {:<9}  {:<24}  {:<6}  {:<20}  {:<24}  {}",
            p.pid,
            p.ppid,
            for_terminal(&p.python_version),
            p.name,
            role,
            p.labels.get("service").unwrap_or("-"),
            others,
            for_terminal(&p.cmdline)
        );
    }
    // What could not be inspected is said, and with nothing else found it is the error: not
    // "nothing found" when permission was the reason.
    match (refused, found.is_empty()) {
        (Some(line), true) => anyhow::bail!("{line}"),
        (Some(line), false) => eprintln!("pyfleet: {line}"),
        (None, true) => eprintln!("pyfleet: no matching Python process found"),
        (None, false) => {}
    }
    Ok(())
}
