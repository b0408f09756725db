//! Shared pieces of the idemlog benchmarks: request keys, a pool of caller threads timed as one
//! batch, scratch directories, process memory, and a small flag parser for the binaries; [`http`]
//! has what the HTTP load generators share (server start and stop, requests, the connection loop).
//!
//! The criterion benchmarks are in `benches/store/`; the binaries in `src/bin/` are the HTTP load
//! generators (`loadgen`: layer on vs off; `durable_http`: durability sync vs none, closed and open
//! loop, fdatasyncs per request), the steady-state soak (`soak`), index memory per key (`keymem`)
//! and the table builder (`report`). `benches/NOTEBOOK.md` has the commands and
//! results.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::mpsc::{self, Receiver, Sender};
use std::sync::{Arc, Condvar, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use idemlog::StoredResponse;

pub mod http;

/// Length of an idempotency key in these benchmarks: a UUID in its text form.
pub const KEY_LEN: usize = 36;

/// The scope (account) every benchmark claims in.
pub const SCOPE: &[u8] = b"acct_bench";

/// Time to live of benchmark keys: long enough that none expires during a run.
pub const TTL: Duration = Duration::from_secs(24 * 3600);

/// Size of the stored response body in the claim + complete and replay benchmarks.
pub const BODY_LEN: usize = 200;

/// A key and the fingerprint of "its" request.
#[derive(Clone, Copy)]
pub struct Item {
    /// UUID-shaped key, lower-case hex.
    pub key: [u8; KEY_LEN],
    /// 32 bytes standing in for the SHA-256 of the request.
    pub fingerprint: [u8; 32],
}

impl Item {
    /// The key as text (it is ASCII hex and dashes).
    pub fn key_str(&self) -> &str {
        std::str::from_utf8(&self.key).expect("keys are ASCII")
    }
}

/// SplitMix64: a bijection on `u64`, so distinct inputs give distinct outputs.
pub fn splitmix64(x: u64) -> u64 {
    let mut z = x.wrapping_add(0x9e37_79b9_7f4a_7c15);
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^ (z >> 31)
}

/// The `i`-th key: random-looking, UUID-shaped (8-4-4-4-12 hex digits), and distinct for distinct `i`
/// (the first 16 digits are a bijection of `i`).
pub fn item(i: u64) -> Item {
    const HEX: &[u8; 16] = b"0123456789abcdef";
    let hi = splitmix64(i);
    let lo = splitmix64(i ^ 0x5555_5555_5555_5555);
    let bits = (u128::from(hi) << 64) | u128::from(lo);
    let mut key = [b'-'; KEY_LEN];
    let mut digit = 0;
    for (pos, slot) in key.iter_mut().enumerate() {
        if matches!(pos, 8 | 13 | 18 | 23) {
            continue;
        }
        *slot = HEX[((bits >> (124 - 4 * digit)) & 0xf) as usize];
        digit += 1;
    }
    let mut fingerprint = [0u8; 32];
    for (n, chunk) in fingerprint.chunks_mut(8).enumerate() {
        chunk.copy_from_slice(&splitmix64(hi ^ n as u64).to_le_bytes());
    }
    Item { key, fingerprint }
}

/// The response stored by the claim + complete benchmarks: 201, `Content-Type`, `Location`, and a
/// body of [`BODY_LEN`] bytes.
pub fn stored_response() -> StoredResponse {
    StoredResponse::new(201, response_body())
        .with_header("Content-Type", "application/json")
        .with_header("Location", LOCATION)
}

/// `Location` of the stored response.
pub const LOCATION: &str = "/payments/pay_09e311744afe7372032f6819";

/// A JSON body of exactly [`BODY_LEN`] bytes.
pub fn response_body() -> Vec<u8> {
    let mut body = br#"{"id":"pay_09e311744afe7372032f6819","amount":100.00,"currency":"BRL","status":"succeeded","charge_id":"ch_0a063dd302ee4ce977ff8c6d","note":""#.to_vec();
    body.resize(BODY_LEN - 2, b'x');
    body.extend_from_slice(b"\"}");
    body
}

/// Milliseconds since the Unix epoch.
pub fn now_ms() -> i64 {
    let since = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .expect("the clock is after 1970");
    i64::try_from(since.as_millis()).expect("milliseconds fit in i64")
}

type KeyGen = Arc<dyn Fn(u64) -> Item + Send + Sync>;

/// Opens the start gate of every worker at once.
struct Gate {
    /// The generation of the batch that may run; `u64::MAX` once the pool is being dropped.
    open: Mutex<u64>,
    changed: Condvar,
}

impl Gate {
    fn wait(&self, generation: u64) -> bool {
        let mut open = self.open.lock().expect("gate lock");
        while *open < generation {
            open = self.changed.wait(open).expect("gate lock");
        }
        *open != u64::MAX
    }

    fn set(&self, generation: u64) {
        *self.open.lock().expect("gate lock") = generation;
        self.changed.notify_all();
    }
}

struct Job {
    first: u64,
    count: u64,
    generation: u64,
}

/// One caller thread's end of a [`Pool`].
pub struct Worker {
    index: usize,
    jobs: Receiver<Job>,
    ready: Sender<()>,
    done: Sender<()>,
    gate: Arc<Gate>,
    keygen: KeyGen,
}

impl Worker {
    /// This worker's number, from 0.
    pub fn index(&self) -> usize {
        self.index
    }

    /// Runs batches until the pool is dropped. Each batch's items are generated before the start
    /// gate opens, so key generation is not timed; `run` then performs one operation per item.
    pub fn serve(self, mut run: impl FnMut(&[Item])) {
        let mut items = Vec::new();
        while let Ok(job) = self.jobs.recv() {
            items.clear();
            items.extend((job.first..job.first + job.count).map(|i| (self.keygen)(i)));
            if self.ready.send(()).is_err() || !self.gate.wait(job.generation) {
                return;
            }
            run(&items);
            if self.done.send(()).is_err() {
                return;
            }
        }
    }
}

struct WorkerHandle {
    jobs: Sender<Job>,
    ready: Receiver<()>,
    done: Receiver<()>,
}

/// `n` persistent caller threads that run one batch of operations together: the batch is split
/// evenly, every thread prepares its share, and the wall time from the common start to the last
/// thread's finish is what [`Pool::run`] returns.
///
/// Each thread keeps its own state across batches (a store handle, or a SQLite connection with its
/// prepared statements), set up once by the body passed to [`Pool::spawn`].
pub struct Pool {
    workers: Vec<WorkerHandle>,
    threads: Vec<JoinHandle<()>>,
    gate: Arc<Gate>,
    generation: u64,
    next: AtomicU64,
}

impl Pool {
    /// Starts `n` threads. `keygen` maps an item number to the item; `body` runs on each thread,
    /// sets up its state and calls [`Worker::serve`].
    pub fn spawn(
        n: usize,
        keygen: impl Fn(u64) -> Item + Send + Sync + 'static,
        body: impl Fn(Worker) + Send + Sync + 'static,
    ) -> Pool {
        assert!(n > 0, "a pool needs at least one thread");
        let keygen: KeyGen = Arc::new(keygen);
        let body = Arc::new(body);
        let gate = Arc::new(Gate {
            open: Mutex::new(0),
            changed: Condvar::new(),
        });
        let mut workers = Vec::with_capacity(n);
        let mut threads = Vec::with_capacity(n);
        for index in 0..n {
            let (jobs_tx, jobs_rx) = mpsc::channel();
            let (ready_tx, ready_rx) = mpsc::channel();
            let (done_tx, done_rx) = mpsc::channel();
            let worker = Worker {
                index,
                jobs: jobs_rx,
                ready: ready_tx,
                done: done_tx,
                gate: Arc::clone(&gate),
                keygen: Arc::clone(&keygen),
            };
            let body = Arc::clone(&body);
            let thread = std::thread::Builder::new()
                .name(format!("caller-{index}"))
                .spawn(move || body(worker))
                .expect("spawn a caller thread");
            workers.push(WorkerHandle {
                jobs: jobs_tx,
                ready: ready_rx,
                done: done_rx,
            });
            threads.push(thread);
        }
        Pool {
            workers,
            threads,
            gate,
            generation: 0,
            next: AtomicU64::new(0),
        }
    }

    /// Starts numbering items at `first` (e.g. past a pre-populated range).
    pub fn start_at(&self, first: u64) {
        self.next.store(first, Ordering::Relaxed);
    }

    /// Runs `total` operations split across the threads, on the next `total` item numbers, and returns
    /// the wall time of the batch. Panics if a worker died (a failed or unexpected operation).
    pub fn run(&mut self, total: u64) -> Duration {
        self.generation += 1;
        let n = self.workers.len() as u64;
        let mut first = self.next.fetch_add(total, Ordering::Relaxed);
        for (i, worker) in self.workers.iter().enumerate() {
            let count = total / n + u64::from((i as u64) < total % n);
            let job = Job {
                first,
                count,
                generation: self.generation,
            };
            first += count;
            worker
                .jobs
                .send(job)
                .expect("a caller thread died before its batch");
        }
        for worker in &self.workers {
            worker
                .ready
                .recv()
                .expect("a caller thread died preparing its batch");
        }
        let start = Instant::now();
        self.gate.set(self.generation);
        for worker in &self.workers {
            worker
                .done
                .recv()
                .expect("a caller thread died during its batch (see its panic above)");
        }
        start.elapsed()
    }
}

impl Drop for Pool {
    fn drop(&mut self) {
        self.gate.set(u64::MAX);
        self.workers.clear();
        for thread in self.threads.drain(..) {
            // A worker that panicked already printed its message; the batch that saw it panicked too.
            let _ = thread.join();
        }
    }
}

/// A directory for benchmark data under `$IDEMLOG_BENCH_DIR` (default: the system temp dir), removed
/// when dropped.
pub struct ScratchDir {
    path: PathBuf,
}

impl ScratchDir {
    /// A fresh, empty directory whose name starts with `label`.
    pub fn new(label: &str) -> ScratchDir {
        static SEQ: AtomicU64 = AtomicU64::new(0);
        let base = std::env::var_os("IDEMLOG_BENCH_DIR")
            .map(PathBuf::from)
            .unwrap_or_else(std::env::temp_dir);
        let name = format!(
            "idemlog-bench-{}-{}-{}",
            std::process::id(),
            SEQ.fetch_add(1, Ordering::Relaxed),
            label.replace(['/', ' '], "_")
        );
        let path = base.join(name);
        if path.exists() {
            std::fs::remove_dir_all(&path).expect("remove a stale scratch dir");
        }
        std::fs::create_dir_all(&path).expect("create a scratch dir");
        ScratchDir { path }
    }

    /// The directory.
    pub fn path(&self) -> &Path {
        &self.path
    }
}

impl Drop for ScratchDir {
    fn drop(&mut self) {
        if let Err(e) = std::fs::remove_dir_all(&self.path) {
            eprintln!("could not remove {}: {e}", self.path.display());
        }
    }
}

/// Bytes of all files under `dir`.
pub fn dir_bytes(dir: &Path) -> u64 {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return 0;
    };
    entries
        .filter_map(Result::ok)
        .map(|e| match e.metadata() {
            Ok(m) if m.is_dir() => dir_bytes(&e.path()),
            Ok(m) => m.len(),
            Err(_) => 0,
        })
        .sum()
}

