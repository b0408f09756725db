//! Two real `idemlog-server` processes on one PostgreSQL database (`--database-url`), as behind a
//! load balancer.
//!
//! Needs `DATABASE_URL` (`scripts/pg-test-cluster run -- cargo test`). Without it the tests print a
//! skip line, unless CI set PostgreSQL up (`CI` or `IDEMLOG_REQUIRE_POSTGRES=1`): then they fail.
//! Each test uses a schema of its own.

use std::io::{Read, Write};
use std::net::{Shutdown, TcpListener, TcpStream};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use idemlog_e2e::*;

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

fn schema(test: &str) -> String {
    format!("e2e_{test}_{}", std::process::id())
}

/// An instance on the shared database.
fn instance(url: &str, schema: &str, args: &[&str]) -> Server {
    let mut all = vec!["--database-schema", schema];
    all.extend_from_slice(args);
    Server::start_on_database(
        url,
        &all,
        &[(
            "IDEMLOG_API_KEYS",
            &format!("{KEY_A}={ACCOUNT_A},{KEY_B}={ACCOUNT_B}"),
        )],
    )
}

#[test]
fn concurrent_duplicates_sent_to_both_instances_charge_once() {
    let Some(url) = database_url() else { return };
    let schema = schema("dups");
    let a = Arc::new(instance(&url, &schema, &["--gateway-latency", "50ms"]));
    let b = Arc::new(instance(&url, &schema, &["--gateway-latency", "50ms"]));
    let threads: Vec<_> = (0..12)
        .map(|i| {
            let server = if i % 2 == 0 {
                Arc::clone(&a)
            } else {
                Arc::clone(&b)
            };
            std::thread::spawn(move || server.pay(KEY_A, "order-1", BODY))
        })
        .collect();
    let replies: Vec<Reply> = threads
        .into_iter()
        .map(|t| t.join().expect("thread"))
        .collect();
    let created: Vec<&Reply> = replies.iter().filter(|r| r.status == 201).collect();
    assert!(!created.is_empty(), "{replies:?}");
    assert!(
        replies.iter().all(|r| r.status == 201 || r.status == 409),
        "{replies:?}"
    );
    assert!(created.iter().all(|r| r.body == created[0].body));
    assert_eq!(a.charges(), 1);
    assert_eq!(b.charges(), 1, "the counter is the shared database's");
}

