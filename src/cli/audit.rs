//! `resumable audit verify`: recomputes the tenants' audit chains and names the first entry of
//! each that does not verify.

use clap::{Args, Subcommand};
use resumable::audit::Audit;
use resumable::db::AppDb;
use std::process::ExitCode;

use super::usage_error;

/// Exit status when an entry does not verify.
const EXIT_BROKEN: u8 = 1;

/// What `resumable audit` does.
#[derive(Debug, Subcommand)]
pub enum AuditCommand {
    /// Recompute every entry's hash and link: print a summary and exit 0 when all verify;
    /// otherwise name each broken chain's first bad entry (tenant, seq, why) and exit 1.
    Verify(VerifyArgs),
}

/// Arguments of `resumable audit verify`.
#[derive(Debug, Args)]
pub struct VerifyArgs {
    /// The database: sqlite://FILE or postgres://USER:PASSWORD@HOST/DB.
    #[arg(long, value_name = "URL", env = "RESUMABLE_DB")]
    db: String,

    /// Only this tenant's chain (every tenant's by default).
    #[arg(long, value_name = "TENANT")]
    tenant: Option<String>,
}

/// Runs `resumable audit …`.
pub fn execute(command: AuditCommand) -> ExitCode {
    match command {
        AuditCommand::Verify(args) => verify(args),
    }
}

/// Verifies the chains. stdout: one JSON line per tenant, then a summary line; a broken chain is
/// also named on stderr. Exit 0 when every entry verifies, 1 when one does not, 2 when the
/// database cannot be read.
fn verify(args: VerifyArgs) -> ExitCode {
    if let Some(path) = missing_sqlite_file(&args.db) {
        return usage_error(format!("there is no database file {path}: opening it would create an empty one"));
    }
    let rt = match tokio::runtime::Builder::new_current_thread().enable_all().build() {
        Ok(rt) => rt,
        Err(e) => return usage_error(format!("cannot start the async runtime: {e}")),
    };
    let reports = rt.block_on(async {
        let db = AppDb::open(&args.db).await.map_err(|e| format!("cannot open the database: {e}"))?;
        Audit::new(db).verify(args.tenant.as_deref()).await.map_err(|e| e.to_string())
    });
    let reports = match reports {
        Ok(reports) => reports,
        Err(message) => return usage_error(message),
    };
    for report in &reports {
        println!("{}", serde_json::to_string(report).unwrap_or_default());
        if let Some(broken) = &report.broken {
            eprintln!(
                "audit: tenant {:?}, entry {} does not verify ({}): {}",
                report.tenant,
                broken.seq,
                broken.problem.code(),
                broken.reason
            );
        }
    }
    let broken = reports.iter().filter(|r| !r.is_whole()).count();
    let entries: u64 = reports.iter().map(|r| r.verified).sum();
    let summary = serde_json::json!({
        "verified": broken == 0,
        "tenants": reports.len(),
        "brokenTenants": broken,
        "entries": entries,
    });
    println!("{summary}");
    if broken == 0 {
        eprintln!("audit: {} tenants, {entries} entries: every entry verifies", reports.len());
        ExitCode::SUCCESS
    } else {
        ExitCode::from(EXIT_BROKEN)
    }
}

/// The file a `sqlite:` URL names, when it does not exist (verifying it would create it).
fn missing_sqlite_file(url: &str) -> Option<&str> {
    let rest = url.get(..7).filter(|scheme| scheme.eq_ignore_ascii_case("sqlite:")).map(|_| &url[7..])?;
    let rest = rest.strip_prefix("//").unwrap_or(rest);
    let (path, query) = rest.split_once('?').unwrap_or((rest, ""));
    // In memory, or percent-encoded: the store's own parser decides.
    let special = path.is_empty() || path == ":memory:" || path.contains('%') || query.contains("memory");
    (!special && !std::path::Path::new(path).exists()).then_some(path)
}

#[cfg(test)]
mod tests {
    use super::missing_sqlite_file;

    #[test]
    fn a_missing_sqlite_file_is_named() {
        assert_eq!(missing_sqlite_file("sqlite:///no/such/audit.db"), Some("/no/such/audit.db"));
        assert_eq!(missing_sqlite_file("sqlite:/no/such.db?mode=ro"), Some("/no/such.db"));
        assert_eq!(missing_sqlite_file("sqlite::memory:"), None);
        let dir = std::env::temp_dir();
        assert_eq!(missing_sqlite_file(&format!("sqlite://{}", dir.display())), None, "it exists");
        assert_eq!(missing_sqlite_file("postgres://localhost/db"), None);
    }
}
