//! `idemlogctl`: operator commands on an idemlog data directory.
//!
//! ```text
//! idemlogctl stats   DIR              live keys, in progress, disk bytes, garbage ratio
//! idemlogctl verify  DIR              walk every frame and checksum; non-zero exit on corruption
//! idemlogctl compact DIR              compact now and report what was reclaimed
//! idemlogctl inspect DIR SCOPE KEY    show one record
//! ```
//!
//! `stats`, `inspect` and `verify` are read-only: they replay the log without changing a byte (no torn
//! tail cut, no leftover deleted, no segment created, no LOCK file created), so they are safe on a
//! copy, on evidence, or on a directory waiting for its server to restart. `compact` opens the store
//! normally. Every command takes the directory lock when the directory has one, so on a directory a
//! running server holds it refuses with a message instead of touching it.
//! Exit codes: 0 success, 1 corruption found, 2 usage or other error.

use std::path::Path;
use std::process::ExitCode;
use std::sync::Arc;

use idemlog::storage::FsStorage;
use idemlog::{Error, Options, ReadOnlyStore, RecordState, Store};

const USAGE: &str = "usage:
  idemlogctl stats   DIR
  idemlogctl verify  DIR
  idemlogctl compact DIR
  idemlogctl inspect DIR SCOPE KEY";

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let refs: Vec<&str> = args.iter().map(String::as_str).collect();
    let result = match refs.as_slice() {
        ["stats", dir] => stats(Path::new(dir)),
        ["verify", dir] => verify(Path::new(dir)),
        ["compact", dir] => compact(Path::new(dir)),
        ["inspect", dir, scope, key] => inspect(Path::new(dir), scope, key),
        ["-h" | "--help" | "help"] => {
            println!("{USAGE}");
            return ExitCode::SUCCESS;
        }
        _ => {
            eprintln!("{USAGE}");
            return ExitCode::from(2);
        }
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            match &e {
                Error::Locked { .. } => eprintln!(
                    "error: {e}\n(stop the server using this directory first, or point at a copy)"
                ),
                _ => eprintln!("error: {e}"),
            }
            ExitCode::from(if matches!(e, Error::Corrupt { .. }) {
                1
            } else {
                2
            })
        }
    }
}

/// Opens an existing store without background threads.
fn open(dir: &Path) -> Result<Store, Error> {
    if !dir.is_dir() {
        return Err(Error::InvalidOptions(format!(
            "{} is not a directory",
            dir.display()
        )));
    }
    Store::open(dir, Options::default().compaction(None))
}

/// A read-only view of an existing store.
fn open_read_only(dir: &Path) -> Result<ReadOnlyStore, Error> {
    if !dir.is_dir() {
        return Err(Error::InvalidOptions(format!(
            "{} is not a directory",
            dir.display()
        )));
    }
    ReadOnlyStore::open(dir, &Options::default())
}

fn stats(dir: &Path) -> Result<(), Error> {
    let store = open_read_only(dir)?;
    let s = store.stats();
    println!("live keys:        {}", s.records);
    println!("in progress:      {}", s.in_progress);
    println!("side records:     {}", s.side_records);
    println!("segments:         {}", s.segments);
    println!("disk bytes:       {}", s.disk_bytes);
    println!("live bytes:       {}", s.live_bytes);
    println!("garbage bytes:    {}", s.garbage_bytes);
    println!("garbage ratio:    {:.3}", s.garbage_ratio());
    if let Some((path, offset)) = store.torn_tail() {
        println!(
            "torn tail:        {} at offset {} (left in place; the next open cuts it)",
            path.display(),
            offset
        );
    }
    for path in store.garbage() {
        println!(
            "leftover:         {} (left in place; the next open deletes it)",
            path.display()
        );
    }
    Ok(())
}

fn verify(dir: &Path) -> Result<(), Error> {
    let report = idemlog::verify(dir, Arc::new(FsStorage))?;
    println!(
        "ok: {} segments, {} frames, {} operations, {} bytes; every checksum matches",
        report.segments, report.frames, report.operations, report.bytes
    );
    if let Some((path, offset)) = &report.torn_tail {
        println!(
            "note: torn tail in {} at offset {} (an interrupted append; the next open cuts it)",
            path.display(),
            offset
        );
    }
    for path in &report.garbage {
        println!(
            "note: {} is left over from an interrupted compaction (the next open deletes it)",
            path.display()
        );
    }
    Ok(())
}

fn compact(dir: &Path) -> Result<(), Error> {
    let store = open(dir)?;
    let before = store.stats().disk_bytes;
    let report = store.compact()?;
    let after = store.stats().disk_bytes;
    println!(
        "compacted {} segments ({} bytes) into {} ({} bytes), {} records copied, in {} ms",
        report.input_segments,
        report.input_bytes,
        report.output_segments,
        report.output_bytes,
        report.records_copied,
        report.micros / 1000
    );
    println!("disk bytes: {before} -> {after}");
    store.close()
}

fn inspect(dir: &Path, scope: &str, key: &str) -> Result<(), Error> {
    let store = open_read_only(dir)?;
    let Some(record) = store.get(scope.as_bytes(), key.as_bytes())? else {
        println!("no live record for scope {scope:?} key {key:?}");
        return Ok(());
    };
    let hex: String = record
        .fingerprint
        .0
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect();
    println!("scope:        {scope}");
    println!("key:          {key}");
    println!("fingerprint:  {hex}");
    println!("fence:        {}", record.fence);
    println!("created at:   {} ms", record.created_at_ms);
    println!("expires at:   {} ms", record.expires_at_ms);
    match record.state {
        RecordState::InProgress { lease_until_ms } => {
            println!("state:        in progress (lease until {lease_until_ms} ms)");
        }
        RecordState::Completed(response) => {
            println!("state:        completed");
            println!("status:       {}", response.status);
            for (name, value) in &response.headers {
                println!("header:       {name}: {}", String::from_utf8_lossy(value));
            }
            println!("body:         {}", String::from_utf8_lossy(&response.body));
        }
    }
    Ok(())
}
