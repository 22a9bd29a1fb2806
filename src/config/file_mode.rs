//! Who else may touch the configuration file: nobody may write it, and nobody may read it when it
//! holds a secret in clear.

use std::io::Read as _;
use std::os::unix::fs::{MetadataExt as _, PermissionsExt as _};
use std::path::Path;

use super::ConfigError;

/// The text of the file at `path` and its permission bits, read through one open file (so what
/// was checked is what was read); refuses a file that users other than the owner may write.
pub(super) fn read_guarded(path: &Path) -> Result<(String, u32), ConfigError> {
    let read = |source| ConfigError::Read { path: path.into(), source };
    let mut file = std::fs::File::open(path).map_err(read)?;
    let metadata = file.metadata().map_err(read)?;
    let mode = metadata.permissions().mode() & 0o777;
    // SAFETY: geteuid(2) has no preconditions and touches no memory of ours.
    let me = unsafe { libc::geteuid() };
    if mode & 0o022 != 0 || (metadata.uid() != me && metadata.uid() != 0) {
        return Err(ConfigError::Writable { path: path.into(), mode });
    }
    let mut text = String::new();
    file.read_to_string(&mut text).map_err(read)?;
    Ok((text, mode))
}
