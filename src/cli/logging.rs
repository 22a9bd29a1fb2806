//! Where the commands that run for a while (`serve`, `migrate`) log: stderr, filtered by
//! `RUST_LOG`, as human-readable text or one JSON object a line (`--log-format`).

use clap::{Args, ValueEnum};
use tracing_subscriber::EnvFilter;
use tracing_subscriber::filter::LevelFilter;

/// The variable that filters the log, in `tracing-subscriber`'s `EnvFilter` syntax.
const FILTER_VARIABLE: &str = "RUST_LOG";

/// How each line of the log is written.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, ValueEnum)]
pub enum LogFormat {
    /// Human-readable text, coloured when stderr is a terminal.
    #[default]
    Text,
    /// One JSON object a line: `timestamp`, `level`, `target`, `fields` (with `message`), and
    /// `span` and `spans` (the request's or round's span and the spans it is in).
    Json,
}

/// The flags that choose how a command logs.
#[derive(Clone, Copy, Debug, Args)]
pub struct LogArgs {
    /// The log's format on stderr; which events are logged is set by RUST_LOG (default: info),
    /// e.g. RUST_LOG=debug or RUST_LOG=info,resumable=debug.
    #[arg(long, value_name = "FORMAT", value_enum, default_value_t, env = "RESUMABLE_LOG_FORMAT")]
    log_format: LogFormat,
}

impl LogArgs {
    /// Installs the process's subscriber: stderr, filtered by `RUST_LOG` (`info` when it is
    /// unset or empty). A `RUST_LOG` that does not parse is refused, with the directive that is
    /// wrong, rather than silently logging something else than asked.
    pub fn init(self) -> Result<(), String> {
        let directives = std::env::var(FILTER_VARIABLE).unwrap_or_default();
        let filter = parse_filter(&directives)?;
        let builder = tracing_subscriber::fmt().with_writer(std::io::stderr).with_env_filter(filter);
        let installed = match self.log_format {
            LogFormat::Text => {
                use std::io::IsTerminal as _;
                builder.with_ansi(std::io::stderr().is_terminal()).with_target(false).try_init()
            }
            LogFormat::Json => builder.json().with_current_span(true).with_span_list(true).try_init(),
        };
        installed.map_err(|e| format!("cannot set up the log: {e}"))?;
        if self.log_format == LogFormat::Json {
            // A panic's message is a log line like every other, so that each line stays JSON.
            std::panic::set_hook(Box::new(|panic| {
                let backtrace = std::backtrace::Backtrace::capture();
                if tracing::enabled!(tracing::Level::ERROR) {
                    tracing::error!(%panic, %backtrace, "panicked");
                } else {
                    // Filtered out by RUST_LOG: a panic is never silent.
                    eprintln!(
                        "{}",
                        serde_json::json!({ "level": "ERROR", "message": "panicked", "panic": panic.to_string() })
                    );
                }
            }));
        }
        Ok(())
    }

    /// Reports why the command stops: `error: MESSAGE` on stderr as text, or an error event
    /// as JSON (so that every line of a JSON log parses).
    pub fn fatal(self, message: impl std::fmt::Display) {
        match self.log_format {
            LogFormat::Text => eprintln!("error: {message}"),
            LogFormat::Json if tracing::enabled!(tracing::Level::ERROR) => {
                tracing::error!(error = %message, "exiting")
            }
            // Filtered out by RUST_LOG: why the command stops is never silent.
            LogFormat::Json => {
                eprintln!(
                    "{}",
                    serde_json::json!({ "level": "ERROR", "message": "exiting", "error": message.to_string() })
                )
            }
        }
    }
}

/// The filter `directives` (`RUST_LOG`'s value) describe; `info` for everything when empty.
fn parse_filter(directives: &str) -> Result<EnvFilter, String> {
    EnvFilter::builder()
        .with_default_directive(LevelFilter::INFO.into())
        // Field values in directives match literally: no regular expression runs on log fields.
        .with_regex(false)
        .parse(directives.trim())
        .map_err(|e| format!("{FILTER_VARIABLE}={directives:?} is not a valid log filter: {e}"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_empty_filter_logs_info_and_above() {
        let filter = parse_filter("").unwrap();
        assert_eq!(filter.max_level_hint(), Some(LevelFilter::INFO));
        let filter = parse_filter("  ").unwrap();
        assert_eq!(filter.max_level_hint(), Some(LevelFilter::INFO));
    }

    #[test]
    fn directives_set_the_levels() {
        assert_eq!(parse_filter("debug").unwrap().max_level_hint(), Some(LevelFilter::DEBUG));
        assert_eq!(parse_filter("warn,resumable=trace").unwrap().max_level_hint(), Some(LevelFilter::TRACE));
    }

    #[test]
    fn an_invalid_filter_is_refused_with_what_is_wrong() {
        let error = parse_filter("resumable=loud").unwrap_err();
        assert!(error.contains("RUST_LOG=\"resumable=loud\" is not a valid log filter"), "{error}");
    }
}
