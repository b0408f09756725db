// The program behind side_table_growth.txt: built as engine/examples/side_growth.rs for the runs (removed after),
// once on 8b02d02 (one side shard) and once on the sharded side table; both binaries alternated under the bench lock:
//   cargo build --release -p idemlog --example side_growth && target/release/examples/side_growth 2000000
// Experiment (not kept): the longest side_write calls while one thread puts N distinct side keys.
use std::time::Instant;
use idemlog::{Durability, Options, SideWrite, Store};
fn main() {
    let n: usize = std::env::args().nth(1).and_then(|s| s.parse().ok()).unwrap_or(1_000_000);
    let dir = std::env::temp_dir().join(format!("side-growth-{}", std::process::id()));
    let options = Options { durability: Durability::None, ..Options::default() };
    let store = Store::open(&dir, options).unwrap();
    let mut worst: Vec<(u128, usize)> = Vec::new();
    let t0 = Instant::now();
    for i in 0..n {
        let key = format!("charge:6:acct_a:key-{i:012}");
        let s = Instant::now();
        store.side_write(&[SideWrite::put("gateway.charges", key, "{\"id\":\"ch_0123456789abcdef01234567\",\"amount_minor\":10000,\"currency\":\"BRL\"}")]).unwrap();
        let us = s.elapsed().as_micros();
        if us > 1000 { worst.push((us, i)); }
    }
    println!("{n} puts in {:?}", t0.elapsed());
    for (us, i) in worst { println!("side_write #{i}: {us} us"); }
    drop(store);
    let _ = std::fs::remove_dir_all(&dir);
}
