//! HTTP load generator for `POST /payments`: raw HTTP/1.1 over keep-alive TCP connections on a
//! current-thread tokio runtime, against the real `idemlog-server` binary on 127.0.0.1.
//!
//! It starts two servers from the same binary and flags (`--durability none --gateway-latency 0ms`),
//! one with the idempotency layer and one with `--idempotency off`, and runs in alternation, for
//! `--rounds` rounds:
//!
//! - `new keys, layer on`: every request carries a new `Idempotency-Key`;
//! - `new keys, layer off`: the same requests against the server without the layer;
//! - `replays, layer on`: requests cycle through `--replay-keys` keys completed beforehand, so every
//!   answer is a stored response (checked through the `Idempotent-Replayed` header).
//!
//! Each run uses `--connections` connections for `--warmup` (not recorded) plus `--duration`, and
//! stops by itself; it reports requests per second and the p50/p99 latency. The layer's cost is
//! `1 - (req/s on) / (req/s off)` from the medians over the rounds. On two shared cores the rate of
//! one server swings by a third from one run to the next, so the on and off runs swap order every
//! round (on first in odd rounds) and the median of each round's own on ÷ off ratio is reported
//! too: it pairs runs that were close in time. Only 127.0.0.1 is ever contacted.
//!
//! `cargo build --release -p idemlog-server -p idemlog-benches`, then
//! `$CARGO_TARGET_DIR/release/loadgen --connections 64 --duration 10s --rounds 3`

use std::path::PathBuf;
use std::time::Duration;

use idemlog_benches::Flags;
use idemlog_benches::http::{
    Keys, MAX_REQUESTS_PER_RUN, RunSpec, Server, ServerOptions, default_server_bin, median, run,
};

