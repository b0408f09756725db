//! The server on PostgreSQL killed (SIGKILL) under load, again and again, until a kill has landed
//! between a batch's commit and the responses it answers: a key whose completion the database
//! committed while its client never got the answer.
//!
//! Completions are batched (`backends/postgres/batch`): one statement commits many requests'
//! responses, and only then does each request answer. A crash in between leaves committed
//! completions whose clients saw nothing. What must hold: every key answered 201 before a kill
//! replays byte for byte after the restart; every key sent (answered or not) ends with exactly
//! one charge; and a key completed but never answered replays on its retry (it never runs
//! twice). The test keeps killing until it has seen such a key, so it proves it met the window
//! (it fails, saying so, if none of its kills did).
//!
//! Needs `DATABASE_URL` (skipped without one, required under CI).

use std::collections::BTreeMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use idemlog_e2e::*;

const KILLS: usize = 12;
const CLIENTS: usize = 32;

fn database_url() -> Option<String> {
    match std::env::var("DATABASE_URL") {
        Ok(url) if !url.is_empty() => Some(url),
        _ => {
            let required = std::env::var_os("CI").is_some()
                || std::env::var("IDEMLOG_REQUIRE_POSTGRES").as_deref() == Ok("1");
            assert!(
                !required,
                "DATABASE_URL is not set but the PostgreSQL tests are required here"
            );
            eprintln!("SKIPPED: DATABASE_URL is not set (see scripts/pg-test-cluster)");
            None
        }
    }
}

fn start(url: &str, schema: &str) -> Server {
    Server::start_on_database(
        url,
        &[
            "--database-schema",
            schema,
            "--lease",
            "1s",
            "--gateway-latency",
            "0ms",
        ],
        &[("IDEMLOG_API_KEYS", &format!("{KEY_A}={ACCOUNT_A}"))],
    )
}

/// Sends new keys from `CLIENTS` threads until `stop`; every key with its answer, if any.
fn load(server: &Arc<Server>, kill: usize, stop: &Arc<AtomicBool>) -> Vec<(String, Option<Reply>)> {
    let clients: Vec<_> = (0..CLIENTS)
        .map(|t| {
            let (server, stop) = (Arc::clone(server), Arc::clone(stop));
            std::thread::spawn(move || {
                let mut sent = Vec::new();
                let mut i = 0;
                while !stop.load(Ordering::SeqCst) {
                    let key = format!("kill-{kill}-{t}-{i}");
                    let reply = server.try_pay(KEY_A, &key, BODY);
                    let dead = reply.is_none();
                    sent.push((key, reply));
                    if dead {
                        break;
                    }
                    i += 1;
                }
                sent
            })
        })
        .collect();
    clients
        .into_iter()
        .flat_map(|c| c.join().expect("client thread"))
        .collect()
}

/// Every key again, from a few threads: an acknowledged key replays byte for byte; an unanswered
/// one completes now (after the dead server's claim, if any, has lost its 1 s lease) or replays
/// because it completed before the kill. Returns how many did the latter.
fn verify(server: &Arc<Server>, sent: Vec<(String, Option<Reply>)>) -> usize {
    let chunks: Vec<Vec<(String, Option<Reply>)>> = sent
        .chunks(sent.len().div_ceil(8).max(1))
        .map(<[_]>::to_vec)
        .collect();
    let checkers: Vec<_> = chunks
        .into_iter()
        .map(|chunk| {
            let server = Arc::clone(server);
            std::thread::spawn(move || {
                let mut completed_unanswered = 0;
                for (key, first) in chunk {
                    if let Some(first) = &first {
                        assert_eq!(first.status, 201, "{key}: {first:?}");
                    }
                    let started = Instant::now();
                    let mut again = server.pay(KEY_A, &key, BODY);
                    while again.status == 409 {
                        assert!(
                            started.elapsed() < Duration::from_secs(20),
                            "{key} still in progress after 20 s"
                        );
                        std::thread::sleep(Duration::from_millis(50));
                        again = server.pay(KEY_A, &key, BODY);
                    }
                    assert_eq!(again.status, 201, "{key}: {again:?}");
                    match first {
                        Some(first) => {
                            assert!(again.replayed(), "acknowledged {key} ran again: {again:?}");
                            assert_eq!(again.body, first.body, "{key}");
                        }
                        None if again.replayed() => completed_unanswered += 1,
                        None => {}
                    }
                }
                completed_unanswered
            })
        })
        .collect();
    checkers
        .into_iter()
        .map(|c| c.join().expect("checker thread"))
        .sum()
}

#[test]
fn server_killed_between_a_batch_commit_and_its_responses_loses_nothing_and_charges_once() {
    let Some(url) = database_url() else { return };
    let schema = format!("e2e_kill_{}", std::process::id());
    let mut server = Arc::new(start(&url, &schema));
    let mut all_keys = 0u64;
    let mut unanswered_but_completed = 0;
    for kill in 0..KILLS {
        let stop = Arc::new(AtomicBool::new(false));
        let loader = {
            let (server, stop) = (Arc::clone(&server), Arc::clone(&stop));
            std::thread::spawn(move || load(&server, kill, &stop))
        };
        // Let the load reach full batches, then kill at a moment that differs per round.
        std::thread::sleep(Duration::from_millis(300 + 37 * kill as u64));
        let pid = server.pid();
        let status = std::process::Command::new("kill")
            .args(["-KILL", &pid.to_string()])
            .status()
            .expect("run kill");
        assert!(status.success());
        stop.store(true, Ordering::SeqCst);
        let sent: BTreeMap<String, Option<Reply>> =
            loader.join().expect("loader").into_iter().collect();
        // The dead server's handle (its child is reaped when the last reference goes).
        drop(server);
        server = Arc::new(start(&url, &schema));
        let answered = sent
            .values()
            .filter(|r| r.as_ref().is_some_and(|r| r.status == 201))
            .count();
        assert!(
            answered > 0,
            "kill {kill}: no payment answered before the kill"
        );
        let checked = verify(&server, sent.clone().into_iter().collect());
        unanswered_but_completed += checked;
        all_keys += sent.len() as u64;
        assert_eq!(
            server.charges(),
            all_keys,
            "kill {kill}: one charge per key sent"
        );
        eprintln!(
            "kill {kill}: {} keys sent, {answered} answered; {unanswered_but_completed} completed \
             but unanswered so far",
            sent.len()
        );
        if unanswered_but_completed > 0 && kill >= 1 {
            return;
        }
    }
    panic!(
        "none of {KILLS} kills landed between a completion's commit and its response: the test \
         proved nothing about that window"
    );
}