/// Resident memory of this process from `/proc/self/status`.
#[derive(Debug, Clone, Copy, Default)]
pub struct Rss {
    /// `VmRSS`: all resident pages, bytes.
    pub total: u64,
    /// `RssAnon`: resident anonymous pages (the heap), bytes.
    pub anon: u64,
    /// `RssFile`: resident file-backed pages (mapped files and the binary), bytes.
    pub file: u64,
}

impl Rss {
    /// Reads the current figures.
    pub fn now() -> std::io::Result<Rss> {
        let status = std::fs::read_to_string("/proc/self/status")?;
        let field = |name: &str| -> u64 {
            status
                .lines()
                .find_map(|l| l.strip_prefix(name))
                .and_then(|rest| {
                    rest.trim()
                        .trim_end_matches("kB")
                        .trim()
                        .parse::<u64>()
                        .ok()
                })
                .map_or(0, |kib| kib * 1024)
        };
        Ok(Rss {
            total: field("VmRSS:"),
            anon: field("RssAnon:"),
            file: field("RssFile:"),
        })
    }
}

/// `--name value` flags of a benchmark binary, with `--help` listing the defaults.
pub struct Flags {
    values: HashMap<String, String>,
    used: Vec<(String, String, String)>,
    program: String,
    about: String,
}

