//! The server's secret (hook tokens derive from it): read from a file, or generated once and
//! persisted with owner-only permissions.

use std::io::Write;
use std::os::unix::fs::{OpenOptionsExt, PermissionsExt};
use std::path::Path;

/// Bytes of a generated secret.
const SECRET_BYTES: usize = 32;

/// Reads the hex secret at `path`, or creates it (mode 0600) with fresh random bytes.
/// Refuses a secret file that others may read, or one shorter than 32 bytes.
pub fn load_or_create(path: &Path) -> Result<Vec<u8>, String> {
    let shown = path.display();
    match std::fs::read_to_string(path) {
        Ok(text) => {
            let mode = std::fs::metadata(path).map_err(|e| format!("{shown}: {e}"))?.permissions().mode();
            if mode & 0o077 != 0 {
                return Err(format!("{shown} may be read by others (mode {:o}); run chmod 600 on it", mode & 0o777));
            }
            let secret = decode_hex(text.trim()).ok_or_else(|| format!("{shown} does not hold a hex secret"))?;
            if secret.len() < SECRET_BYTES {
                return Err(format!("{shown} holds fewer than {SECRET_BYTES} bytes"));
            }
            Ok(secret)
        }
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
            let mut secret = vec![0u8; SECRET_BYTES];
            getrandom::fill(&mut secret).map_err(|e| format!("no randomness for a secret: {e}"))?;
            let hex: String = secret.iter().map(|b| format!("{b:02x}")).collect();
            let mut file = std::fs::OpenOptions::new()
                .write(true)
                .create_new(true)
                .mode(0o600)
                .open(path)
                .map_err(|e| format!("cannot create {shown}: {e}"))?;
            file.write_all(format!("{hex}\n").as_bytes())
                .and_then(|()| file.sync_all())
                .map_err(|e| format!("{shown}: {e}"))?;
            Ok(secret)
        }
        Err(e) => Err(format!("cannot read {shown}: {e}")),
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

    #[test]
    fn generated_once_private_and_reread() {
        let dir = std::env::temp_dir().join(format!("resumable-secret-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("secret");
        let _ = std::fs::remove_file(&path);
        let first = load_or_create(&path).unwrap();
        assert_eq!(first.len(), 32);
        assert_eq!(std::fs::metadata(&path).unwrap().permissions().mode() & 0o777, 0o600);
        assert_eq!(load_or_create(&path).unwrap(), first);
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o644)).unwrap();
        assert!(load_or_create(&path).unwrap_err().contains("chmod 600"));
        std::fs::write(&path, "zz").unwrap();
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o600)).unwrap();
        assert!(load_or_create(&path).is_err());
        let _ = std::fs::remove_dir_all(dir);
    }
}
