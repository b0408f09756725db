//! Index memory per live key, measured two ways in this process of its own:
//!
//! 1. a counting global allocator: the bytes of heap allocations live after the keys were written,
//!    minus those live before (requested sizes, so the allocator's own rounding is not included);
//! 2. the growth of `RssAnon` (resident anonymous memory) over the same span, which does include the
//!    allocator's rounding and headers and any page it touched.
//!
//! The keys are claimed and completed with a 200-byte response, one caller thread, durability none
//! and no background compaction, then the log is synced so that no write buffer is pending. Keys are
//! generated on the stack, so nothing but the store allocates between the two readings.
//!
//! `cargo run --release -p idemlog-benches --bin keymem -- --keys 1000000`

use std::alloc::{GlobalAlloc, Layout, System};
use std::sync::atomic::{AtomicI64, AtomicU64, Ordering};

use idemlog::{ClaimOptions, ClaimOutcome, Durability, Fingerprint, Options, RequestDigest, Store};
use idemlog_benches::{Flags, KEY_LEN, Rss, SCOPE, ScratchDir, TTL, item, stored_response};

struct Counting;

static LIVE: AtomicI64 = AtomicI64::new(0);
static ALLOCATIONS: AtomicU64 = AtomicU64::new(0);

// SAFETY: every call is forwarded to `System` unchanged; the counters are only bookkeeping.
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        // SAFETY: forwarded with the caller's layout.
        let ptr = unsafe { System.alloc(layout) };
        if !ptr.is_null() {
            LIVE.fetch_add(layout.size() as i64, Ordering::Relaxed);
            ALLOCATIONS.fetch_add(1, Ordering::Relaxed);
        }
        ptr
    }

    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        // SAFETY: forwarded with the caller's pointer and layout.
        unsafe { System.dealloc(ptr, layout) };
        LIVE.fetch_sub(layout.size() as i64, Ordering::Relaxed);
    }

    unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
        // SAFETY: forwarded with the caller's layout.
        let ptr = unsafe { System.alloc_zeroed(layout) };
        if !ptr.is_null() {
            LIVE.fetch_add(layout.size() as i64, Ordering::Relaxed);
            ALLOCATIONS.fetch_add(1, Ordering::Relaxed);
        }
        ptr
    }

    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        // SAFETY: forwarded with the caller's pointer, layout and size.
        let new = unsafe { System.realloc(ptr, layout, new_size) };
        if !new.is_null() {
            LIVE.fetch_add(new_size as i64 - layout.size() as i64, Ordering::Relaxed);
        }
        new
    }
}

#[global_allocator]
static GLOBAL: Counting = Counting;

fn main() {
    let mut flags =
        Flags::parse("Index memory per live key (counting allocator and RssAnon delta).");
    let keys: u64 = flags.num("keys", "1000000", "live keys to write");
    let digest_len: u64 = flags.num(
        "digest",
        "0",
        "bytes of request digest stored per key (the server's for a two-member JSON body: 80)",
    );
    let quota: u64 = flags.num(
        "quota",
        "0",
        "per-scope live-key quota to claim under (0: none; the count is kept either way)",
    );
    flags.finish();
    let digest = vec![0x5au8; digest_len as usize];
    let claim_options = ClaimOptions {
        request_digest: RequestDigest::Given(&digest),
        max_live_per_scope: (quota > 0).then_some(quota),
    };

    let dir = ScratchDir::new("keymem");
    let options = Options::default()
        .durability(Durability::None)
        .compaction(None);
    let store = Store::open(dir.path(), options).expect("open the store");
    let response = stored_response();
    // Warm the paths that allocate once (first segment, write buffer, first chunk of every shard).
    store.sync().expect("sync");

    let heap_before = LIVE.load(Ordering::Relaxed);
    let allocations_before = ALLOCATIONS.load(Ordering::Relaxed);
    let rss_before = Rss::now().expect("read /proc/self/status");
    for i in 0..keys {
        let it = item(i);
        match store
            .claim_with(
                SCOPE,
                &it.key,
                &Fingerprint(it.fingerprint),
                TTL,
                &claim_options,
            )
            .expect("claim")
        {
            ClaimOutcome::Acquired(token) => {
                store.complete(&token, &response, &[]).expect("complete")
            }
            other => panic!("key {i}: unexpected claim outcome {other:?}"),
        }
    }
    store.sync().expect("sync");
    let heap_after = LIVE.load(Ordering::Relaxed);
    let allocations_after = ALLOCATIONS.load(Ordering::Relaxed);
    let rss_after = Rss::now().expect("read /proc/self/status");
    let stats = store.stats();
    assert_eq!(stats.records as u64, keys, "every key is live");

    let id_len = 1 + SCOPE.len() + KEY_LEN;
    let per_key = |bytes: i64| bytes as f64 / keys as f64;
    let heap = heap_after - heap_before;
    let anon = rss_after.anon as i64 - rss_before.anon as i64;
    println!(
        "keys written              {keys} (claim + complete, 200-byte body, {digest_len}-byte request digest, quota {quota})"
    );
    println!(
        "key / scope / index id    {KEY_LEN} / {} / {id_len} bytes",
        SCOPE.len()
    );
    println!("index entries             {}", stats.index_entries);
    println!(
        "heap (counting allocator) {heap} bytes = {:.1} bytes per key ({:.1} beyond the {KEY_LEN} key bytes)",
        per_key(heap),
        per_key(heap) - KEY_LEN as f64
    );
    println!(
        "allocation calls          {} ({:.2} per key, including short-lived ones)",
        allocations_after - allocations_before,
        (allocations_after - allocations_before) as f64 / keys as f64
    );
    println!(
        "RssAnon delta             {anon} bytes = {:.1} bytes per key ({:.1} beyond the {KEY_LEN} key bytes)",
        per_key(anon),
        per_key(anon) - KEY_LEN as f64
    );
    println!(
        "VmRSS before / after      {} / {}",
        idemlog_benches::mib(rss_before.total),
        idemlog_benches::mib(rss_after.total)
    );
    println!(
        "disk                      {} = {:.1} bytes per key",
        idemlog_benches::mib(stats.disk_bytes),
        stats.disk_bytes as f64 / keys as f64
    );
    store.close().expect("close");
}
