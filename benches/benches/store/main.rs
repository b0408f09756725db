//! Issue 5's store benchmarks, side by side in one run:
//!
//! - `claim_new`: claim of new keys;
//! - `claim_complete`: claim + complete with a 200-byte body;
//!
//!   both for the engine with durability none / periodic (100 ms) / sync and for the SQLite reference
//!   design at synchronous NORMAL / FULL, with 1, 2, 16 and 64 concurrent caller threads;
//! - `replay`: claim of an already completed key, which returns the stored response (the read path),
//!   1 and 2 threads, engine and SQLite;
//! - `claim_new_async`: claim of new keys under durability sync by 1, 64 and 256 tasks on one
//!   runtime thread that await durability ([`Store::durable`]) instead of blocking a thread each;
//! - `open`: `Store::open` (recovery) of a store with 100 k and 1 M live keys.
//!
//! One iteration is one operation (one claim, one claim + complete, one open), so criterion's
//! "thrpt" column is operations per second. The threaded groups use `iter_custom` with flat sampling:
//! each sample is one fixed batch split evenly across N threads that start together, timed by wall
//! clock from the common start to the last thread's finish.
//!
//! Run with `cargo bench -p idemlog-benches`; `cargo run --release -p idemlog-benches --bin report`
//! turns criterion's output into the table of benches/NOTEBOOK.md.

mod sqlite;

use std::hint::black_box;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use criterion::{
    BenchmarkId, Criterion, SamplingMode, Throughput, criterion_group, criterion_main,
};
use idemlog::{
    ClaimOptions, ClaimOutcome, Deferred, Durability, Fingerprint, Options, Store, StoredResponse,
};
use idemlog_benches::{
    BODY_LEN, Item, LOCATION, Pool, SCOPE, ScratchDir, TTL, dir_bytes, item, response_body,
    stored_response,
};

use sqlite::{Claimed, Session, Synchronous};

/// Concurrent callers of the claim groups.
const THREADS: [usize; 4] = [1, 2, 16, 64];
/// Concurrent callers of the replay group.
const REPLAY_THREADS: [usize; 2] = [1, 2];
/// Completed keys the replay group cycles through.
const REPLAY_KEYS: u64 = 100_000;
/// Live keys of the open group.
const OPEN_KEYS: [u64; 2] = [100_000, 1_000_000];
/// The periodic mode's fdatasync interval (the server's default `--sync-interval`).
const PERIODIC: Duration = Duration::from_millis(100);

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Design {
    Engine(Durability),
    Sqlite(Synchronous),
}

impl Design {
    const ALL: [Design; 5] = [
        Design::Engine(Durability::None),
        Design::Engine(Durability::Periodic(PERIODIC)),
        Design::Engine(Durability::Sync),
        Design::Sqlite(Synchronous::Normal),
        Design::Sqlite(Synchronous::Full),
    ];

