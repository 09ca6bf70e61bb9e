//! A process's CPU time, in clock ticks.

/// Clock ticks per second in /proc's times: the kernel's USER_HZ, 100 on x86 and arm64.
pub const CLOCK_TICKS: f64 = 100.0;

/// The process's CPU time so far (utime + stime, clock ticks).
pub fn cpu_ticks(pid: i32) -> u64 {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
    let after = stat.rfind(')').map_or("", |i| &stat[i + 1..]);
    let f: Vec<&str> = after.split_whitespace().collect();
    // Fields after the name start at 3 (state); utime is 14, stime 15.
    let n = |i: usize| {
        f.get(i - 3)
            .and_then(|v| v.parse::<u64>().ok())
            .unwrap_or(0)
    };
    n(14) + n(15)
}
