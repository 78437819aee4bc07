//! Each project's Ed25519 identity: made on first run and kept in `<state_dir>/<project>.key`
//! (the 32-byte secret in hex, mode 0600), so a restarted connector presents the same key and
//! the gateway's pin keeps matching.

use std::io::Write;
use std::os::unix::fs::{OpenOptionsExt, PermissionsExt};
use std::path::{Path, PathBuf};

use ed25519_dalek::SigningKey;

/// Where `project`'s key is kept.
pub fn key_path(state_dir: &Path, project: &str) -> PathBuf {
    state_dir.join(format!("{project}.key"))
}

/// `project`'s key: read from its file, or made and written there (0600) when there is none.
/// A file that others may read, or that does not hold a key, is refused with what to do.
pub fn load_or_create(state_dir: &Path, project: &str) -> Result<SigningKey, String> {
    let path = key_path(state_dir, project);
    match std::fs::read_to_string(&path) {
        Ok(text) => {
            let mode = std::fs::metadata(&path)
                .map_err(|e| format!("{}: {e}", path.display()))?
                .permissions()
                .mode();
            if mode & 0o077 != 0 {
                return Err(format!(
                    "{}: the identity key may be read by others (mode {:o}); chmod 600 it",
                    path.display(),
                    mode & 0o777
                ));
            }
            let bytes: [u8; 32] = hex::decode(text.trim())
                .ok()
                .and_then(|b| b.try_into().ok())
                .ok_or_else(|| {
                    format!(
                        "{}: not an identity key (64 hex digits); move it away to make a new one, \
                         and re-pin the project's key at the gateway",
                        path.display()
                    )
                })?;
            Ok(SigningKey::from_bytes(&bytes))
        }
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => create(&path),
        Err(e) => Err(format!("{}: {e}", path.display())),
    }
}

fn create(path: &Path) -> Result<SigningKey, String> {
    if let Some(dir) = path.parent() {
        std::fs::create_dir_all(dir).map_err(|e| format!("{}: {e}", dir.display()))?;
    }
    let key = SigningKey::from_bytes(&rand::random::<[u8; 32]>());
    let mut file = std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o600)
        .open(path)
        .map_err(|e| format!("{}: {e}", path.display()))?;
    writeln!(file, "{}", hex::encode(key.to_bytes()))
        .and_then(|()| file.sync_all())
        .map_err(|e| format!("{}: {e}", path.display()))?;
    tracing::info!(path = %path.display(), "made a new identity key");
    Ok(key)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn dir(name: &str) -> PathBuf {
        let d = std::env::temp_dir().join(format!("gateway-sled-{name}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&d);
        d
    }

    #[test]
    fn a_key_is_made_once_private_and_kept() {
        let d = dir("keep");
        let first = load_or_create(&d, "alpha").unwrap();
        let mode = std::fs::metadata(key_path(&d, "alpha"))
            .unwrap()
            .permissions()
            .mode();
        assert_eq!(mode & 0o777, 0o600);
        assert_eq!(load_or_create(&d, "alpha").unwrap(), first);
        assert_ne!(load_or_create(&d, "beta").unwrap(), first);
        let _ = std::fs::remove_dir_all(&d);
    }

    #[test]
    fn a_readable_or_broken_key_is_refused() {
        let d = dir("refuse");
        load_or_create(&d, "alpha").unwrap();
        let path = key_path(&d, "alpha");
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o644)).unwrap();
        assert!(load_or_create(&d, "alpha")
            .unwrap_err()
            .contains("chmod 600"));
        std::fs::write(&path, "not a key\n").unwrap();
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o600)).unwrap();
        assert!(load_or_create(&d, "alpha")
            .unwrap_err()
            .contains("64 hex digits"));
        let _ = std::fs::remove_dir_all(&d);
    }
}
