//! pyfleet's entry point: parse the command line, run the command, and turn any error into
//! one line on stderr and a non-zero exit (never a backtrace).

mod cli;
mod commands;

use clap::Parser;
use std::process::ExitCode;

fn main() -> ExitCode {
    // A program `record -- COMMAND` starts waits in pyfleet's binary until it is released.
    let args: Vec<std::ffi::OsString> = std::env::args_os().collect();
    if args
        .get(1)
        .is_some_and(|a| a == commands::launched::GATE_ARG)
    {
        commands::launched::gate(&args[2..]);
    }
    pyfleet::memory::limit_malloc_arenas();
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
            // clap's usage errors span several lines; the first says what is wrong, and the
            // indented lines right after it name the arguments when it ends with a colon.
            let rendered = e.to_string();
            let mut lines = rendered.lines();
            let mut first = lines
                .next()
                .unwrap_or("invalid arguments")
                .trim_start_matches("error: ")
                .to_string();
            if first.ends_with(':') {
                let named: Vec<&str> = lines
                    .take_while(|l| l.starts_with(' '))
                    .map(str::trim)
                    .collect();
                first = format!("{} {}", first, named.join(", "));
            }
            // clap's "did you mean" (a similar option, command or value), on the same line.
            use clap::error::{ContextKind, ContextValue};
            let tip = [
                ContextKind::SuggestedArg,
                ContextKind::SuggestedSubcommand,
                ContextKind::SuggestedValue,
            ]
            .into_iter()
            .find_map(|k| match e.get(k) {
                Some(ContextValue::String(s)) => Some(s.clone()),
                Some(ContextValue::Strings(v)) if !v.is_empty() => Some(v.join("', '")),
                _ => None,
            });
            if let Some(tip) = tip {
                first = format!("{}; did you mean '{tip}'?", first.trim_end());
            }
            eprintln!("pyfleet: {}", first.trim_end());
            return ExitCode::from(2);
        }
    };
    pyfleet::logging::init(cli.log_format);
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
