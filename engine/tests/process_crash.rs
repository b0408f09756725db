//! A real process is SIGKILLed while doing durable claims and completions; every operation it
//! acknowledged (reported to us before the kill) must be there after reopening.
//!
//! The child is this same test binary, re-run with an environment variable that makes
//! `child_writes_until_killed` do the work; in a normal run that test returns at once.

use std::io::{BufRead, BufReader};
use std::process::{Command, Stdio};
use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime};

use idemlog::storage::FsStorage;
use idemlog::{ClaimOutcome, Fingerprint, Options, RecordState, SideWrite, Store, StoredResponse};

const CHILD_DIR: &str = "IDEMLOG_CRASH_CHILD_DIR";
const CHILD_PREFIX: &str = "IDEMLOG_CRASH_CHILD_PREFIX";
const TTL: Duration = Duration::from_secs(3600);
const WRITER_THREADS: usize = 4;

fn options() -> Options {
    Options::default().storage(Arc::new(FsStorage))
}

fn body(key: &str) -> String {
    format!("{{\"payment\":\"{key}\"}}")
}

#[test]
fn child_writes_until_killed() {
    let (Ok(dir), Ok(prefix)) = (std::env::var(CHILD_DIR), std::env::var(CHILD_PREFIX)) else {
        return;
    };
    let store = Store::open(&dir, options()).expect("child opens the store");
    let threads: Vec<_> = (0..WRITER_THREADS)
        .map(|t| {
            let store = store.clone();
            let prefix = prefix.clone();
            std::thread::spawn(move || {
                for n in 0.. {
                    let key = format!("{prefix}-{t}-{n}");
                    let ClaimOutcome::Acquired(token) = store
                        .claim(b"acct", key.as_bytes(), &Fingerprint([1; 32]), TTL)
                        .expect("claim")
                    else {
                        panic!("fresh key not acquired");
                    };
                    println!("ack claim {key}");
                    if n % 3 == 2 {
                        continue; // leave some claims in progress
                    }
                    let side = [SideWrite::put("payments", key.clone(), body(&key))];
                    store
                        .complete(&token, &StoredResponse::new(201, body(&key)), &side)
                        .expect("complete");
                    println!("ack complete {key}");
                }
            })
        })
        .collect();
    for t in threads {
        let _ = t.join();
    }
}

#[test]
fn sigkill_loses_no_acknowledged_operation() {
    let dir = std::env::temp_dir().join(format!("idemlog-sigkill-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    let seed = SystemTime::now()
        .duration_since(SystemTime::UNIX_EPOCH)
        .unwrap()
        .subsec_nanos();
    for round in 0..3u32 {
        // Kill after a pseudo-random number of acknowledgements (10..400), so the kill lands at a
        // different point of the claim / complete / fsync cycle each time.
        let kill_after = 10 + (seed.wrapping_mul(round + 7) % 390) as usize;
        let mut child = Command::new(std::env::current_exe().unwrap())
            .args([
                "child_writes_until_killed",
                "--exact",
                "--nocapture",
                "--test-threads=1",
            ])
            .env(CHILD_DIR, &dir)
            .env(CHILD_PREFIX, format!("r{round}"))
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()
            .expect("spawn child");
        let stdout = child.stdout.take().unwrap();
        let mut claimed = Vec::new();
        let mut completed = Vec::new();
        let deadline = Instant::now() + Duration::from_secs(60);
        for line in BufReader::new(stdout).lines() {
            let line = line.unwrap();
            if let Some(key) = line.strip_prefix("ack claim ") {
                claimed.push(key.to_owned());
            } else if let Some(key) = line.strip_prefix("ack complete ") {
                completed.push(key.to_owned());
            }
            if claimed.len() + completed.len() >= kill_after || Instant::now() > deadline {
                break;
            }
        }
        child.kill().expect("SIGKILL the child");
        child.wait().unwrap();
        assert!(
            !claimed.is_empty(),
            "round {round}: the child acknowledged nothing"
        );

        let store = Store::open(&dir, options()).expect("reopen after SIGKILL");
        for key in &claimed {
            assert!(
                store.get(b"acct", key.as_bytes()).unwrap().is_some(),
                "round {round} (seed {seed}): acknowledged claim {key} lost"
            );
        }
        for key in &completed {
            let record = store.get(b"acct", key.as_bytes()).unwrap().unwrap();
            let RecordState::Completed(response) = record.state else {
                panic!("round {round} (seed {seed}): acknowledged completion {key} lost");
            };
            assert_eq!(response.body, body(key));
            assert_eq!(
                store
                    .side_get(b"payments", key.as_bytes())
                    .unwrap()
                    .unwrap(),
                body(key),
                "side record of {key} must land with its completion"
            );
        }
    }
    let _ = std::fs::remove_dir_all(&dir);
}