#[test]
fn a_key_completed_on_one_instance_replays_on_the_other_byte_for_byte() {
    let Some(url) = database_url() else { return };
    let schema = schema("replay");
    let a = instance(&url, &schema, &["--gateway-latency", "0ms"]);
    let b = instance(&url, &schema, &["--gateway-latency", "0ms"]);
    let first = a.pay(KEY_A, "order-1", BODY);
    assert_eq!(first.status, 201, "{first:?}");
    let replay = b.pay(KEY_A, "order-1", BODY);
    assert_eq!(replay.status, 201);
    assert!(replay.replayed());
    assert_eq!(replay.body, first.body);
    assert_eq!(replay.header("location"), first.header("location"));
    let location = first.header("location").expect("location");
    assert_eq!(b.get(Some(KEY_A), location).status, 200);
    assert_eq!(b.get(Some(KEY_B), location).status, 404);
    let other = b.pay(KEY_A, "order-1", r#"{"amount": 250.00, "currency": "BRL"}"#);
    assert_eq!(other.status, 422, "{other:?}");
    assert_eq!(b.charges(), 1);
}

#[test]
fn an_instance_killed_mid_request_is_taken_over_by_the_other_after_the_lease() {
    let Some(url) = database_url() else { return };
    let schema = schema("takeover");
    let a = instance(
        &url,
        &schema,
        &["--lease", "2s", "--gateway-latency", "60s"],
    );
    let b = instance(
        &url,
        &schema,
        &["--lease", "2s", "--gateway-latency", "0ms"],
    );
    let auth = format!("Bearer {KEY_A}");
    let _abandoned = a.send_only(
        "POST",
        "/payments",
        &[
            ("Authorization", &auth),
            ("Content-Type", "application/json"),
            ("Idempotency-Key", "order-1"),
        ],
        BODY.as_bytes(),
    );
    wait_until(Duration::from_secs(10), "the charge", || b.charges() == 1);
    a.kill();
    // The dead instance's claim holds the key until its lease runs out; then the other instance
    // takes it over and the provider hands back the original charge.
    let started = Instant::now();
    let mut reply = b.pay(KEY_A, "order-1", BODY);
    while reply.status == 409 {
        assert!(
            started.elapsed() < Duration::from_secs(15),
            "never taken over"
        );
        assert!(reply.header("retry-after").is_some());
        std::thread::sleep(Duration::from_millis(200));
        reply = b.pay(KEY_A, "order-1", BODY);
    }
    assert_eq!(reply.status, 201, "{reply:?}");
    assert!(!reply.replayed());
    assert_eq!(b.outcome("taken_over"), 1);
    assert_eq!(b.charges(), 1);
}

#[test]
fn payments_acknowledged_by_both_instances_survive_sigkill_of_both() {
    let Some(url) = database_url() else { return };
    let schema = schema("survive");
    let a = instance(&url, &schema, &["--gateway-latency", "0ms"]);
    let b = instance(&url, &schema, &["--gateway-latency", "0ms"]);
    let from_a = a.pay(KEY_A, "order-a", BODY);
    let from_b = b.pay(KEY_B, "order-b", BODY);
    assert_eq!((from_a.status, from_b.status), (201, 201));
    a.kill();
    b.kill();
    let c = instance(&url, &schema, &["--gateway-latency", "0ms"]);
    let again_a = c.pay(KEY_A, "order-a", BODY);
    let again_b = c.pay(KEY_B, "order-b", BODY);
    assert!(again_a.replayed() && again_b.replayed());
    assert_eq!(again_a.body, from_a.body);
    assert_eq!(again_b.body, from_b.body);
    assert_eq!(c.charges(), 2);
}

/// A TCP relay between the servers and PostgreSQL that can be cut (every connection dropped, new
/// ones refused) and restored: the database going away and coming back, as the servers see it.
struct Relay {
    port: u16,
    up: Arc<AtomicBool>,
    open: Arc<Mutex<Vec<TcpStream>>>,
}

impl Relay {
    fn start(target: String) -> Relay {
        let listener = TcpListener::bind("127.0.0.1:0").expect("bind relay");
        let port = listener.local_addr().expect("addr").port();
        let up = Arc::new(AtomicBool::new(true));
        let open = Arc::new(Mutex::new(Vec::new()));
        let (up2, open2) = (Arc::clone(&up), Arc::clone(&open));
        std::thread::spawn(move || {
            for inbound in listener.incoming() {
                let Ok(inbound) = inbound else { continue };
                if !up2.load(Ordering::SeqCst) {
                    drop(inbound);
                    continue;
                }
                let Ok(outbound) = TcpStream::connect(&target) else {
                    continue;
                };
                let mut open = open2.lock().expect("relay");
                for stream in [&inbound, &outbound] {
                    if let Ok(clone) = stream.try_clone() {
                        open.push(clone);
                    }
                }
                pipe(inbound.try_clone(), outbound.try_clone());
                pipe(Ok(outbound), Ok(inbound));
            }
        });
        Relay { port, up, open }
    }

    fn cut(&self) {
        self.up.store(false, Ordering::SeqCst);
        for stream in self.open.lock().expect("relay").drain(..) {
            let _ = stream.shutdown(Shutdown::Both);
        }
    }

    fn restore(&self) {
        self.up.store(true, Ordering::SeqCst);
    }
}

fn pipe(from: std::io::Result<TcpStream>, to: std::io::Result<TcpStream>) {
    let (Ok(mut from), Ok(mut to)) = (from, to) else {
        return;
    };
    std::thread::spawn(move || {
        let mut buf = [0u8; 16 * 1024];
        loop {
            match from.read(&mut buf) {
                Ok(0) | Err(_) => break,
                Ok(n) => {
                    if to.write_all(&buf[..n]).is_err() {
                        break;
                    }
                }
            }
        }
        let _ = to.shutdown(Shutdown::Both);
    });
}

#[test]
fn the_database_going_away_under_load_gives_503s_then_service_with_nothing_lost() {
    let Some(url) = database_url() else { return };
    // postgres://user:password@host:port/db → the same through the relay.
    let (head, tail) = url.rsplit_once('@').expect("URL with credentials");
    let (hostport, db) = tail.split_once('/').expect("URL with a database");
    let relay = Relay::start(hostport.to_owned());
    let relayed = format!("{head}@127.0.0.1:{}/{db}", relay.port);
    let schema = schema("outage");
    let a = instance(&relayed, &schema, &["--gateway-latency", "0ms"]);
    let b = instance(&relayed, &schema, &["--gateway-latency", "0ms"]);

    let mut acknowledged = Vec::new();
    for i in 0..10 {
        let server = if i % 2 == 0 { &a } else { &b };
        let reply = server.pay(KEY_A, &format!("before-{i}"), BODY);
        assert_eq!(reply.status, 201);
        acknowledged.push((format!("before-{i}"), reply.body));
    }
    relay.cut();
    let cut_at = Instant::now();
    let during = a.pay(KEY_A, "during", BODY);
    assert_eq!(during.status, 503, "{during:?}");
    assert!(
        cut_at.elapsed() < Duration::from_secs(15),
        "a 503 must come quickly"
    );
    let text = during.text();
    assert!(
        !text.contains("127.0.0.1") && !text.contains("idemlog-test-pw"),
        "{text}"
    );
    wait_until(
        Duration::from_secs(10),
        "readyz to report the outage",
        || a.get(None, "/readyz").status == 503,
    );

    relay.restore();
    wait_until(Duration::from_secs(20), "service to come back", || {
        a.get(None, "/readyz").status == 200 && b.pay(KEY_A, "after", BODY).status == 201
    });
    // The request refused during the outage runs now, once; everything acknowledged before is there.
    assert_eq!(a.pay(KEY_A, "during", BODY).status, 201);
    for (i, (key, body)) in acknowledged.iter().enumerate() {
        let server = if i % 2 == 0 { &b } else { &a };
        let replay = server.pay(KEY_A, key, BODY);
        assert!(replay.replayed(), "{key}: {replay:?}");
        assert_eq!(&replay.body, body);
    }
    assert_eq!(a.charges(), 12);
}

#[test]
fn an_idle_instance_is_unready_but_live_while_the_database_is_down() {
    let Some(url) = database_url() else { return };
    let (head, tail) = url.rsplit_once('@').expect("URL with credentials");
    let (hostport, db) = tail.split_once('/').expect("URL with a database");
    let relay = Relay::start(hostport.to_owned());
    let relayed = format!("{head}@127.0.0.1:{}/{db}", relay.port);
    let server = instance(&relayed, &schema("liveness"), &[]);
    assert_eq!(server.get(None, "/readyz").status, 200);

    // No request is sent: readiness must follow the database on its own, within 3 s.
    relay.cut();
    let cut_at = Instant::now();
    while server.get(None, "/readyz").status != 503 {
        assert!(
            cut_at.elapsed() < Duration::from_secs(3),
            "readyz still 200 {:?} after the database went away",
            cut_at.elapsed()
        );
        std::thread::sleep(Duration::from_millis(50));
    }
    // Liveness is the process's: a shared database's outage must not make every instance's
    // liveness probe fail (and get every instance restarted at once).
    for _ in 0..10 {
        let live = server.get(None, "/healthz");
        assert_eq!(live.status, 200, "healthz during the outage: {live:?}");
        std::thread::sleep(Duration::from_millis(100));
    }
    let metrics = server.get(None, "/metrics").text();
    let up = metrics
        .lines()
        .find_map(|l| l.strip_prefix("idemlog_pg_up "))
        .and_then(|v| v.trim().parse::<f64>().ok());
    assert_eq!(up, Some(0.0), "{metrics}");

    relay.restore();
    let restored_at = Instant::now();
    while server.get(None, "/readyz").status != 200 {
        assert!(
            restored_at.elapsed() < Duration::from_secs(3),
            "readyz still 503 {:?} after the database returned",
            restored_at.elapsed()
        );
        std::thread::sleep(Duration::from_millis(50));
    }
    assert_eq!(server.get(None, "/healthz").status, 200);
}

#[test]
fn without_a_reachable_database_the_server_exits_non_zero_naming_it_without_the_password() {
    // A port nobody listens on: bind one, then free it.
    let port = TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .expect("free port")
        .port();
    let url = format!("postgres://payments:s3cret-pw@127.0.0.1:{port}/payments");
    let started = Instant::now();
    let output = std::process::Command::new(binary())
        .env_remove("DATABASE_URL")
        .args(["--listen", "127.0.0.1:0", "--database-url", &url])
        .output()
        .expect("run idemlog-server");
    assert!(!output.status.success());
    assert!(
        started.elapsed() < Duration::from_secs(30),
        "{:?}",
        started.elapsed()
    );
    let log = String::from_utf8_lossy(&output.stderr);
    assert!(log.contains(&format!("127.0.0.1:{port}/payments")), "{log}");
    assert!(!log.contains("s3cret-pw"), "the password leaked: {log}");
}