impl Flags {
    /// Parses `std::env::args()`. Exits with a message on a malformed command line.
    pub fn parse(about: &str) -> Flags {
        let mut args = std::env::args();
        let program = args.next().unwrap_or_default();
        let mut values = HashMap::new();
        let mut help = false;
        while let Some(arg) = args.next() {
            if arg == "--help" || arg == "-h" {
                help = true;
                continue;
            }
            let Some(name) = arg.strip_prefix("--") else {
                eprintln!("unexpected argument {arg:?}; flags are --name value");
                std::process::exit(2);
            };
            let (name, value) = match name.split_once('=') {
                Some((n, v)) => (n.to_owned(), v.to_owned()),
                None => match args.next() {
                    Some(v) => (name.to_owned(), v),
                    None => {
                        eprintln!("flag --{name} needs a value");
                        std::process::exit(2);
                    }
                },
            };
            values.insert(name, value);
        }
        if help {
            values.insert("__help".into(), String::new());
        }
        Flags {
            values,
            used: Vec::new(),
            program,
            about: about.to_owned(),
        }
    }

    fn raw(&mut self, name: &str, default: &str, help: &str) -> String {
        self.used
            .push((name.to_owned(), default.to_owned(), help.to_owned()));
        self.values
            .remove(name)
            .unwrap_or_else(|| default.to_owned())
    }

