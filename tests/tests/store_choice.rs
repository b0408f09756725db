//! Which store serves is chosen explicitly (issue 21, point 4): an explicit `--data-dir` means the
//! embedded store whatever the environment holds, both stores on the command line is a start-up
//! error, and the log and `/metrics` say which store serves.

use idemlog_e2e::*;

/// A database nobody listens on: a server that tried to use it would not start.
const UNREACHABLE: &str = "postgres://someone:pw@127.0.0.1:1/other_app";

#[test]
fn an_explicit_data_dir_serves_the_embedded_store_whatever_database_urls_the_environment_holds() {
    let dir = TempDir::new("store-choice");
    let keys = format!("{KEY_A}={ACCOUNT_A}");
    let server = Server::start_with(
        dir.path(),
        &[],
        &[
            ("IDEMLOG_API_KEYS", &keys),
            ("DATABASE_URL", UNREACHABLE),
            ("IDEMLOG_DATABASE_URL", UNREACHABLE),
        ],
    );
    assert_eq!(server.pay(KEY_A, "order-1", BODY).status, 201);
    assert_eq!(
        server.metric(r#"idemlog_store_info{backend="embedded"}"#),
        1
    );
    let logs = server.logs().join("\n");
    assert!(
        logs.lines().any(
            |l| l.contains("store chosen") && l.contains("backend=\"embedded\"")
                || l.contains("store chosen") && l.contains("backend=embedded")
        ),
        "{logs}"
    );
}

#[test]
fn data_dir_and_database_url_both_on_the_command_line_are_a_startup_error_naming_both() {
    let dir = TempDir::new("store-choice-both");
    let output = std::process::Command::new(binary())
        .env_remove("DATABASE_URL")
        .env_remove("IDEMLOG_DATABASE_URL")
        .env_remove("IDEMLOG_DATA_DIR")
        .arg("--listen")
        .arg("127.0.0.1:0")
        .arg("--data-dir")
        .arg(dir.path())
        .args(["--database-url", UNREACHABLE])
        .output()
        .expect("run idemlog-server");
    assert!(!output.status.success());
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(
        stderr.contains("--data-dir") && stderr.contains("--database-url"),
        "{stderr}"
    );
    assert!(!stderr.contains("listening"), "{stderr}");
}
