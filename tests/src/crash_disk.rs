//! A disk that loses power: a redb [`StorageBackend`] wrapped around the real file, which keeps
//! every write that was not synced in memory (the page cache) and writes it to the file only at
//! `sync_data`. [`CrashDisk::power_cut`] drops what was not synced, as a machine that loses
//! power does, and every backend open on the disk fails from then on (the process died with
//! the machine). A store opened again on the disk finds what was synced, nothing else.
//!
//! `kill -9` of a process leaves its page cache to the kernel, which writes it out later: a
//! store that never syncs passes every process test. This disk is how a test tells.

use std::ops::Bound;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};

use redb::backends::FileBackend;
use redb::{BackendError, StorageBackend};

/// One simulated disk holding one file.
#[derive(Debug, Clone)]
pub struct CrashDisk {
    path: PathBuf,
    /// Bumped at each power cut: a backend of an older generation is dead.
    generation: Arc<AtomicU64>,
    syncs: Arc<AtomicU64>,
}

impl CrashDisk {
    /// A disk whose file is `path` (made if missing).
    pub fn new(path: &Path) -> CrashDisk {
        CrashDisk {
            path: path.to_owned(),
            generation: Arc::new(AtomicU64::new(0)),
            syncs: Arc::new(AtomicU64::new(0)),
        }
    }

    /// A backend on the file, as a process opening it after the last power cut.
    pub fn backend(&self) -> std::io::Result<CrashBackend> {
        let file = std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .truncate(false)
            .open(&self.path)?;
        Ok(CrashBackend {
            inner: FileBackend::new(file),
            generation: self.generation.load(Ordering::SeqCst),
            disk_generation: self.generation.clone(),
            syncs: self.syncs.clone(),
            pending: Mutex::new(Pending::default()),
        })
    }

    /// The power goes: every write not synced is lost, and the backends open now fail.
    pub fn power_cut(&self) {
        self.generation.fetch_add(1, Ordering::SeqCst);
    }

    /// How many syncs reached the file.
    pub fn syncs(&self) -> u64 {
        self.syncs.load(Ordering::SeqCst)
    }

    pub fn path(&self) -> &Path {
        &self.path
    }
}

/// What was written since the last sync.
#[derive(Debug, Default)]
struct Pending {
    /// The length set or written to, when it differs from the file's.
    len: Option<u64>,
    /// Bytes of the file at or past this offset read as zero (a shrink since the last sync).
    zero_from: Option<u64>,
    /// The writes, in order.
    writes: Vec<(u64, Vec<u8>)>,
}

/// A backend on a [`CrashDisk`]; see the module docs.
#[derive(Debug)]
pub struct CrashBackend {
    inner: FileBackend,
    generation: u64,
    disk_generation: Arc<AtomicU64>,
    syncs: Arc<AtomicU64>,
    pending: Mutex<Pending>,
}

fn dead() -> BackendError {
    BackendError::Io(std::io::Error::other("the power is off"))
}

impl CrashBackend {
    /// The pending writes, while the power is on.
    fn live(&self) -> Result<MutexGuard<'_, Pending>, BackendError> {
        if self.disk_generation.load(Ordering::SeqCst) != self.generation {
            return Err(dead());
        }
        Ok(self.pending.lock().unwrap_or_else(|e| e.into_inner()))
    }

    fn current_len(&self, p: &Pending) -> Result<u64, BackendError> {
        match p.len {
            Some(len) => Ok(len),
            None => self.inner.len(),
        }
    }
}

impl StorageBackend for CrashBackend {
    fn len(&self) -> Result<u64, BackendError> {
        let p = self.live()?;
        self.current_len(&p)
    }

    fn read(&self, offset: u64, out: &mut [u8]) -> Result<(), BackendError> {
        let p = self.live()?;
        let end = offset + out.len() as u64;
        if end > self.current_len(&p)? {
            return Err(BackendError::Io(std::io::Error::new(
                std::io::ErrorKind::UnexpectedEof,
                "read past the end",
            )));
        }
        // The file's bytes (zero past its end or a pending shrink), then the pending writes.
        out.fill(0);
        let file_len = self.inner.len()?;
        let valid = p.zero_from.map_or(file_len, |z| z.min(file_len));
        if offset < valid {
            let n = (valid - offset).min(out.len() as u64) as usize;
            self.inner.read(offset, &mut out[..n])?;
        }
        for (at, data) in &p.writes {
            let (w0, w1) = (*at, *at + data.len() as u64);
            let (s, e) = (w0.max(offset), w1.min(end));
            if s < e {
                out[(s - offset) as usize..(e - offset) as usize]
                    .copy_from_slice(&data[(s - w0) as usize..(e - w0) as usize]);
            }
        }
        Ok(())
    }

