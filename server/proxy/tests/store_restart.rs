//! The proxy's embedded store across a restart: a claim that was still in progress when the
//! process stopped (kill -9, or cut off by the shutdown grace) keeps its lease, because the
//! upstream it forwarded to may still be running it. A retry is told to wait (in progress) instead
//! of taking the key over and running the upstream a second time.

use std::path::PathBuf;
use std::time::Duration;

use clap::Parser;
use idemlog::Fingerprint;
use idemlog_idempotency::store::Claim;
use idemlog_proxy::cli::Cli;
use idemlog_proxy::store;

/// A fresh data directory, removed on drop.
struct DataDir(PathBuf);

impl DataDir {
    fn new(name: &str) -> Self {
        let nanos = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_nanos());
        let dir = std::env::temp_dir().join(format!(
            "idemlog-proxy-{name}-{}-{nanos}",
            std::process::id()
        ));
        Self(dir)
    }
}

impl Drop for DataDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

fn cli(dir: &DataDir, lease: &str) -> Cli {
    Cli::try_parse_from([
        "idemlog-proxy",
        "--upstream",
        "http://127.0.0.1:9",
        "--static-scope",
        "shop",
        "--lease",
        lease,
        "--data-dir",
        dir.0.to_str().expect("utf-8 temp dir"),
    ])
    .expect("flags")
}

const TTL: Duration = Duration::from_secs(3600);

#[tokio::test]
async fn a_claim_in_progress_when_the_proxy_stopped_keeps_its_lease_after_a_restart() {
    let dir = DataDir::new("held-lease");
    let fp = Fingerprint([7; 32]);
    let first = store::open(&cli(&dir, "30s"), 1024)
        .await
        .expect("open the store");
    let held = match first.claim("shop", "order-1", &fp, TTL).await {
        Ok(Claim::Acquired(held)) => held,
        other => panic!("expected a fresh claim, got {other:?}"),
    };
    // The proxy stops with the upstream still running: the claim is neither completed nor
    // released.
    first.close().await.expect("close");
    drop(held);
    drop(first);

    let second = store::open(&cli(&dir, "30s"), 1024)
        .await
        .expect("reopen the store");
    match second.claim("shop", "order-1", &fp, TTL).await {
        Ok(Claim::InProgress { lease_left }) => {
            assert!(lease_left > Duration::from_secs(20), "{lease_left:?}");
            assert!(lease_left <= Duration::from_secs(30), "{lease_left:?}");
        }
        other => panic!("expected the recovered claim to keep its lease, got {other:?}"),
    }
    second.close().await.expect("close");
}

#[tokio::test]
async fn a_claim_whose_lease_ended_while_the_proxy_was_down_is_taken_over() {
    let dir = DataDir::new("ended-lease");
    let fp = Fingerprint([8; 32]);
    let first = store::open(&cli(&dir, "1s"), 1024)
        .await
        .expect("open the store");
    let held = match first.claim("shop", "order-1", &fp, TTL).await {
        Ok(Claim::Acquired(held)) => held,
        other => panic!("expected a fresh claim, got {other:?}"),
    };
    first.close().await.expect("close");
    tokio::time::sleep(Duration::from_millis(1200)).await;

    let second = store::open(&cli(&dir, "1s"), 1024)
        .await
        .expect("reopen the store");
    match second.claim("shop", "order-1", &fp, TTL).await {
        Ok(Claim::Acquired(retry)) => assert!(retry.fence > held.fence),
        other => panic!("expected a takeover once the lease ended, got {other:?}"),
    }
    second.close().await.expect("close");
}
