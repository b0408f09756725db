//! Cost of one `/metrics` scrape's store figures with many live keys: the engine calls the embedded
//! backend made per scrape before issue 14 (`stats()`, a walk of the index) and since
//! (`metrics()`, running counts), each timed over `--scrapes` calls after `--keys` keys were
//! claimed and completed (durability none, no background compaction, one caller thread).
//!
//! `cargo run --release -p idemlog-benches --bin scrape -- --keys 1000000`

use std::time::{Duration, Instant};

use idemlog::{ClaimOutcome, Durability, Fingerprint, Options, Store};
use idemlog_benches::{Flags, SCOPE, ScratchDir, TTL, item, stored_response};

fn time(scrapes: u32, mut f: impl FnMut()) -> (Duration, Duration) {
    let mut all = Vec::with_capacity(scrapes as usize);
    for _ in 0..scrapes {
        let started = Instant::now();
        f();
        all.push(started.elapsed());
    }
    all.sort_unstable();
    (all[all.len() / 2], all[all.len() - 1])
}

fn main() {
    let mut flags = Flags::parse("Time of the store figures one /metrics scrape reads.");
    let keys: u64 = flags.num("keys", "1000000", "live keys to write");
    let scrapes: u32 = flags.num("scrapes", "20", "scrapes to time");
    flags.finish();

    let dir = ScratchDir::new("scrape");
    let options = Options::default()
        .durability(Durability::None)
        .compaction(None);
    let store = Store::open(dir.path(), options).expect("open the store");
    let response = stored_response();
    for i in 0..keys {
        let it = item(i);
        match store
            .claim(SCOPE, &it.key, &Fingerprint(it.fingerprint), TTL)
            .expect("claim")
        {
            ClaimOutcome::Acquired(token) => {
                store.complete(&token, &response, &[]).expect("complete")
            }
            other => panic!("key {i}: unexpected claim outcome {other:?}"),
        }
    }
    store.sync().expect("sync");

    let (median, max) = time(scrapes, || {
        std::hint::black_box(store.stats());
    });
    println!(
        "keys {keys}; Store::stats() (full walk): median {median:?}, max {max:?} over {scrapes}"
    );
    // Before issue 14 the embedded backend called `stats()` (a walk of the whole index) per
    // scrape; since, it calls `metrics()` (running counts).
    let (median, max) = time(scrapes, || {
        std::hint::black_box(store.metrics());
    });
    println!(
        "keys {keys}; Store::metrics() (running counts): median {median:?}, max {max:?} over {scrapes}"
    );
    let (walk, counts) = (store.stats(), store.metrics());
    assert_eq!(walk.records as u64, counts.records, "same figures");
    assert_eq!(walk.live_bytes, counts.live_bytes, "same figures");
    store.close().expect("close");
}