fn main() {
    let mut flags = Flags::parse(
        "HTTP load generator: POST /payments with new keys and replays, idempotency layer on vs off.",
    );
    let default_bin = default_server_bin();
    let bin = PathBuf::from(flags.string("server", &default_bin, "the idemlog-server binary"));
    let connections: usize = flags.num("connections", "64", "concurrent keep-alive connections");
    let duration = flags.duration("duration", "10s", "recorded time of each run");
    let warmup = flags.duration("warmup", "2s", "unrecorded time before each run");
    let rounds: usize = flags.num("rounds", "3", "rounds of (on, off, replay) runs");
    let replay_keys: u64 = flags.num(
        "replay-keys",
        "10000",
        "keys completed before the replay runs",
    );
    let rust_log = flags.string("rust-log", "warn", "RUST_LOG of both servers");
    flags.finish();
    if !bin.exists() {
        eprintln!(
            "{} not found: build it with `cargo build --release -p idemlog-server` or pass --server",
            bin.display()
        );
        std::process::exit(2);
    }

    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("build the runtime");
    let options = |layer| ServerOptions {
        durability: "none",
        layer,
        rust_log: &rust_log,
        database_url: None,
    };
    let on = Server::start(&bin, "on", &options(true));
    let off = Server::start(&bin, "off", &options(false));
    println!(
        "servers: {} (layer on, {}), {} (layer off, {}); --durability none --gateway-latency 0ms, RUST_LOG={rust_log}",
        bin.display(),
        on.addr,
        bin.display(),
        off.addr
    );
    println!(
        "load: {connections} keep-alive connections, one client thread, {warmup:?} warm-up + {duration:?} per run, {rounds} rounds\n"
    );

    // Keys for the replay runs: 0..replay_keys, completed once through the layer.
    let (prefill, _) = run(
        &rt,
        &RunSpec {
            server: &on,
            keys: Keys::Replay(replay_keys),
            first_key: 0,
            connections: connections.min(replay_keys as usize).max(1),
            warmup: Duration::ZERO,
            duration: Duration::from_secs(60),
            limit: replay_keys,
            scrape_metrics: false,
        },
    );
    assert!(
        prefill.requests == replay_keys && prefill.errors == 0,
        "prefill completed only {} requests (errors {}: {:?})",
        prefill.requests,
        prefill.errors,
        prefill.first_error
    );
    let mut next_key = replay_keys;

    println!(
        "| run | round | req/s | p50 | p99 | requests | errors | replayed | server CPU/request | server cores busy |"
    );
    println!("|---|---|---|---|---|---|---|---|---|---|");
    let mut rates: [Vec<f64>; 3] = [Vec::new(), Vec::new(), Vec::new()];
    let mut p50s: [Vec<f64>; 3] = [Vec::new(), Vec::new(), Vec::new()];
    let mut p99s: [Vec<f64>; 3] = [Vec::new(), Vec::new(), Vec::new()];
    let mut cpus: [Vec<f64>; 3] = [Vec::new(), Vec::new(), Vec::new()];
    let names = [
        "new keys, layer on",
        "new keys, layer off",
        "replays, layer on",
    ];
    let mut total_errors = 0;
    for round in 1..=rounds {
        // Odd rounds run on, off, replays; even rounds off, on, replays.
        let order: [usize; 3] = if round % 2 == 1 { [0, 1, 2] } else { [1, 0, 2] };
        for i in order {
            let name = names[i];
            let (server, keys) = match i {
                0 => (&on, Keys::New),
                1 => (&off, Keys::New),
                _ => (&on, Keys::Replay(replay_keys)),
            };
            let start_key = if keys == Keys::New { next_key } else { 0 };
            let (outcome, after) = run(
                &rt,
                &RunSpec {
                    server,
                    keys,
                    first_key: start_key,
                    connections,
                    warmup,
                    duration,
                    limit: MAX_REQUESTS_PER_RUN,
                    scrape_metrics: false,
                },
            );
            if keys == Keys::New {
                next_key = after;
            }
            total_errors += outcome.errors;
            println!(
                "| {name} | {round} | {:.0} | {:.2?} | {:.2?} | {} | {} | {} | {:.0} µs | {:.2} |",
                outcome.rate(),
                outcome.percentile(0.50),
                outcome.percentile(0.99),
                outcome.requests,
                outcome.errors,
                outcome.replays,
                outcome.cpu_per_request_us(),
                outcome.server_cores()
            );
            if let Some(e) = &outcome.first_error {
                eprintln!("  first error of {name}: {e}");
            }
            if i == 2 && outcome.replays != outcome.requests {
                eprintln!(
                    "  warning: {} of {} replay requests were not marked as replays",
                    outcome.requests - outcome.replays,
                    outcome.requests
                );
            }
            rates[i].push(outcome.rate());
            p50s[i].push(outcome.percentile(0.50).as_secs_f64() * 1e3);
            p99s[i].push(outcome.percentile(0.99).as_secs_f64() * 1e3);
            cpus[i].push(outcome.cpu_per_request_us());
        }
    }
    on.stop();
    off.stop();

    println!("\nmedians over {rounds} rounds:\n");
    println!("| run | req/s | p50 (ms) | p99 (ms) | server CPU/request (µs) |");
    println!("|---|---|---|---|---|");
    // Each round's own on / off ratio, before the medians below sort the rates.
    let mut paired: Vec<f64> = rates[0]
        .iter()
        .zip(&rates[1])
        .map(|(on, off)| on / off)
        .collect();
    let mut medians = [0.0; 3];
    let mut cpu_medians = [0.0; 3];
    for (i, name) in names.iter().enumerate() {
        medians[i] = median(&mut rates[i]);
        cpu_medians[i] = median(&mut cpus[i]);
        println!(
            "| {name} | {:.0} | {:.2} | {:.2} | {:.0} |",
            medians[i],
            median(&mut p50s[i]),
            median(&mut p99s[i]),
            cpu_medians[i]
        );
    }
    let cost = 1.0 - medians[0] / medians[1];
    println!(
        "\nlayer on / off (new keys): {:.3}; the layer costs {:.1}% of req/s (target ≤ 15%: {})",
        medians[0] / medians[1],
        cost * 100.0,
        if cost <= 0.15 { "met" } else { "MISSED" }
    );
    let per_round = paired
        .iter()
        .map(|r| format!("{r:.2}"))
        .collect::<Vec<_>>()
        .join(", ");
    let paired_median = median(&mut paired);
    println!(
        "per-round on / off ratios: {per_round}; median {paired_median:.3}, i.e. the layer costs {:.1}%",
        (1.0 - paired_median) * 100.0
    );
    println!(
        "server CPU per request, layer on / off (new keys): {:.2} ({:+.0}%)",
        cpu_medians[0] / cpu_medians[1],
        (cpu_medians[0] / cpu_medians[1] - 1.0) * 100.0
    );
    println!(
        "replays / new keys (layer on): {:.2}",
        medians[2] / medians[0]
    );
    if total_errors > 0 {
        println!("\n{total_errors} requests failed: the figures above exclude them");
        std::process::exit(1);
    }
}
