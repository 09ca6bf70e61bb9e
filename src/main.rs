//! pyfleet's entry point: parse the command line, run the command, and turn any error into
//! one line on stderr and a non-zero exit (never a backtrace).

mod cli;
mod daemon;

use clap::Parser;
use std::process::ExitCode;

fn main() -> ExitCode {
    let cli = match cli::Cli::try_parse() {
        Ok(cli) => cli,
        Err(e) => {
            use clap::error::ErrorKind;
            if matches!(e.kind(), ErrorKind::DisplayHelp | ErrorKind::DisplayVersion)
                || e.kind() == ErrorKind::DisplayHelpOnMissingArgumentOrSubcommand
            {
                let _ = e.print();
                return if e.kind() == ErrorKind::DisplayHelpOnMissingArgumentOrSubcommand {
                    ExitCode::from(2)
                } else {
                    ExitCode::SUCCESS
                };
            }
            // clap's usage errors span several lines; the first says what is wrong.
            let rendered = e.to_string();
            let first = rendered.lines().next().unwrap_or("invalid arguments");
            eprintln!("pyfleet: {}", first.trim_start_matches("error: "));
            return ExitCode::from(2);
        }
    };
    tracing_subscriber::fmt()
        .with_writer(std::io::stderr)
        .with_max_level(tracing::Level::WARN)
        .init();
    match cli::run(cli) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            // One line: the chain of causes, innermost last.
            let msg: Vec<String> = e.chain().map(|c| c.to_string()).collect();
            eprintln!("pyfleet: {}", msg.join(": ").replace('\n', " "));
            ExitCode::FAILURE
        }
    }
}
