//! The server's secret (hook tokens derive from it): read from a file, or generated once and
//! published atomically with owner-only permissions.
//!
//! A first start writes the secret to a temporary file next to the final one, flushes it to disk,
//! and publishes it with `link(2)`, which never replaces a file that a concurrent first start
//! published meanwhile; then it flushes the directory. So the secret file is either absent or
//! whole, however the process dies, and all concurrent first starts end with the same secret.

use std::io::Write;
use std::os::unix::fs::{OpenOptionsExt, PermissionsExt};
use std::path::{Path, PathBuf};

/// Bytes of a generated secret.
const SECRET_BYTES: usize = 32;

/// Why the secret file could not be used.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum SecretError {
    /// The file cannot be read, created or flushed.
    #[error("{what} {path}: {source}", path = .path.display())]
    Io {
        /// What was being done.
        what: &'static str,
        /// The file or directory.
        path: PathBuf,
        /// Why it failed.
        source: std::io::Error,
    },
    /// Other users may read the file.
    #[error("{path} may be read by others (mode {mode:o}); run chmod 600 on it", path = .path.display())]
    Exposed {
        /// The file.
        path: PathBuf,
        /// Its permission bits.
        mode: u32,
    },
    /// The file does not hold hex digits.
    #[error("{path} does not hold a hex secret; {REPAIR}", path = .path.display())]
    NotHex {
        /// The file.
        path: PathBuf,
    },
    /// The file holds too few bytes.
    #[error(
        "{path} holds {bytes} bytes, fewer than {SECRET_BYTES}: it was cut short or written by hand; {REPAIR}",
        path = .path.display()
    )]
    TooShort {
        /// The file.
        path: PathBuf,
        /// How many bytes it holds.
        bytes: usize,
    },
    /// The path names no file.
    #[error("{path} is not a file name", path = .path.display())]
    NotAFile {
        /// The path.
        path: PathBuf,
    },
    /// The operating system gave no random bytes.
    #[error("no randomness for a secret: {0}")]
    NoRandomness(getrandom::Error),
    /// Concurrent starts kept creating and removing the file.
    #[error("{path}: the secret file keeps appearing and disappearing", path = .path.display())]
    Unstable {
        /// The file.
        path: PathBuf,
    },
}

/// Reads the hex secret at `path`, or creates it (mode 0600) with fresh random bytes.
/// Refuses a secret file that others may read, or one shorter than 32 bytes.
pub fn load_or_create(path: &Path) -> Result<Vec<u8>, SecretError> {
    remove_stale_temporaries(path);
    // A concurrent first start may publish between our read and our link: then we read its file.
    for _ in 0..3 {
        match read(path)? {
            Some(secret) => return Ok(secret),
            None => {
                if let Some(secret) = create(path)? {
                    return Ok(secret);
                }
            }
        }
    }
    Err(SecretError::Unstable { path: path.to_path_buf() })
}

/// The secret at `path`, or `None` when there is no file.
fn read(path: &Path) -> Result<Option<Vec<u8>>, SecretError> {
    let io = |what| move |source| SecretError::Io { what, path: path.to_path_buf(), source };
    let text = match std::fs::read_to_string(path) {
        Ok(text) => text,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
        Err(e) => return Err(io("cannot read")(e)),
    };
    let mode = std::fs::metadata(path).map_err(io("cannot look at"))?.permissions().mode();
    if mode & 0o077 != 0 {
        return Err(SecretError::Exposed { path: path.to_path_buf(), mode: mode & 0o777 });
    }
    let Some(secret) = decode_hex(text.trim()) else {
        return Err(SecretError::NotHex { path: path.to_path_buf() });
    };
    if secret.len() < SECRET_BYTES {
        return Err(SecretError::TooShort { path: path.to_path_buf(), bytes: secret.len() });
    }
    Ok(Some(secret))
}

/// What an operator can do about a secret file that cannot be used.
const REPAIR: &str = "put 64 or more hex digits in it, or delete it to have a new secret generated at the next \
                      start (automations waiting for approval then cannot be decided any more)";

/// Writes a fresh secret to a temporary file and publishes it at `path`. `None` when another
/// start published first (its secret is the one to use).
fn create(path: &Path) -> Result<Option<Vec<u8>>, SecretError> {
    let dir = match path.parent() {
        Some(dir) if !dir.as_os_str().is_empty() => dir.to_path_buf(),
        _ => PathBuf::from("."),
    };
    let name = path
        .file_name()
        .ok_or_else(|| SecretError::NotAFile { path: path.to_path_buf() })?
        .to_string_lossy()
        .into_owned();
    let mut secret = vec![0u8; SECRET_BYTES];
    getrandom::fill(&mut secret).map_err(SecretError::NoRandomness)?;
    let hex: String = secret.iter().map(|b| format!("{b:02x}")).collect();
    let mut suffix = [0u8; 6];
    getrandom::fill(&mut suffix).map_err(SecretError::NoRandomness)?;
    let suffix: String = suffix.iter().map(|b| format!("{b:02x}")).collect();
    let temporary = dir.join(format!(".{name}.tmp.{}.{suffix}", std::process::id()));
    let written = std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o600)
        .open(&temporary)
        .and_then(|mut file| file.write_all(format!("{hex}\n").as_bytes()).and_then(|()| file.sync_all()));
    let published = written.and_then(|()| std::fs::hard_link(&temporary, path));
    let _ = std::fs::remove_file(&temporary);
    match published {
        Ok(()) => {}
        // Published by another start meanwhile, or our temporary was taken for a stale one
        // (by a start that cannot see this process, in another PID namespace): read again.
        Err(e) if matches!(e.kind(), std::io::ErrorKind::AlreadyExists | std::io::ErrorKind::NotFound) => {
            return Ok(None);
        }
        Err(source) => return Err(SecretError::Io { what: "cannot create", path: path.to_path_buf(), source }),
    }
    std::fs::File::open(&dir).and_then(|d| d.sync_all()).map_err(|source| SecretError::Io {
        what: "cannot flush",
        path: dir.clone(),
        source,
    })?;
    Ok(Some(secret))
}

