//! Shared fixtures: a store on the in-memory fault-injecting file system with a manual clock.
#![allow(dead_code)]

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use idemlog::testkit::FaultyStorage;
use idemlog::{
    ClaimOutcome, ClaimToken, Durability, Fingerprint, ManualClock, Options, Store, StoredResponse,
};

pub const TTL: Duration = Duration::from_secs(3600);
pub const LEASE: Duration = Duration::from_secs(30);

pub struct Fixture {
    pub fs: FaultyStorage,
    pub clock: ManualClock,
    pub dir: PathBuf,
}

impl Fixture {
    pub fn new() -> Self {
        Self {
            fs: FaultyStorage::new(),
            clock: ManualClock::new(1_700_000_000_000),
            dir: PathBuf::from("/data"),
        }
    }

    pub fn options(&self) -> Options {
        Options::default()
            .storage(Arc::new(self.fs.clone()))
            .clock(Arc::new(self.clock.clone()))
            .lease(LEASE)
            .durability(Durability::Sync)
            .compaction(None)
    }

    pub fn open(&self) -> Store {
        Store::open(&self.dir, self.options()).expect("open")
    }

    pub fn segment_path(&self, id: u32) -> PathBuf {
        self.dir.join(format!("{id:020}.seg"))
    }
}

pub fn fp(n: u8) -> Fingerprint {
    Fingerprint([n; 32])
}

pub fn acquire(store: &Store, scope: &str, key: &str, fingerprint: Fingerprint) -> ClaimToken {
    match store
        .claim(scope.as_bytes(), key.as_bytes(), &fingerprint, TTL)
        .expect("claim")
    {
        ClaimOutcome::Acquired(token) => token,
        other => panic!("expected to acquire {scope}/{key}, got {other:?}"),
    }
}

pub fn created(body: &str) -> StoredResponse {
    StoredResponse::new(201, body.to_owned())
        .with_header("Content-Type", "application/json")
        .with_header("Location", "/payments/1")
}

/// A directory on the real file system, removed when dropped.
pub struct TempDir(pub PathBuf);

impl TempDir {
    pub fn new(name: &str) -> Self {
        use std::sync::atomic::{AtomicU32, Ordering};
        static N: AtomicU32 = AtomicU32::new(0);
        let path = std::env::temp_dir().join(format!(
            "idemlog-test-{name}-{}-{}",
            std::process::id(),
            N.fetch_add(1, Ordering::Relaxed)
        ));
        let _ = std::fs::remove_dir_all(&path);
        Self(path)
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// Builds a frame with valid checksums by hand (header layout from FORMAT.md), for tests that need
/// bytes the engine itself would never write.
pub fn raw_frame(tag: u8, sync_mark: u64, payload: &[u8]) -> Vec<u8> {
    let mut header = Vec::with_capacity(24);
    header.extend_from_slice(&(payload.len() as u32).to_le_bytes());
    header.extend_from_slice(&crc32fast::hash(payload).to_le_bytes());
    header.extend_from_slice(&sync_mark.to_le_bytes());
    header.push(tag);
    header.extend_from_slice(&[0; 3]);
    let crc = crc32fast::hash(&header);
    header.extend_from_slice(&crc.to_le_bytes());
    header.extend_from_slice(payload);
    header
}
