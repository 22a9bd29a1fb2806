//! The command line: a top-level parser with one subcommand per task.

mod admin;
mod audit;
mod inspect;
mod logging;
mod report;
mod run;
mod serve;

use clap::{Parser, Subcommand};
use std::process::ExitCode;

/// Exit status of a command line the program could not act on (bad flag value,
/// unreadable file). clap's own parse errors use the same status.
const EXIT_USAGE: u8 = 2;

/// Run untrusted JavaScript in a QuickJS sandbox with hard limits.
#[derive(Debug, Parser)]
#[command(
    name = "resumable",
    version,
    about = "Run untrusted JavaScript in a QuickJS sandbox with hard limits",
    long_about = "Run untrusted JavaScript in a QuickJS sandbox with hard limits.\n\n\
        Scripts reach the outside world only through host functions that an embedding \
        application exposes; a host function can pause a run for a human decision, and \
        the run is resumed later from a signed continuation.",
    propagate_version = true
)]
pub struct Cli {
    #[command(subcommand)]
    command: Command,
}

/// The tasks the program performs.
#[derive(Debug, Subcommand)]
pub enum Command {
    /// Run a script in the sandbox and print its outcome as one JSON line.
    #[command(long_about = run::RUN_LONG_ABOUT)]
    Run(run::RunArgs),
    /// Verify a continuation token and show its pending interruptions, expiry and run id.
    Inspect(inspect::InspectArgs),
    /// Run the HTTP approval service (automations, approvals, events) on SQLite or PostgreSQL.
    Serve(serve::ServeArgs),
    /// Create or upgrade the database tables, then exit.
    Migrate(serve::MigrateArgs),
    /// Print the host functions a configuration file declares: JSON, or a TypeScript declaration.
    Functions(serve::FunctionsArgs),
    /// Work with a configuration file.
    #[command(subcommand)]
    Config(ConfigCommand),
    /// Work with the tenants' audit log.
    #[command(subcommand)]
    Audit(audit::AuditCommand),
    /// Resume a continuation that `run --secret-file` printed, with decisions.
    Resume(run::ResumeArgs),
    /// List, show and cancel automations on a server (`--server`, `RESUMABLE_API_KEY`).
    #[command(subcommand)]
    Automations(admin::AutomationsCommand),
    /// List and decide pending approvals on a server.
    #[command(subcommand)]
    Approvals(admin::ApprovalsCommand),
    /// List, show and destroy sessions on a server.
    #[command(subcommand)]
    Sessions(admin::SessionsCommand),
    /// Serve runs on stdin/stdout as a worker process (started by the runner itself).
    #[command(name = "__worker", hide = true)]
    Worker,
}

/// What `resumable config` does.
#[derive(Debug, Subcommand)]
pub enum ConfigCommand {
    /// Validate a configuration file without serving.
    Check(serve::ConfigCheckArgs),
}

impl Cli {
    /// Performs the chosen command and returns the process exit status.
    pub fn execute(self) -> ExitCode {
        match self.command {
            Command::Run(args) => run::execute(args),
            Command::Inspect(args) => inspect::execute(args),
            Command::Serve(args) => serve::execute_serve(args),
            Command::Migrate(args) => serve::execute_migrate(args),
            Command::Config(ConfigCommand::Check(args)) => serve::execute_config_check(args),
            Command::Functions(args) => serve::execute_functions(args),
            Command::Audit(command) => audit::execute(command),
            Command::Resume(args) => run::resume(args),
            Command::Automations(command) => admin::automations(command),
            Command::Approvals(command) => admin::approvals(command),
            Command::Sessions(command) => admin::sessions(command),
            Command::Worker => resumable::runner::process::serve_worker(),
        }
    }
}

/// Reports a usage problem found after parsing: a message on stderr, nothing on stdout.
fn usage_error(message: impl std::fmt::Display) -> ExitCode {
    eprintln!("error: {message}");
    ExitCode::from(EXIT_USAGE)
}
