//! Issue 4's steady-state soak: a constant stream of new keys on a short TTL, with small segments and
//! an aggressive compaction policy, sampled every few seconds. It reports whether disk stays within
//! 3× the live data and whether the process's memory stays flat.
//!
//! Every operation is a claim of a new key and its completion with a 200-byte response. The stream is
//! paced at `--rate` operations per second by one caller thread. Samples taken before `--settle` has
//! passed (the store filling up to its steady size) are shown but left out of the verdicts.
//!
//! Disk use peaks while a compaction runs (its output exists beside its inputs) and samples seconds
//! apart can miss that, so a watcher thread also sums the data directory's files every
//! [`PEAK_EVERY`] after `--settle`; the disk verdict uses the larger of the two.
//!
//! `cargo run --release -p idemlog-benches --bin soak -- --duration 90s`

use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use idemlog::{ClaimOutcome, CompactionPolicy, Durability, Fingerprint, Options, Store};
use idemlog_benches::{Flags, Rss, SCOPE, ScratchDir, dir_bytes, item, mib, stored_response};

/// How often the peak watcher sums the data directory.
const PEAK_EVERY: Duration = Duration::from_millis(10);

/// A claim + complete slower than this is counted (issue 4: compaction must not block a claim for
/// more than a few milliseconds).
const SLOW: Duration = Duration::from_millis(5);

/// Largest size of the data directory seen after `settle`, summed every [`PEAK_EVERY`].
struct PeakWatcher {
    stop: Arc<AtomicBool>,
    thread: JoinHandle<u64>,
}

impl PeakWatcher {
    fn start(dir: PathBuf, started: Instant, settle: Duration) -> Self {
        let stop = Arc::new(AtomicBool::new(false));
        let thread = std::thread::spawn({
            let stop = Arc::clone(&stop);
            move || {
                let mut peak = 0;
                while !stop.load(Ordering::Relaxed) {
                    if started.elapsed() >= settle {
                        peak = peak.max(dir_bytes(&dir));
                    }
                    std::thread::sleep(PEAK_EVERY);
                }
                peak
            }
        });
        Self { stop, thread }
    }

    fn finish(self) -> u64 {
        self.stop.store(true, Ordering::Relaxed);
        self.thread.join().expect("peak watcher")
    }
}

struct Sample {
    at: Duration,
    ops: u64,
    records: usize,
    index_entries: usize,
    live: u64,
    disk: u64,
    segments: usize,
    compactions: u64,
    rss: Rss,
}

