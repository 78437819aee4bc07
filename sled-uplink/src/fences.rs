//! Fences: what a sled keeps to refuse a stale write (see `gateway_core::uplink`, "Leases").
//! [`Fences`] is the table, [`FenceFile`] keeps one on disk so that neither a restart of the
//! sled nor the gateway's lets an old fence through.

use std::collections::BTreeMap;
use std::io::Write;
use std::path::{Path, PathBuf};

/// The fences a sled has accepted for its project's leased resources (`"story:beta-1"`): the
/// highest per resource, which a write must not go below, and the highest over all of them
/// (the project's high-water mark, reported in the uplink `hello`). Keep it where the
/// resources it guards live, so it survives what they survive ([`FenceFile`] for a file).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Fences {
    highest: BTreeMap<String, u64>,
    high_water: Option<u64>,
}

impl Fences {
    /// The highest fence accepted for `resource`, if any.
    pub fn highest(&self, resource: &str) -> Option<u64> {
        self.highest.get(resource).copied()
    }

    /// The highest fence accepted for any resource, if any.
    pub fn high_water(&self) -> Option<u64> {
        self.high_water
    }

    /// Each resource with the highest fence accepted for it, in name order.
    pub fn iter(&self) -> impl Iterator<Item = (&str, u64)> {
        self.highest.iter().map(|(r, f)| (r.as_str(), *f))
    }

    /// Admits a write to `resource` under `fence`: refused (`Err` with the highest accepted)
    /// when `fence` is below the highest accepted for it; otherwise recorded (when higher) and
    /// `Ok`. Equal is admitted: one holder writes several times under one fence.
    pub fn admit(&mut self, resource: &str, fence: u64) -> Result<(), u64> {
        match self.highest.get_mut(resource) {
            Some(highest) if fence < *highest => return Err(*highest),
            Some(highest) => *highest = fence,
            None => {
                self.highest.insert(resource.to_owned(), fence);
            }
        }
        self.high_water = self.high_water.max(Some(fence));
        Ok(())
    }
}

/// A [`Fences`] table kept in a file (a JSON map of resources to fences): read once, written
/// (synced, then renamed into place, the directory synced) before each write it admits goes
/// on.
#[derive(Debug, Clone)]
pub struct FenceFile {
    path: PathBuf,
}

impl FenceFile {
    /// The fences of `project` under `state_dir`: `<state_dir>/<project>.fences.json`.
    pub fn in_state_dir(state_dir: &Path, project: &str) -> FenceFile {
        FenceFile {
            path: state_dir.join(format!("{project}.fences.json")),
        }
    }

    /// Where it is kept.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// The fences kept so far (none when there is no file yet). A file that cannot be read,
    /// or holds something else, is an error that says to restore it: a sled that forgot its
    /// fences could take a stale write.
    pub fn load(&self) -> Result<Fences, String> {
        let file = &self.path;
        let mut fences = Fences::default();
        let text = match std::fs::read_to_string(file) {
            Ok(t) => t,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(fences),
            Err(e) => return Err(format!("{}: {e}", file.display())),
        };
        let kept: BTreeMap<String, u64> = serde_json::from_str(&text).map_err(|e| {
            format!(
                "{}: not a map of resources to fences ({e}); a sled that forgot its fences \
                 could take a stale write, so it does not start: restore the file",
                file.display()
            )
        })?;
        for (resource, fence) in kept {
            let _ = fences.admit(&resource, fence);
        }
        Ok(fences)
    }

    /// Keeps `fences`, durably, before it returns.
    pub fn save(&self, fences: &Fences) -> std::io::Result<()> {
        let file = &self.path;
        let map: BTreeMap<&str, u64> = fences.iter().collect();
        let tmp = file.with_extension("json.tmp");
        let mut f = std::fs::File::create(&tmp)?;
        f.write_all(
            serde_json::to_string(&map)
                .expect("a map serialises")
                .as_bytes(),
        )?;
        f.sync_all()?;
        std::fs::rename(&tmp, file)?;
        if let Some(dir) = file.parent() {
            std::fs::File::open(dir)?.sync_all()?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_fence_file_keeps_what_was_admitted_and_refuses_to_forget() {
        let dir = std::env::temp_dir().join(format!("sled-uplink-fences-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        let file = FenceFile::in_state_dir(&dir, "notes");
        let mut fences = file.load().unwrap();
        assert_eq!(fences.high_water(), None);
        fences.admit("note:x", 5).unwrap();
        fences.admit("note:y", 2).unwrap();
        file.save(&fences).unwrap();
        let again = file.load().unwrap();
        assert_eq!(again, fences);
        assert_eq!(again.high_water(), Some(5));
        assert_eq!(again.clone().admit("note:x", 4), Err(5));
        std::fs::write(file.path(), "nonsense").unwrap();
        assert!(file.load().unwrap_err().contains("restore the file"));
        let _ = std::fs::remove_dir_all(&dir);
    }
}