    fn set_len(&self, len: u64) -> Result<(), BackendError> {
        let mut p = self.live()?;
        let old = self.current_len(&p)?;
        if len < old {
            p.zero_from = Some(p.zero_from.map_or(len, |z| z.min(len)));
            for (at, data) in &mut p.writes {
                let keep = len.saturating_sub(*at).min(data.len() as u64) as usize;
                data.truncate(keep);
            }
        }
        p.len = Some(len);
        Ok(())
    }

    fn sync_data(&self) -> Result<(), BackendError> {
        let mut p = self.live()?;
        if let Some(z) = p.zero_from {
            if z < self.inner.len()? {
                self.inner.set_len(z)?;
            }
        }
        if let Some(len) = p.len {
            self.inner.set_len(len)?;
        }
        for (at, data) in &p.writes {
            if !data.is_empty() {
                self.inner.write(*at, data)?;
            }
        }
        self.inner.sync_data()?;
        *p = Pending::default();
        self.syncs.fetch_add(1, Ordering::SeqCst);
        Ok(())
    }

    fn write(&self, offset: u64, data: &[u8]) -> Result<(), BackendError> {
        let mut p = self.live()?;
        let end = offset + data.len() as u64;
        if end > self.current_len(&p)? {
            p.len = Some(end);
        }
        p.writes.push((offset, data.to_vec()));
        Ok(())
    }

    fn close(&self) -> Result<(), BackendError> {
        self.inner.close()
    }

    fn try_lock_range(&self, start: Bound<u64>, end: Bound<u64>) -> Result<bool, BackendError> {
        self.inner.try_lock_range(start, end)
    }

    fn try_lock_shared_range(
        &self,
        start: Bound<u64>,
        end: Bound<u64>,
    ) -> Result<bool, BackendError> {
        self.inner.try_lock_shared_range(start, end)
    }

    fn lock_range(&self, start: Bound<u64>, end: Bound<u64>) -> Result<(), BackendError> {
        self.inner.lock_range(start, end)
    }

    fn lock_shared_range(&self, start: Bound<u64>, end: Bound<u64>) -> Result<(), BackendError> {
        self.inner.lock_shared_range(start, end)
    }

    fn unlock_range(&self, start: Bound<u64>, end: Bound<u64>) -> Result<(), BackendError> {
        self.inner.unlock_range(start, end)
    }

    fn query_lock_range(&self, start: Bound<u64>, end: Bound<u64>) -> Result<bool, BackendError> {
        self.inner.query_lock_range(start, end)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn scratch(name: &str) -> PathBuf {
        let dir = std::env::temp_dir().join(format!("crash-disk-{name}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        dir.join("file")
    }

    #[test]
    fn what_was_synced_survives_a_power_cut_and_nothing_else() {
        let disk = CrashDisk::new(&scratch("sync"));
        let b = disk.backend().unwrap();
        b.set_len(8).unwrap();
        b.write(0, b"abcd").unwrap();
        b.sync_data().unwrap();
        b.write(2, b"XY").unwrap();
        b.write(6, b"zz").unwrap();
        let mut out = [0; 8];
        b.read(0, &mut out).unwrap();
        assert_eq!(&out, b"abXY\0\0zz", "the process reads its own writes");
        disk.power_cut();
        assert!(b.read(0, &mut out).is_err(), "a dead machine reads nothing");
        assert!(b.write(0, b"late").is_err());
        drop(b);
        let b = disk.backend().unwrap();
        b.read(0, &mut out).unwrap();
        assert_eq!(
            &out, b"abcd\0\0\0\0",
            "only the synced bytes are on the disk"
        );
        assert_eq!(disk.syncs(), 1);
    }

    #[test]
    fn a_shrink_then_a_growth_reads_zeros_and_is_kept_only_when_synced() {
        let disk = CrashDisk::new(&scratch("shrink"));
        let b = disk.backend().unwrap();
        b.write(0, b"12345678").unwrap();
        b.sync_data().unwrap();
        b.set_len(4).unwrap();
        b.set_len(8).unwrap();
        let mut out = [0; 8];
        b.read(0, &mut out).unwrap();
        assert_eq!(&out, b"1234\0\0\0\0");
        disk.power_cut();
        let b = disk.backend().unwrap();
        b.read(0, &mut out).unwrap();
        assert_eq!(&out, b"12345678", "the shrink was never synced");
        b.set_len(2).unwrap();
        b.sync_data().unwrap();
        assert_eq!(b.len().unwrap(), 2);
        assert!(b.read(0, &mut out).is_err(), "past the end");
    }
}
