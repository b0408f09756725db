//! Counters of the embedded store in a data directory written before their namespace was renamed
//! (`gateway.counters` → `idemlog.counters`): the counts read the same, an increment moves its
//! stripe to the new name in one append, and nothing is lost across reopening.

use std::sync::Arc;

use bytes::Bytes;
use idemlog::testkit::faulty::FaultyStorage;
use idemlog::{Options, SideWrite, Store};
use idemlog_idempotency::backends::embedded::{
    COUNTER_STRIPES, COUNTERS_NAMESPACE, EmbeddedBackend, LEGACY_COUNTERS_NAMESPACE,
};
use idemlog_idempotency::{IdempotencyStore, InsertOnce, RecordWrite};

const COUNTER: &str = "charges_total";

fn options(storage: &Arc<FaultyStorage>) -> Options {
    Options::default().storage(storage.clone())
}

fn stripe_key(stripe: usize) -> String {
    format!("{COUNTER}/{stripe:02}")
}

/// How many stripes of the counter have a record under `namespace`.
fn stripes_under(store: &Store, namespace: &str) -> usize {
    (0..COUNTER_STRIPES)
        .filter(|&s| {
            store
                .side_get(namespace.as_bytes(), stripe_key(s).as_bytes())
                .expect("side get")
                .is_some()
        })
        .count()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn counters_written_under_the_old_namespace_keep_their_counts_and_move_when_they_change() {
    let storage = Arc::new(FaultyStorage::new());
    // A data directory as the previous release left it: every stripe under the old name.
    {
        let old = Store::open("/data", options(&storage)).expect("open");
        let writes: Vec<SideWrite> = (0..COUNTER_STRIPES)
            .map(|s| {
                SideWrite::put(
                    LEGACY_COUNTERS_NAMESPACE,
                    stripe_key(s),
                    (s as u64 + 1).to_string(),
                )
            })
            .collect();
        old.side_write(&writes).expect("legacy counter records");
        old.close().expect("close");
    }
    let before: u64 = (1..=COUNTER_STRIPES as u64).sum();

    let store = EmbeddedBackend::open("/data", options(&storage)).expect("open the backend");
    assert_eq!(store.counter(COUNTER).await.unwrap(), before);
    let write = RecordWrite::put("charges", "c-1", Bytes::from_static(b"{}"));
    assert_eq!(
        store.insert_once(&write, COUNTER).await.unwrap(),
        InsertOnce::Inserted
    );
    assert_eq!(store.counter(COUNTER).await.unwrap(), before + 1);
    // The same record again changes nothing.
    assert!(matches!(
        store.insert_once(&write, COUNTER).await.unwrap(),
        InsertOnce::Existing(_)
    ));
    store.close().await.unwrap();
    drop(store);

    let reopened = EmbeddedBackend::open("/data", options(&storage)).expect("reopen");
    assert_eq!(reopened.counter(COUNTER).await.unwrap(), before + 1);
    let engine = reopened.engine().expect("engine store");
    assert_eq!(
        stripes_under(&engine, COUNTERS_NAMESPACE),
        1,
        "the incremented stripe moved"
    );
    assert_eq!(
        stripes_under(&engine, LEGACY_COUNTERS_NAMESPACE),
        COUNTER_STRIPES - 1,
        "it left the old name in the same append; the others stay until they change"
    );
    // Incrementing every stripe moves them all, and the count stays exact.
    for i in 0..200 {
        let write = RecordWrite::put("charges", format!("more-{i}"), Bytes::from_static(b"{}"));
        reopened.insert_once(&write, COUNTER).await.unwrap();
    }
    assert_eq!(reopened.counter(COUNTER).await.unwrap(), before + 201);
    assert_eq!(stripes_under(&engine, LEGACY_COUNTERS_NAMESPACE), 0);
    reopened.close().await.unwrap();
}