/// How old a temporary secret file must be to count as left behind: a first start writes and
/// links its own within milliseconds.
const STALE_AFTER: std::time::Duration = std::time::Duration::from_secs(60);

/// Removes the temporary files (`.NAME.tmp.PID.RANDOM`) that starts killed while they wrote the
/// secret at `path` left behind: copies of a secret, which must not linger.
fn remove_stale_temporaries(path: &Path) {
    let (Some(dir), Some(name)) = (path.parent(), path.file_name()) else { return };
    let dir = if dir.as_os_str().is_empty() { Path::new(".") } else { dir };
    let prefix = format!(".{}.tmp.", name.to_string_lossy());
    let Ok(entries) = std::fs::read_dir(dir) else { return };
    for entry in entries.flatten() {
        let stale = entry.file_name().to_str().is_some_and(|n| n.starts_with(&prefix))
            && entry
                .metadata()
                .and_then(|m| m.modified())
                .is_ok_and(|at| at.elapsed().is_ok_and(|age| age > STALE_AFTER));
        if stale {
            let _ = std::fs::remove_file(entry.path());
        }
    }
}

fn decode_hex(text: &str) -> Option<Vec<u8>> {
    if text.len() % 2 != 0 {
        return None;
    }
    (0..text.len()).step_by(2).map(|i| u8::from_str_radix(text.get(i..i + 2)?, 16).ok()).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn temp_dir(name: &str) -> PathBuf {
        let dir = std::env::temp_dir().join(format!("resumable-secret-{name}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        dir
    }

    #[test]
    fn generated_once_private_and_reread() {
        let dir = temp_dir("once");
        let path = dir.join("secret");
        let first = load_or_create(&path).unwrap();
        assert_eq!(first.len(), 32);
        assert_eq!(std::fs::metadata(&path).unwrap().permissions().mode() & 0o777, 0o600);
        assert_eq!(load_or_create(&path).unwrap(), first);
        assert_eq!(std::fs::read_dir(&dir).unwrap().count(), 1, "no temporary file is left");
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o644)).unwrap();
        assert!(load_or_create(&path).unwrap_err().to_string().contains("chmod 600"));
        std::fs::write(&path, "zz").unwrap();
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o600)).unwrap();
        assert!(load_or_create(&path).unwrap_err().to_string().contains("delete it"));
        let _ = std::fs::remove_dir_all(dir);
    }

    #[test]
    fn a_short_or_empty_file_is_reported_with_what_to_do() {
        let dir = temp_dir("short");
        let path = dir.join("secret");
        for content in ["", "abcd\n"] {
            std::fs::write(&path, content).unwrap();
            std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o600)).unwrap();
            let error = load_or_create(&path).unwrap_err().to_string();
            assert!(error.contains("fewer than 32") && error.contains("delete it"), "{error}");
        }
        let _ = std::fs::remove_dir_all(dir);
    }

    #[test]
    fn concurrent_first_starts_agree_on_one_secret() {
        let dir = temp_dir("concurrent");
        let path = dir.join("secret");
        let threads: Vec<_> = (0..8)
            .map(|_| {
                let path = path.clone();
                std::thread::spawn(move || load_or_create(&path).unwrap())
            })
            .collect();
        let secrets: Vec<Vec<u8>> = threads.into_iter().map(|t| t.join().unwrap()).collect();
        assert!(secrets.iter().all(|s| *s == secrets[0]), "every start uses the published secret");
        assert_eq!(load_or_create(&path).unwrap(), secrets[0]);
        assert_eq!(std::fs::read_dir(&dir).unwrap().count(), 1, "no temporary file is left");
        let _ = std::fs::remove_dir_all(dir);
    }

    #[test]
    fn temporaries_left_behind_are_removed_at_every_start() {
        let dir = temp_dir("stale");
        let path = dir.join("secret");
        let first = load_or_create(&path).unwrap();
        // A start killed between publishing and removing its temporary left a copy behind.
        let old = dir.join(".secret.tmp.4999999.abcdef");
        std::fs::write(&old, "copy").unwrap();
        let an_hour_ago = std::time::SystemTime::now() - std::time::Duration::from_secs(3600);
        std::fs::File::options().write(true).open(&old).unwrap().set_modified(an_hour_ago).unwrap();
        let fresh = dir.join(".secret.tmp.4999998.012345");
        std::fs::write(&fresh, "").unwrap();
        assert_eq!(load_or_create(&path).unwrap(), first);
        assert!(!old.exists(), "a temporary left behind is removed, even when the secret exists");
        assert!(fresh.exists(), "a fresh one may belong to a start under way");
        let _ = std::fs::remove_dir_all(dir);
    }
}
