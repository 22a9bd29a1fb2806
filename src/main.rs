//! `resumable`: the command-line interface to the Resumable sandbox.
//!
//! Every task is a subcommand (see [`cli::Command`]); `resumable --help` lists them.

mod cli;

use clap::Parser;
use std::process::ExitCode;

fn main() -> ExitCode {
    cli::Cli::parse().execute()
}
