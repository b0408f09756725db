//! The crate's example (`examples/orders.rs`), built and run as a process: the layer on a
//! non-payments app, through real HTTP.

use std::io::{BufRead, BufReader, Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::Duration;

/// Builds the example with the profile of this test executable and returns its path. The build
/// names the whole workspace, as `cargo test --workspace` does, so that it resolves the same
/// features and is a no-op after that command (which builds every example before running tests).
fn example_binary() -> PathBuf {
    let exe = std::env::current_exe().expect("test executable path");
    // <target>/<profile dir>/deps/<test exe>
    let profile_dir = exe.parent().and_then(Path::parent).expect("profile dir");
    let target_dir = profile_dir.parent().expect("target dir");
    let profile = match profile_dir.file_name().and_then(|n| n.to_str()) {
        Some("debug") | None => "test",
        Some(other) => other,
    };
    let status = Command::new(env!("CARGO"))
        .current_dir(env!("CARGO_MANIFEST_DIR"))
        .args([
            "build",
            "--quiet",
            "-p",
            "idemlog-idempotency",
            "--example",
            "orders",
        ])
        .args(["--profile", profile])
        .arg("--target-dir")
        .arg(target_dir)
        .status()
        .expect("run cargo build");
    assert!(status.success(), "cargo build --example orders failed");
    profile_dir
        .join("examples")
        .join(format!("orders{}", std::env::consts::EXE_SUFFIX))
}

/// The example process, killed on drop.
struct Orders(Child, SocketAddr);

impl Drop for Orders {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

fn start(dir: &Path) -> Orders {
    let mut child = Command::new(example_binary())
        .arg(dir)
        .arg("127.0.0.1:0")
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .spawn()
        .expect("start the example");
    let mut line = String::new();
    BufReader::new(child.stdout.take().expect("stdout"))
        .read_line(&mut line)
        .expect("read the example's first line");
    let addr = line
        .trim()
        .strip_prefix("listening on ")
        .and_then(|a| a.parse().ok())
        .unwrap_or_else(|| panic!("unexpected first line {line:?}"));
    Orders(child, addr)
}

/// Sends one `POST /orders` and returns (status, head, body).
fn post(addr: SocketAddr, headers: &[(&str, &str)], body: &str) -> (u16, String, String) {
    let mut stream = TcpStream::connect(addr).expect("connect");
    stream
        .set_read_timeout(Some(Duration::from_secs(30)))
        .expect("timeout");
    let mut request = format!(
        "POST /orders HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\nContent-Type: application/json\r\nContent-Length: {}\r\n",
        body.len()
    );
    for (name, value) in headers {
        request.push_str(&format!("{name}: {value}\r\n"));
    }
    request.push_str("\r\n");
    request.push_str(body);
    stream.write_all(request.as_bytes()).expect("send");
    let mut raw = String::new();
    stream.read_to_string(&mut raw).expect("read");
    let (head, body) = raw.split_once("\r\n\r\n").expect("a response head");
    let status = head[9..12].parse().expect("status code");
    (status, head.to_ascii_lowercase(), body.to_owned())
}

#[test]
fn the_orders_example_creates_an_order_once_per_key_and_tenant() {
    let dir = std::env::temp_dir().join(format!("idemlog-orders-example-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    let orders = start(&dir);
    let (addr, book) = (orders.1, r#"{"item": "book"}"#);
    let shop1 = [("X-Tenant", "shop-1"), ("Idempotency-Key", "k1")];

    let (status, head, first) = post(addr, &shop1, book);
    assert_eq!(status, 201, "{head}\n{first}");
    assert!(!head.contains("idempotent-replayed"), "{head}");

    // A retry gets the stored answer back, not a second order.
    let (status, head, replay) = post(addr, &shop1, book);
    assert_eq!((status, replay.as_str()), (201, first.as_str()));
    assert!(head.contains("idempotent-replayed: true"), "{head}");

    // The same key with another order is refused; without a key nothing runs.
    let (status, _, _) = post(addr, &shop1, r#"{"item": "pen"}"#);
    assert_eq!(status, 422);
    let (status, _, _) = post(addr, &[("X-Tenant", "shop-1")], book);
    assert_eq!(status, 400);

    // Another tenant's key of the same name is its own: a new order.
    let (status, _, other) = post(
        addr,
        &[("X-Tenant", "shop-2"), ("Idempotency-Key", "k1")],
        book,
    );
    assert_eq!(status, 201);
    assert_ne!(other, first);

    // No tenant, no scope: the layer answers 401 before anything runs.
    let (status, _, _) = post(addr, &[("Idempotency-Key", "k2")], book);
    assert_eq!(status, 401);

    drop(orders);
    let _ = std::fs::remove_dir_all(&dir);
}