    fn label(self) -> &'static str {
        match self {
            Design::Engine(Durability::None) => "engine-none",
            Design::Engine(Durability::Periodic(_)) => "engine-periodic",
            Design::Engine(Durability::Sync) => "engine-sync",
            Design::Sqlite(Synchronous::Normal) => "sqlite-normal",
            Design::Sqlite(Synchronous::Full) => "sqlite-full",
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Work {
    Claim,
    ClaimComplete,
    Replay,
}

fn ttl_ms() -> i64 {
    i64::try_from(TTL.as_millis()).expect("TTL fits in i64 ms")
}

/// A benchmark's running state: the caller threads, and the store when it is the engine.
struct Running {
    pool: Pool,
    store: Option<Store>,
    label: String,
    _dir: Option<ScratchDir>,
}

impl Running {
    /// Prints what the engine did (frames per fdatasync shows group commit) and closes the store.
    fn finish(self) {
        let Running {
            pool, store, label, ..
        } = self;
        drop(pool);
        if let Some(store) = store {
            let s = store.stats();
            let per_sync = if s.syncs == 0 {
                "no fdatasync".to_owned()
            } else {
                format!(
                    "{:.1} frames per fdatasync",
                    s.frames_appended as f64 / s.syncs as f64
                )
            };
            eprintln!(
                "  [{label}] frames {} in {} writes, {} fdatasyncs: {per_sync}; {} records, disk {} bytes",
                s.frames_appended, s.writes, s.syncs, s.records, s.disk_bytes
            );
            store.close().expect("close the store");
        }
    }
}

fn engine_op(store: &Store, work: Work, it: &Item, response: &StoredResponse) {
    let outcome = store
        .claim(SCOPE, &it.key, &Fingerprint(it.fingerprint), TTL)
        .expect("engine claim");
    match (work, outcome) {
        (Work::Claim, ClaimOutcome::Acquired(token)) => {
            black_box(token);
        }
        (Work::ClaimComplete, ClaimOutcome::Acquired(token)) => store
            .complete(&token, response, &[])
            .expect("engine complete"),
        (Work::Replay, ClaimOutcome::Completed(stored)) => {
            assert!(
                stored.status == 201 && stored.body.len() == BODY_LEN,
                "replayed a wrong response"
            );
            black_box(stored);
        }
        (work, other) => panic!("engine {work:?}: unexpected claim outcome {other:?}"),
    }
}

fn sqlite_op(session: &mut Session<'_>, work: Work, it: &Item, body: &[u8]) {
    let claimed = session
        .claim(
            std::str::from_utf8(SCOPE).expect("ASCII scope"),
            it.key_str(),
            &it.fingerprint,
            ttl_ms(),
        )
        .expect("SQLite claim");
    match (work, claimed) {
        (Work::Claim, Claimed::Acquired) => {}
        (Work::ClaimComplete, Claimed::Acquired) => {
            let done = session
                .complete(
                    std::str::from_utf8(SCOPE).expect("ASCII scope"),
                    it.key_str(),
                    201,
                    "application/json",
                    LOCATION,
                    body,
                )
                .expect("SQLite complete");
            assert!(done, "SQLite complete found no in-progress row");
        }
        (Work::Replay, Claimed::Completed { status, body_len }) => {
            assert!(
                status == 201 && body_len == BODY_LEN,
                "replayed a wrong response"
            );
        }
        (work, other) => panic!("SQLite {work:?}: unexpected claim result {other:?}"),
    }
}

fn engine_options(durability: Durability) -> Options {
    Options::default().durability(durability)
}

/// Starts `threads` callers of `design` doing `work` in `dir` (which, for replays, already holds the
/// completed keys 0..REPLAY_KEYS).
fn start(design: Design, work: Work, threads: usize, dir: &Path) -> (Pool, Option<Store>) {
    let keygen = move |i: u64| match work {
        Work::Replay => item(i % REPLAY_KEYS),
        Work::Claim | Work::ClaimComplete => item(i),
    };
    match design {
        Design::Engine(durability) => {
            let store = Store::open(dir, engine_options(durability)).expect("open the engine");
            let shared = store.clone();
            let response = stored_response();
            let pool = Pool::spawn(threads, keygen, move |worker| {
                let store = shared.clone();
                let response = response.clone();
                worker.serve(|items| {
                    for it in items {
                        engine_op(&store, work, it, &response);
                    }
                });
            });
            (pool, Some(store))
        }
        Design::Sqlite(synchronous) => {
            let db = sqlite_path(dir);
            if work != Work::Replay {
                sqlite::create(&db).expect("create the SQLite database");
            }
            let body = response_body();
            let pool = Pool::spawn(threads, keygen, move |worker| {
                let conn = sqlite::connect(&db, synchronous).expect("connect to SQLite");
                let mut session = Session::new(&conn).expect("prepare the statements");
                worker.serve(|items| {
                    for it in items {
                        sqlite_op(&mut session, work, it, &body);
                    }
                });
            });
            (pool, None)
        }
    }
}

fn sqlite_path(dir: &Path) -> PathBuf {
    dir.join("idempotency.db")
}

/// Claim + complete of keys `0..n` in an engine store at `dir`, one caller, no fdatasync until close.
fn populate_engine(dir: &Path, n: u64) {
    let store = Store::open(dir, engine_options(Durability::None)).expect("open for populating");
    let response = stored_response();
    for i in 0..n {
        engine_op(&store, Work::ClaimComplete, &item(i), &response);
    }
    let records = store.stats().records as u64;
    assert_eq!(
        records, n,
        "populated store has the wrong number of records"
    );
    store.close().expect("close the populated store");
}

/// The same keys, completed, in a SQLite database at `dir` (batched in transactions: not timed).
fn populate_sqlite(dir: &Path, n: u64) {
    let db = sqlite_path(dir);
    sqlite::create(&db).expect("create the SQLite database");
    let conn = sqlite::connect(&db, Synchronous::Normal).expect("connect to SQLite");
    let body = response_body();
    let mut start = 0;
    while start < n {
        let end = (start + 10_000).min(n);
        conn.execute_batch("BEGIN").expect("begin");
        {
            let mut session = Session::new(&conn).expect("prepare the statements");
            for i in start..end {
                sqlite_op(&mut session, Work::ClaimComplete, &item(i), &body);
            }
        }
        conn.execute_batch("COMMIT").expect("commit");
        start = end;
    }
}

fn throughput_group(c: &mut Criterion, name: &str, work: Work) {
    let mut group = c.benchmark_group(name);
    group
        .sampling_mode(SamplingMode::Flat)
        .throughput(Throughput::Elements(1));
    for design in Design::ALL {
        for threads in THREADS {
            let id = BenchmarkId::new(design.label(), threads);
            let label = format!("{name}/{}/{threads}", design.label());
            let mut running: Option<Running> = None;
            group.bench_function(id, |b| {
                let running = running.get_or_insert_with(|| {
                    let dir = ScratchDir::new(&label);
                    let (pool, store) = start(design, work, threads, dir.path());
                    Running {
                        pool,
                        store,
                        label: label.clone(),
                        _dir: Some(dir),
                    }
                });
                b.iter_custom(|iters| running.pool.run(iters));
            });
            if let Some(running) = running {
                running.finish();
            }
        }
    }
    group.finish();
}

fn claim_new(c: &mut Criterion) {
    throughput_group(c, "claim_new", Work::Claim);
}

fn claim_complete(c: &mut Criterion) {
    throughput_group(c, "claim_complete", Work::ClaimComplete);
}

fn replay(c: &mut Criterion) {
    let mut group = c.benchmark_group("replay");
    group
        .sampling_mode(SamplingMode::Flat)
        .throughput(Throughput::Elements(1));
    let designs = [
        Design::Engine(Durability::None),
        Design::Engine(Durability::Sync),
        Design::Sqlite(Synchronous::Normal),
    ];
    let mut engine_dir: Option<ScratchDir> = None;
    let mut sqlite_dir: Option<ScratchDir> = None;
    for design in designs {
        for threads in REPLAY_THREADS {
            let label = format!("replay/{}/{threads}", design.label());
            let mut running: Option<Running> = None;
            group.bench_function(BenchmarkId::new(design.label(), threads), |b| {
                let running = running.get_or_insert_with(|| {
                    let dir = match design {
                        Design::Engine(_) => engine_dir.get_or_insert_with(|| {
                            let dir = ScratchDir::new("replay-engine");
                            populate_engine(dir.path(), REPLAY_KEYS);
                            dir
                        }),
                        Design::Sqlite(_) => sqlite_dir.get_or_insert_with(|| {
                            let dir = ScratchDir::new("replay-sqlite");
                            populate_sqlite(dir.path(), REPLAY_KEYS);
                            dir
                        }),
                    };
                    let (pool, store) = start(design, Work::Replay, threads, dir.path());
                    Running {
                        pool,
                        store,
                        label: label.clone(),
                        _dir: None,
                    }
                });
                b.iter_custom(|iters| running.pool.run(iters));
            });
            if let Some(running) = running {
                running.finish();
            }
        }
    }
    group.finish();
}

/// Concurrent tasks of the async claim group, all on one runtime thread.
const ASYNC_TASKS: [usize; 3] = [1, 64, 256];

/// `claim_new_async`: new-key claims under durability sync by tasks that await
/// [`Store::durable`] instead of blocking a thread (what the HTTP server does), all on one
/// current-thread runtime; the engine's committer thread does the fdatasyncs. Each sample splits
/// its batch evenly across the tasks and is timed from their common start to the last one's end.
fn claim_new_async(c: &mut Criterion) {
    let mut group = c.benchmark_group("claim_new_async");
    group
        .sampling_mode(SamplingMode::Flat)
        .throughput(Throughput::Elements(1));
    for tasks in ASYNC_TASKS {
        let label = format!("claim_new_async/engine-sync/{tasks}");
        let mut running: Option<(ScratchDir, Store, tokio::runtime::Runtime)> = None;
        let mut next_key = 0u64;
        group.bench_function(BenchmarkId::new("engine-sync", tasks), |b| {
            let (_, store, runtime) = running.get_or_insert_with(|| {
                let dir = ScratchDir::new(&label);
                let store = Store::open(dir.path(), engine_options(Durability::Sync))
                    .expect("open the engine");
                let runtime = tokio::runtime::Builder::new_current_thread()
                    .build()
                    .expect("build the runtime");
                (dir, store, runtime)
            });
            b.iter_custom(|iters| {
                let per_task = iters.div_ceil(tasks as u64);
                let first = next_key;
                next_key += per_task * tasks as u64;
                let started = Instant::now();
                runtime.block_on(async {
                    let handles: Vec<_> = (0..tasks as u64)
                        .map(|t| {
                            let store = store.clone();
                            let keys = first + t * per_task..first + (t + 1) * per_task;
                            tokio::spawn(async move {
                                for i in keys {
                                    claim_and_await(&store, &item(i)).await;
                                }
                            })
                        })
                        .collect();
                    for handle in handles {
                        handle.await.expect("a claiming task panicked");
                    }
                });
                started.elapsed()
            });
        });
        if let Some((_dir, store, _runtime)) = running {
            let s = store.stats();
            eprintln!(
                "  [{label}] frames {} in {} fdatasyncs: {:.1} frames per fdatasync",
                s.frames_appended,
                s.syncs,
                s.frames_appended as f64 / s.syncs.max(1) as f64
            );
            store.close().expect("close the store");
        }
    }
    group.finish();
}

/// One new-key claim, then an await of its durability (no thread blocks).
async fn claim_and_await(store: &Store, it: &Item) {
    let deferred = store
        .claim_deferred(
            SCOPE,
            &it.key,
            &Fingerprint(it.fingerprint),
            TTL,
            &ClaimOptions::default(),
        )
        .expect("engine claim");
    match deferred {
        Deferred::Ready(ClaimOutcome::Acquired(token), pending) => {
            store.durable(pending).await.expect("durable claim");
            black_box(token);
        }
        Deferred::Ready(other, _) => panic!("async claim of a new key: unexpected {other:?}"),
        Deferred::NotVisible(_) => panic!("async claim of a new key found an existing record"),
    }
}

fn open(c: &mut Criterion) {
    let mut group = c.benchmark_group("open");
    group
        .sampling_mode(SamplingMode::Flat)
        .sample_size(10)
        .warm_up_time(Duration::from_millis(100))
        .measurement_time(Duration::from_secs(3));
    for keys in OPEN_KEYS {
        let mut populated: Option<ScratchDir> = None;
        group.bench_function(BenchmarkId::new("engine", keys), |b| {
            let dir = populated.get_or_insert_with(|| {
                let dir = ScratchDir::new(&format!("open-{keys}"));
                let started = Instant::now();
                populate_engine(dir.path(), keys);
                eprintln!(
                    "  [open/engine/{keys}] populated {keys} completed keys ({} on disk) in {:.1?}",
                    idemlog_benches::mib(dir_bytes(dir.path())),
                    started.elapsed()
                );
                dir
            });
            b.iter_custom(|iters| {
                let mut total = Duration::ZERO;
                for _ in 0..iters {
                    let started = Instant::now();
                    let store =
                        Store::open(dir.path(), Options::default()).expect("open the store");
                    total += started.elapsed();
                    let records = store.stats().records as u64;
                    assert_eq!(records, keys, "open lost or invented records");
                    store.close().expect("close the store");
                }
                total
            });
        });
    }
    group.finish();
}

criterion_group! {
    name = benches;
    config = Criterion::default()
        .sample_size(10)
        .warm_up_time(Duration::from_millis(500))
        .measurement_time(Duration::from_secs(2));
    targets = claim_new, claim_new_async, claim_complete, replay, open
}
criterion_main!(benches);
