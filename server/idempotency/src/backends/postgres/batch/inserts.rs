//! Batched write-once inserts (`insert_once`): one statement inserts every record of a batch that
//! has no row and adds them to their counters (`sql::Statements::insert_new`, the common case);
//! one more (`sql::Statements::insert_once`) settles the calls it left: it takes over expired
//! records and returns each live one.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering};

use bytes::Bytes;
use deadpool_postgres::Object;

use super::{Item, Kind, row_hash};
use crate::backends::postgres::error::Fail;
use crate::backends::postgres::lanes::{Job, route_of};
use crate::backends::postgres::store::Inner;
use crate::store::{InsertOnce, StoreError};

/// One write-once insert, its input checked.
pub(crate) struct InsertJob {
    pub(crate) namespace: &'static str,
    pub(crate) key: String,
    pub(crate) value: Bytes,
    pub(crate) after_ms: Option<i64>,
    pub(crate) at_ms: Option<i64>,
    pub(crate) counter: &'static str,
    /// Set once the fast statement has left this call to the general one.
    pub(crate) general: AtomicBool,
}

impl Job for InsertJob {
    type Answer = InsertOnce;

    fn route(&self) -> u64 {
        route_of(&[self.namespace, &self.key])
    }

    fn weight(&self) -> usize {
        self.namespace.len() + self.key.len() + self.value.len() + self.counter.len() + 16
    }
}

/// The write-once statement's kind of batch.
pub(crate) struct Inserts;

impl Kind for Inserts {
    type Job = InsertJob;
    const WHAT: &'static str = "insert_once";

    fn conflicts(job: &InsertJob, out: &mut Vec<u64>) {
        out.push(row_hash(1, job.namespace, &job.key));
    }

    async fn attempt<'a>(
        inner: &'a Inner,
        client: &'a mut Object,
        jobs: &'a [&'a InsertJob],
    ) -> Result<Vec<Item<InsertOnce>>, Fail> {
        // One statement per attempt, so that what it committed is final.
        if jobs.iter().any(|j| !j.general.load(Ordering::Relaxed)) {
            insert_new(inner, client, jobs).await
        } else {
            insert_once(inner, client, jobs).await
        }
    }
}

/// The arrays of a batch of inserts, for either statement.
struct Arrays<'a> {
    idx: Vec<i32>,
    ns: Vec<&'a str>,
    keys: Vec<&'a str>,
    values: Vec<&'a [u8]>,
    after: Vec<Option<i64>>,
    at: Vec<Option<i64>>,
    counters: Vec<&'a str>,
}

impl<'a> Arrays<'a> {
    fn of(jobs: impl Iterator<Item = &'a InsertJob> + Clone) -> Self {
        Self {
            idx: (0..jobs.clone().count() as i32).collect(),
            ns: jobs.clone().map(|j| j.namespace).collect(),
            keys: jobs.clone().map(|j| j.key.as_str()).collect(),
            values: jobs.clone().map(|j| &j.value[..]).collect(),
            after: jobs.clone().map(|j| j.after_ms).collect(),
            at: jobs.clone().map(|j| j.at_ms).collect(),
            counters: jobs.map(|j| j.counter).collect(),
        }
    }

    fn params(&self) -> [&(dyn tokio_postgres::types::ToSql + Sync); 7] {
        [
            &self.idx,
            &self.ns,
            &self.keys,
            &self.values,
            &self.after,
            &self.at,
            &self.counters,
        ]
    }
}

/// The fast statement for the calls not yet through it; every call it does not insert goes on
/// to the general statement.
async fn insert_new(
    inner: &Inner,
    client: &Object,
    jobs: &[&InsertJob],
) -> Result<Vec<Item<InsertOnce>>, Fail> {
    let chosen: Vec<usize> = (0..jobs.len())
        .filter(|&i| !jobs[i].general.load(Ordering::Relaxed))
        .collect();
    if let [only] = chosen[..] {
        return insert_one(inner, client, jobs, only).await;
    }
    let arrays = Arrays::of(chosen.iter().map(|&i| jobs[i]));
    let rows = inner
        .sql
        .insert_new
        .query(client, inner.pooling, &arrays.params())
        .await?;
    let by_key: HashMap<(&str, &str), usize> = chosen
        .iter()
        .map(|&i| ((jobs[i].namespace, jobs[i].key.as_str()), i))
        .collect();
    let mut items: Vec<Item<InsertOnce>> = jobs
        .iter()
        .map(|j| {
            j.general.store(true, Ordering::Relaxed);
            Item::Next
        })
        .collect();
    for row in &rows {
        let (ns, key): (&str, &str) = (row.try_get("namespace")?, row.try_get("key")?);
        let i = *by_key.get(&(ns, key)).ok_or_else(|| {
            Fail::Store(StoreError::Internal(
                "the insert statement inserted a record it was not given".into(),
            ))
        })?;
        items[i] = Item::Done(Ok(InsertOnce::Inserted));
    }
    Ok(items)
}

/// [`insert_new`] for one call (`jobs[only]`): the same statement with scalar parameters.
async fn insert_one(
    inner: &Inner,
    client: &Object,
    jobs: &[&InsertJob],
    only: usize,
) -> Result<Vec<Item<InsertOnce>>, Fail> {
    let job = jobs[only];
    let row = inner
        .sql
        .insert_one
        .query_one(
            client,
            inner.pooling,
            &[
                &job.namespace,
                &job.key,
                &&job.value[..],
                &job.after_ms,
                &job.at_ms,
                &job.counter,
            ],
        )
        .await?;
    let mut items: Vec<Item<InsertOnce>> = jobs
        .iter()
        .map(|j| {
            j.general.store(true, Ordering::Relaxed);
            Item::Next
        })
        .collect();
    if row.try_get::<_, bool>("inserted")? {
        items[only] = Item::Done(Ok(InsertOnce::Inserted));
    }
    Ok(items)
}

/// The general statement: takes over expired records, returns live ones.
async fn insert_once(
    inner: &Inner,
    client: &Object,
    jobs: &[&InsertJob],
) -> Result<Vec<Item<InsertOnce>>, Fail> {
    let n = jobs.len();
    let arrays = Arrays::of(jobs.iter().copied());
    let rows = inner
        .sql
        .insert_once
        .query(client, inner.pooling, &arrays.params())
        .await?;
    let mut items: Vec<Item<InsertOnce>> = (0..n).map(|_| Item::Stale).collect();
    for row in &rows {
        let i = usize::try_from(row.try_get::<_, i32>("idx")?)
            .ok()
            .filter(|&i| i < n)
            .ok_or_else(|| {
                Fail::Store(StoreError::Internal(
                    "the insert statement answered for a call it was not given".into(),
                ))
            })?;
        items[i] = if row.try_get::<_, bool>("inserted")? {
            Item::Done(Ok(InsertOnce::Inserted))
        } else {
            match row.try_get::<_, Option<Vec<u8>>>("existing")? {
                Some(v) => Item::Done(Ok(InsertOnce::Existing(Bytes::from(v)))),
                // Not inserted, yet no live record in the statement's snapshot: a concurrent
                // insert committed after the snapshot, or the snapshot's record had expired
                // and another call replaced it. Look again.
                None => Item::Stale,
            }
        };
    }
    Ok(items)
}
