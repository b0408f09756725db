//! Log lines leave request paths through a writer thread (issue 23): a line handed to it before
//! a clean exit must still reach stderr, in order, whatever was queued when the signal came.

use std::time::Duration;

use idemlog_e2e::*;

#[test]
fn every_line_queued_before_a_clean_exit_reaches_stderr_in_order() {
    let dir = TempDir::new("logging");
    let server = Server::start(dir.path(), &["--gateway-latency", "0ms"]);
    let payments = 300;
    for i in 0..payments {
        let reply = server.pay(KEY_A, &format!("order-{i}"), BODY);
        assert_eq!(reply.status, 201, "{reply:?}");
    }
    let mut server = server;
    server.signal_terminate();
    assert!(server.wait_exit(Duration::from_secs(30)).success());
    // The process has exited; the test's reader thread may still be draining the pipe.
    wait_until(Duration::from_secs(10), "the last log line", || {
        server
            .logs()
            .last()
            .is_some_and(|l| l.contains("shut down cleanly"))
    });
    let logs = server.logs();
    let created = logs
        .iter()
        .filter(|l| l.contains("payment created"))
        .count();
    assert_eq!(created, payments, "{}", logs.join("\n"));
    let position = |text: &str| {
        logs.iter()
            .position(|l| l.contains(text))
            .unwrap_or_else(|| panic!("no {text:?} line in:\n{}", logs.join("\n")))
    };
    assert!(
        position("listening") < position("payment created")
            && position("store closed") < position("shut down cleanly"),
        "{}",
        logs.join("\n")
    );
}

#[test]
fn a_rejected_payment_writes_an_info_line_with_its_status_and_reason() {
    let dir = TempDir::new("logging-rejected");
    let server = Server::start(dir.path(), &["--gateway-latency", "0ms"]);
    let reply = server.pay(
        KEY_A,
        "order-too-precise",
        r#"{"amount": 1.001, "currency": "BRL"}"#,
    );
    assert_eq!(reply.status, 422, "{reply:?}");
    wait_until(Duration::from_secs(10), "the rejection's log line", || {
        server.logs().iter().any(|l| {
            l.contains(" INFO ")
                && l.contains("payment rejected")
                && l.contains("status=422")
                && l.contains("more than two decimal places")
                && l.contains("key=\"order-too-precise\"")
        })
    });
}

/// A log line a client tries to start with a line break in text of its own.
const FORGED: &str = "2026-01-01T00:00:00.000000Z  INFO forged: payment created";

/// Waits for the line naming `marker` (the rejection), then checks that no line starts with
/// [`FORGED`].
fn assert_no_forged_line(server: &Server, marker: &str) {
    wait_until(Duration::from_secs(10), "the rejection's log line", || {
        server.logs().iter().any(|l| l.contains(marker))
    });
    let logs = server.logs();
    assert!(
        !logs.iter().any(|l| l.starts_with(FORGED)),
        "a line starts with the client's text:\n{}",
        logs.join("\n")
    );
}

#[test]
fn a_client_text_echoed_in_a_rejection_cannot_start_a_log_line_of_its_own() {
    let dir = TempDir::new("logging-forged");
    let server = Server::start(dir.path(), &["--gateway-latency", "0ms"]);
    let body = format!(r#"{{"amount": 1.00, "currency": "BRL", "x\n{FORGED}": 1}}"#);
    let reply = server.pay(KEY_A, "order-forged", &body);
    assert_eq!(reply.status / 100, 4, "{reply:?}");
    assert_no_forged_line(&server, "payment rejected");
}

#[test]
fn a_repeated_member_name_cannot_start_a_log_line_of_its_own() {
    let dir = TempDir::new("logging-forged-member");
    let server = Server::start(dir.path(), &["--gateway-latency", "0ms"]);
    let body =
        format!(r#"{{"amount": 1.00, "currency": "BRL", "x\n{FORGED}": 1, "x\n{FORGED}": 2}}"#);
    let reply = server.pay(KEY_A, "order-forged-member", &body);
    assert_eq!(reply.status, 400, "{reply:?}");
    assert_no_forged_line(&server, "repeats a member name");
}
