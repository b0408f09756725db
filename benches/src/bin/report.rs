//! Builds the tables of benches/NOTEBOOK.md from criterion's output of `cargo bench -p idemlog-benches`:
//! medians (operations per second, with the median absolute deviation), the engine / SQLite ratios,
//! the group-commit scaling of durability sync, open times, and issue 5's targets met or missed.
//!
//! `cargo run --release -p idemlog-benches --bin report -- --criterion $CARGO_TARGET_DIR/criterion`

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use idemlog_benches::{Flags, si};
use serde_json::Value;

/// One benchmark's median time per iteration and its median absolute deviation, in nanoseconds.
#[derive(Debug, Clone, Copy)]
struct Estimate {
    median_ns: f64,
    mad_ns: f64,
}

impl Estimate {
    fn rate(self) -> f64 {
        1e9 / self.median_ns
    }

    fn cell(self) -> String {
        format!(
            "{}/s ±{:.0}%",
            si(self.rate()),
            self.mad_ns / self.median_ns * 100.0
        )
    }
}

type Results = BTreeMap<(String, String, String), Estimate>;

fn read_json(path: &Path) -> Option<Value> {
    serde_json::from_str(&std::fs::read_to_string(path).ok()?).ok()
}

fn collect(dir: &Path, results: &mut Results) {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return;
    };
    for entry in entries.filter_map(Result::ok) {
        let path = entry.path();
        if !path.is_dir() {
            continue;
        }
        if path.file_name().is_some_and(|n| n == "new") {
            let (Some(meta), Some(est)) = (
                read_json(&path.join("benchmark.json")),
                read_json(&path.join("estimates.json")),
            ) else {
                continue;
            };
            let text = |v: &Value| v.as_str().unwrap_or_default().to_owned();
            let key = (
                text(&meta["group_id"]),
                text(&meta["function_id"]),
                text(&meta["value_str"]),
            );
            let (Some(median_ns), Some(mad_ns)) = (
                est["median"]["point_estimate"].as_f64(),
                est["median_abs_dev"]["point_estimate"].as_f64(),
            ) else {
                continue;
            };
            results.insert(key, Estimate { median_ns, mad_ns });
        } else {
            collect(&path, results);
        }
    }
}

struct Report {
    results: Results,
    verdicts: Vec<String>,
}

impl Report {
    fn get(&self, group: &str, function: &str, value: &str) -> Option<Estimate> {
        self.results
            .get(&(group.to_owned(), function.to_owned(), value.to_owned()))
            .copied()
    }

    fn rate(&self, group: &str, function: &str, value: &str) -> Option<f64> {
        self.get(group, function, value).map(Estimate::rate)
    }

    fn verdict(&mut self, what: &str, measured: Option<f64>, target: f64, unit: &str) {
        let line = match measured {
            Some(m) if m >= target => format!(
                "- met: {what}: {} {unit} (target ≥ {} {unit})",
                fmt(m),
                fmt(target)
            ),
            Some(m) => format!(
                "- **MISSED**: {what}: {} {unit} (target ≥ {} {unit})",
                fmt(m),
                fmt(target)
            ),
            None => format!("- not measured: {what}"),
        };
        self.verdicts.push(line);
    }

    fn throughput_table(&self, group: &str) {
        let designs = [
            "engine-none",
            "engine-periodic",
            "engine-sync",
            "sqlite-normal",
            "sqlite-full",
        ];
        println!("### {group} (median operations per second ± median absolute deviation)\n");
        println!(
            "| callers | {} | none ÷ sqlite-normal | periodic ÷ sqlite-normal | sync ÷ sqlite-full |",
            designs.join(" | ")
        );
        println!("|---|{}---|---|---|", "---|".repeat(designs.len()));
        for threads in ["1", "2", "16", "64"] {
            let cells: Vec<String> = designs
                .iter()
                .map(|d| {
                    self.get(group, d, threads)
                        .map_or("–".into(), Estimate::cell)
                })
                .collect();
            let ratio = |a: &str, b: &str| match (
                self.rate(group, a, threads),
                self.rate(group, b, threads),
            ) {
                (Some(a), Some(b)) => format!("{:.1}×", a / b),
                _ => "–".into(),
            };
            println!(
                "| {threads} | {} | {} | {} | {} |",
                cells.join(" | "),
                ratio("engine-none", "sqlite-normal"),
                ratio("engine-periodic", "sqlite-normal"),
                ratio("engine-sync", "sqlite-full")
            );
        }
        println!();
        print!("Group commit, engine-sync N callers ÷ 1 caller:");
        for threads in ["2", "16", "64"] {
            match (
                self.rate(group, "engine-sync", threads),
                self.rate(group, "engine-sync", "1"),
            ) {
                (Some(n), Some(one)) => print!(" {threads}: {:.1}×;", n / one),
                _ => print!(" {threads}: –;"),
            }
        }
        println!(" (SQLite FULL N ÷ 1:{})\n", {
            let mut s = String::new();
            for threads in ["2", "16", "64"] {
                if let (Some(n), Some(one)) = (
                    self.rate(group, "sqlite-full", threads),
                    self.rate(group, "sqlite-full", "1"),
                ) {
                    s.push_str(&format!(" {threads}: {:.2}×;", n / one));
                }
            }
            s
        });
    }
}