    /// A string flag.
    pub fn string(&mut self, name: &str, default: &str, help: &str) -> String {
        self.raw(name, default, help)
    }

    /// A number flag.
    pub fn num<T: std::str::FromStr>(&mut self, name: &str, default: &str, help: &str) -> T {
        let raw = self.raw(name, default, help);
        raw.parse().unwrap_or_else(|_| {
            eprintln!("--{name} {raw:?} is not a valid number");
            std::process::exit(2);
        })
    }

    /// A duration flag (`250ms`, `2s`, `5m`).
    pub fn duration(&mut self, name: &str, default: &str, help: &str) -> Duration {
        let raw = self.raw(name, default, help);
        parse_duration(&raw).unwrap_or_else(|e| {
            eprintln!("--{name}: {e}");
            std::process::exit(2);
        })
    }

    /// Prints usage and exits if `--help` was given; refuses unknown flags.
    pub fn finish(mut self) {
        if self.values.remove("__help").is_some() {
            println!(
                "{}\n\nusage: {} [--flag value]...\n",
                self.about, self.program
            );
            for (name, default, help) in &self.used {
                println!("  --{name:<18} {help} (default: {default})");
            }
            std::process::exit(0);
        }
        if let Some(name) = self.values.keys().next() {
            eprintln!("unknown flag --{name}; see --help");
            std::process::exit(2);
        }
    }
}

/// Parses `250ms`, `2s`, `5m`.
pub fn parse_duration(text: &str) -> Result<Duration, String> {
    let split = text
        .find(|c: char| !c.is_ascii_digit())
        .ok_or_else(|| format!("duration {text:?} needs a unit: ms, s or m"))?;
    let (number, unit) = text.split_at(split);
    let n: u64 = number
        .parse()
        .map_err(|_| format!("duration {text:?} must start with a whole number"))?;
    match unit {
        "ms" => Ok(Duration::from_millis(n)),
        "s" => Ok(Duration::from_secs(n)),
        "m" => Ok(Duration::from_secs(n * 60)),
        _ => Err(format!("unknown unit in {text:?}: use ms, s or m")),
    }
}

/// `1234567` → `1.23 M`, for rates.
pub fn si(value: f64) -> String {
    if value >= 1e6 {
        format!("{:.2} M", value / 1e6)
    } else if value >= 1e3 {
        format!("{:.1} k", value / 1e3)
    } else {
        format!("{value:.0}")
    }
}

/// Bytes as MiB with one decimal.
pub fn mib(bytes: u64) -> String {
    format!("{:.1} MiB", bytes as f64 / (1024.0 * 1024.0))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keys_are_uuid_shaped_and_distinct() {
        let a = item(0);
        let b = item(1);
        assert_eq!(a.key.len(), 36);
        assert_ne!(a.key, b.key);
        let text = a.key_str();
        for (i, c) in text.char_indices() {
            if matches!(i, 8 | 13 | 18 | 23) {
                assert_eq!(c, '-');
            } else {
                assert!(c.is_ascii_hexdigit(), "{text}");
            }
        }
        let many: std::collections::HashSet<_> = (0..10_000).map(|i| item(i).key).collect();
        assert_eq!(many.len(), 10_000);
    }

    #[test]
    fn body_has_the_stated_length() {
        assert_eq!(response_body().len(), BODY_LEN);
        assert!(serde_json::from_slice::<serde_json::Value>(&response_body()).is_ok());
    }

    #[test]
    fn pool_runs_every_item_once() {
        let seen = Arc::new(Mutex::new(Vec::new()));
        let sink = Arc::clone(&seen);
        let mut pool = Pool::spawn(3, item, move |w| {
            let sink = Arc::clone(&sink);
            w.serve(|items| sink.lock().unwrap().extend(items.iter().map(|i| i.key)));
        });
        pool.run(10);
        pool.run(7);
        drop(pool);
        let mut got = seen.lock().unwrap().clone();
        got.sort();
        let mut want: Vec<_> = (0..17).map(|i| item(i).key).collect();
        want.sort();
        assert_eq!(got, want);
    }

    #[test]
    fn durations_parse() {
        assert_eq!(parse_duration("250ms"), Ok(Duration::from_millis(250)));
        assert_eq!(parse_duration("2s"), Ok(Duration::from_secs(2)));
        assert_eq!(parse_duration("1m"), Ok(Duration::from_secs(60)));
        assert!(parse_duration("2").is_err());
    }
}