fn main() {
    let mut flags = Flags::parse("Steady-state soak: constant stream of new keys on a short TTL.");
    let duration = flags.duration("duration", "90s", "how long to run");
    let ttl = flags.duration("ttl", "2s", "TTL of every key");
    let rate: u64 = flags.num("rate", "20000", "claims + completions per second");
    let segment_size: u32 = flags.num("segment-size", "1048576", "segment size in bytes");
    let interval = flags.duration("interval", "200ms", "sweep / compaction check interval");
    let default_ratio = CompactionPolicy::default().garbage_ratio.to_string();
    let garbage_ratio: f64 = flags.num(
        "garbage-ratio",
        &default_ratio,
        "compact at this garbage share",
    );
    let min_garbage: u64 = flags.num("min-garbage", "1048576", "... and at least these bytes");
    let every = flags.duration("sample", "5s", "sampling period");
    let settle = flags.duration("settle", "15s", "samples before this are not judged");
    let durability = flags.string("durability", "periodic", "none | periodic | sync");
    let compaction = flags.string(
        "compaction",
        "on",
        "on | off (off: a control run without sweeping or compaction)",
    );
    flags.finish();

    let durability = match durability.as_str() {
        "none" => Durability::None,
        "periodic" => Durability::Periodic(Duration::from_millis(100)),
        "sync" => Durability::Sync,
        other => {
            eprintln!("--durability {other:?}: use none, periodic or sync");
            std::process::exit(2);
        }
    };
    let policy = CompactionPolicy {
        interval,
        garbage_ratio,
        min_garbage_bytes: min_garbage,
    };
    let dir = ScratchDir::new("soak");
    let options = Options::default()
        .durability(durability)
        .segment_size(segment_size)
        .compaction(match compaction.as_str() {
            "on" => Some(policy),
            "off" => None,
            other => {
                eprintln!("--compaction {other:?}: use on or off");
                std::process::exit(2);
            }
        });
    println!(
        "soak: {duration:?} at {rate}/s, TTL {ttl:?}, {durability:?}, segments {segment_size} bytes, compaction {compaction}: {policy:?}"
    );
    let store = Store::open(dir.path(), options).expect("open the store");
    let response = stored_response();

    println!(
        "\n| t (s) | ops | live records | index entries | live | disk | disk/live | segments | compactions | VmRSS | RssAnon |"
    );
    println!("|---|---|---|---|---|---|---|---|---|---|---|");
    let started = Instant::now();
    let watcher = PeakWatcher::start(dir.path().to_path_buf(), started, settle);
    let mut samples: Vec<Sample> = Vec::new();
    let mut next_sample = every;
    let mut ops: u64 = 0;
    let mut longest = Duration::ZERO;
    let mut slow = 0u64;
    while started.elapsed() < duration {
        // Pace: catch up to where `rate` says we should be, in bursts of at most 1 ms worth.
        let due = (started.elapsed().as_secs_f64() * rate as f64) as u64;
        if ops >= due {
            std::thread::sleep(Duration::from_micros(200));
        }
        let burst_end = due.min(ops + rate / 1000 + 1);
        while ops < burst_end {
            let it = item(ops);
            let op_start = Instant::now();
            match store
                .claim(SCOPE, &it.key, &Fingerprint(it.fingerprint), ttl)
                .expect("claim")
            {
                ClaimOutcome::Acquired(token) => {
                    store.complete(&token, &response, &[]).expect("complete")
                }
                other => panic!("op {ops}: unexpected claim outcome {other:?}"),
            }
            let took = op_start.elapsed();
            longest = longest.max(took);
            slow += u64::from(took > SLOW);
            ops += 1;
        }
        if started.elapsed() >= next_sample {
            next_sample += every;
            let s = store.stats();
            let sample = Sample {
                at: started.elapsed(),
                ops,
                records: s.records,
                index_entries: s.index_entries,
                live: s.live_bytes,
                disk: s.disk_bytes,
                segments: s.segments,
                compactions: s.compactions,
                rss: Rss::now().expect("read /proc/self/status"),
            };
            println!(
                "| {:.0} | {} | {} | {} | {} | {} | {:.2} | {} | {} | {} | {} |",
                sample.at.as_secs_f64(),
                sample.ops,
                sample.records,
                sample.index_entries,
                mib(sample.live),
                mib(sample.disk),
                ratio(sample.disk, sample.live),
                sample.segments,
                sample.compactions,
                mib(sample.rss.total),
                mib(sample.rss.anon)
            );
            samples.push(sample);
        }
    }
    let elapsed = started.elapsed();
    let peak_disk = watcher.finish();
    let failures = store.stats().compaction_failures;
    store.close().expect("close");

    println!(
        "\nachieved {:.0} ops/s ({ops} ops in {:.1?}); longest claim + complete {longest:.1?}, {slow} over {SLOW:?}; compaction failures {failures}",
        ops as f64 / elapsed.as_secs_f64(),
        elapsed
    );
    let steady: Vec<&Sample> = samples.iter().filter(|s| s.at >= settle).collect();
    if steady.len() < 2 {
        println!("too few samples after --settle {settle:?} for a verdict");
        return;
    }
    let ratios: Vec<f64> = steady.iter().map(|s| ratio(s.disk, s.live)).collect();
    let sampled_max = ratios.iter().copied().fold(0.0, f64::max);
    let live_min = steady.iter().map(|s| s.live).min().unwrap_or(0);
    let peak_ratio = ratio(peak_disk, live_min);
    let max_ratio = sampled_max.max(peak_ratio);
    let mean_ratio = ratios.iter().sum::<f64>() / ratios.len() as f64;
    let anon_max = steady.iter().map(|s| s.rss.anon).max().unwrap_or(0);
    let anon_min = steady.iter().map(|s| s.rss.anon).min().unwrap_or(0);
    let total_max = steady.iter().map(|s| s.rss.total).max().unwrap_or(0);
    let total_min = steady.iter().map(|s| s.rss.total).min().unwrap_or(0);
    let entries_max = steady.iter().map(|s| s.index_entries).max().unwrap_or(0);
    let entries_min = steady.iter().map(|s| s.index_entries).min().unwrap_or(0);
    println!(
        "steady state (t ≥ {:.0} s, {} samples): disk/live max {sampled_max:.2}, mean {mean_ratio:.2}; disk max {}",
        settle.as_secs_f64(),
        steady.len(),
        mib(steady.iter().map(|s| s.disk).max().unwrap_or(0))
    );
    println!(
        "disk peak (data directory summed every {PEAK_EVERY:?}): {} = {peak_ratio:.2}x the smallest steady live {}",
        mib(peak_disk),
        mib(live_min)
    );
    println!(
        "index entries {entries_min}..{entries_max}; RssAnon {}..{}; VmRSS {}..{} (VmRSS includes mapped segment pages)",
        mib(anon_min),
        mib(anon_max),
        mib(total_min),
        mib(total_max)
    );
    // Flat: the heap at the end is not above where it was at the start of the steady state.
    let third = (steady.len() / 3).max(1);
    let early = steady[..third]
        .iter()
        .map(|s| s.rss.anon)
        .max()
        .unwrap_or(0);
    let late = steady[steady.len() - third..]
        .iter()
        .map(|s| s.rss.anon)
        .max()
        .unwrap_or(0);
    let growth = late as f64 / early as f64 - 1.0;
    println!(
        "RssAnon max of the first third of steady samples {} vs the last third {} ({:+.1}%)",
        mib(early),
        mib(late),
        growth * 100.0
    );
    println!(
        "verdict: disk within 3x live: {}; memory flat (RssAnon of the last third within 10% of the first): {}",
        if max_ratio <= 3.0 { "yes" } else { "NO" },
        if growth <= 0.10 { "yes" } else { "NO" }
    );
}

fn ratio(disk: u64, live: u64) -> f64 {
    if live == 0 {
        0.0
    } else {
        disk as f64 / live as f64
    }
}
