//! A file that holds secrets may be read by its owner only.

use std::os::unix::fs::PermissionsExt as _;
use std::path::Path;

use super::ConfigError;

/// Fails when users other than the owner may read or write `path`.
pub(super) fn refuse_if_shared(path: &Path) -> Result<(), ConfigError> {
    let metadata = std::fs::metadata(path).map_err(|source| ConfigError::Read { path: path.into(), source })?;
    let mode = metadata.permissions().mode() & 0o777;
    if mode & 0o077 != 0 {
        return Err(ConfigError::Exposed { path: path.into(), mode });
    }
    Ok(())
}
