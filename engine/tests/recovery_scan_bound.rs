//! The search for intact frames after damage has bounded work.
//!
//! Found while writing the recovery fuzz targets (the fuzzer's inputs are too small to show it): a
//! segment whose every 24th byte starts a frame header with a valid header checksum and a payload
//! running to the end of the file with a wrong checksum made recovery checksum every overlapping
//! payload, quadratic in the file size (8 MiB took half a minute; a 1 GiB segment would take days).
//! Such bytes never come from a crash; they are now refused as corruption at once.

use std::path::Path;
use std::sync::Arc;

use idemlog::storage::Storage;
use idemlog::testkit::FaultyStorage;
use idemlog::{Corruption, Error, ManualClock, Options, Store};

const DIR: &str = "/data";

fn segment_header(id: u64) -> Vec<u8> {
    let mut h = b"IDEMLOG\0".to_vec();
    h.extend_from_slice(&1u32.to_le_bytes());
    h.extend_from_slice(&0u32.to_le_bytes());
    h.extend_from_slice(&id.to_le_bytes());
    h.extend_from_slice(&0u32.to_le_bytes());
    let crc = crc32fast::hash(&h);
    h.extend_from_slice(&crc.to_le_bytes());
    h
}

/// `n` back-to-back frame headers whose header checksums hold and whose payloads (the headers after
/// them, to the end of the file) fail their checksum.
fn overlapping_headers(n: usize) -> Vec<u8> {
    let mut data = segment_header(1);
    for i in 0..n {
        let payload_len = u32::try_from(24 * (n - i - 1)).expect("small file");
        let mut h = payload_len.to_le_bytes().to_vec();
        h.extend_from_slice(&0u32.to_le_bytes()); // not the payload's checksum
        h.extend_from_slice(&0u64.to_le_bytes()); // sync mark
        h.extend_from_slice(&[1, 0, 0, 0]); // operations frame, reserved
        let crc = crc32fast::hash(&h);
        h.extend_from_slice(&crc.to_le_bytes());
        data.extend_from_slice(&h);
    }
    data
}

#[test]
fn overlapping_checksummed_headers_are_refused_as_corruption_not_scanned_quadratically() {
    let fs = FaultyStorage::new();
    fs.create_dir_all(Path::new(DIR))
        .expect("in-memory directory");
    let segment = overlapping_headers((1 << 20) / 24);
    fs.write_file(&Path::new(DIR).join("00000000000000000001.seg"), &segment);
    let options = Options::default()
        .storage(Arc::new(fs.clone()))
        .clock(Arc::new(ManualClock::new(1_000)))
        .compaction(None);

    let verified = idemlog::verify(DIR, Arc::new(fs.clone()));
    assert!(
        matches!(
            &verified,
            Err(Error::Corrupt {
                offset: 32,
                reason: Corruption::DamagedDurableData,
                ..
            })
        ),
        "verify: {verified:?}"
    );
    match Store::open(DIR, options) {
        Err(Error::Corrupt {
            offset: 32,
            reason: Corruption::DamagedDurableData,
            ..
        }) => {}
        Err(e) => panic!("open failed with {e}"),
        Ok(store) => panic!(
            "open cut the file as a torn tail: {:?}",
            store.recovery_report()
        ),
    }
    assert_eq!(
        fs.read_file(&Path::new(DIR).join("00000000000000000001.seg")),
        Some(segment),
        "nothing is cut"
    );
}