fn fmt(v: f64) -> String {
    if v >= 1e3 { si(v) } else { format!("{v:.2}") }
}

fn main() {
    let mut flags = Flags::parse("Tables for benches/NOTEBOOK.md from criterion's output.");
    let default_dir = std::env::var("CARGO_TARGET_DIR")
        .map(|t| PathBuf::from(t).join("criterion"))
        .unwrap_or_else(|_| PathBuf::from("target/criterion"));
    let dir = PathBuf::from(flags.string(
        "criterion",
        &default_dir.display().to_string(),
        "criterion's output directory",
    ));
    flags.finish();
    let mut results = Results::new();
    collect(&dir, &mut results);
    if results.is_empty() {
        eprintln!("no criterion results under {}", dir.display());
        std::process::exit(1);
    }
    let mut report = Report {
        results,
        verdicts: Vec::new(),
    };

    report.throughput_table("claim_new");
    report.throughput_table("claim_complete");

    println!("### replay (claim of a completed key; median operations per second)\n");
    println!("| callers | engine-none | engine-sync | sqlite-normal | engine-sync ÷ sqlite |");
    println!("|---|---|---|---|---|");
    for threads in ["1", "2"] {
        let cell = |d: &str| {
            report
                .get("replay", d, threads)
                .map_or("–".into(), Estimate::cell)
        };
        let ratio = match (
            report.rate("replay", "engine-sync", threads),
            report.rate("replay", "sqlite-normal", threads),
        ) {
            (Some(a), Some(b)) => format!("{:.1}×", a / b),
            _ => "–".into(),
        };
        println!(
            "| {threads} | {} | {} | {} | {ratio} |",
            cell("engine-none"),
            cell("engine-sync"),
            cell("sqlite-normal")
        );
    }
    println!();

    println!("### open (recovery) time\n");
    println!("| live keys | median | ± MAD | per 1 M keys |");
    println!("|---|---|---|---|");
    let mut open_per_million = None;
    for keys in ["100000", "1000000"] {
        if let Some(e) = report.get("open", "engine", keys) {
            let n: f64 = keys.parse().unwrap_or(1.0);
            let per_million = e.median_ns / 1e9 * 1e6 / n;
            if keys == "1000000" {
                open_per_million = Some(per_million);
            }
            println!(
                "| {keys} | {:.1} ms | {:.1} ms | {:.2} s |",
                e.median_ns / 1e6,
                e.mad_ns / 1e6,
                per_million
            );
        }
    }
    println!();

    let r = |g: &str, d: &str, t: &str| report.rate(g, d, t);
    let div = |a: Option<f64>, b: Option<f64>| a.zip(b).map(|(a, b)| a / b);
    let none1 = r("claim_new", "engine-none", "1");
    let none_vs_normal = div(none1, r("claim_new", "sqlite-normal", "1"));
    let sync64 = r("claim_new", "engine-sync", "64");
    let sync64_vs_full = div(sync64, r("claim_new", "sqlite-full", "64"));
    let sync64_vs_sync1 = div(sync64, r("claim_new", "engine-sync", "1"));
    let replay1 = r("replay", "engine-sync", "1");
    let replay2 = r("replay", "engine-sync", "2");
    report.verdict("claim_new engine-none, 1 caller", none1, 1e6, "claims/s");
    report.verdict(
        "claim_new engine-none ÷ sqlite-normal, 1 caller",
        none_vs_normal,
        40.0,
        "×",
    );
    report.verdict("claim_new engine-sync, 64 callers", sync64, 1e5, "claims/s");
    report.verdict(
        "claim_new engine-sync ÷ sqlite-full, 64 callers",
        sync64_vs_full,
        20.0,
        "×",
    );
    report.verdict(
        "claim_new engine-sync 64 callers ÷ 1 caller",
        sync64_vs_sync1,
        25.0,
        "×",
    );
    report.verdict("replay engine-sync, 1 caller", replay1, 2e6, "lookups/s");
    report.verdict("replay engine-sync, 2 callers", replay2, 2e6, "lookups/s");
    match open_per_million {
        Some(s) if s <= 1.0 => report.verdicts.push(format!(
            "- met: open of 1 M live keys: {s:.2} s (target ≤ 1 s)"
        )),
        Some(s) => report.verdicts.push(format!(
            "- **MISSED**: open of 1 M live keys: {s:.2} s (target ≤ 1 s)"
        )),
        None => report
            .verdicts
            .push("- not measured: open of 1 M live keys".into()),
    }
    println!("### Targets (store benchmarks)\n");
    for line in &report.verdicts {
        println!("{line}");
    }
}
