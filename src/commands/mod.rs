//! One module per command: `run` (the fleet daemon), `record`, `dump`, `list`, `doctor`,
//! `bench`, `diff`, `top`. `fleet_runtime` is what `run` and `record` share (the async runtime, stopping
//! the fleet and writing its last output, the warnings about privilege); `launched` is the
//! program either of them starts (`-- COMMAND`). `cli.rs` parses the command line and calls
//! them; no command imports another.

/// `println!` for command output: a reader that went away (`pyfleet dump | head`) ends pyfleet
/// quietly, any other write error in one line; never a panic.
macro_rules! outln {
    ($($t:tt)*) => {
        $crate::commands::write_stdout(format_args!($($t)*))
    };
}

pub(crate) fn write_stdout(args: std::fmt::Arguments<'_>) {
    use std::io::Write;
    let mut out = std::io::stdout().lock();
    if let Err(e) = writeln!(out, "{args}").and_then(|()| out.flush()) {
        if e.kind() == std::io::ErrorKind::BrokenPipe {
            std::process::exit(0);
        }
        eprintln!("pyfleet: cannot write to standard output: {e}");
        std::process::exit(1);
    }
}

pub mod bench;
pub mod diff;
pub mod doctor;
pub mod dump;
pub mod fleet_runtime;
pub mod launched;
pub mod list;
pub mod privileges;
pub mod record;
pub mod run;
pub mod top;
