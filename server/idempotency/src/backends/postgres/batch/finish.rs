//! Batched completions and releases: one fenced statement completes every key of a batch
//! (writing the business records of the completions that applied, in the same statement), one
//! releases; both commit synchronously, so an `Ok` means durable.
//!
//! A completion that also removes records runs its batch in one explicit transaction: the
//! completion statement, then a `DELETE` of the removals of the completions that applied
//! (CockroachDB refuses two modifications of one table in one statement). Batches of puts only,
//! the common case, never pay for it.

use bytes::Bytes;
use deadpool_postgres::Object;
use tokio_postgres::types::ToSql;

use super::{Item, Kind, row_hash};
use crate::backends::postgres::error::Fail;
use crate::backends::postgres::lanes::{Job, route_of};
use crate::backends::postgres::store::Inner;
use crate::store::StoreError;

/// A record put that a completion makes.
pub(crate) struct Put {
    pub(crate) namespace: &'static str,
    pub(crate) key: String,
    pub(crate) value: Bytes,
    pub(crate) after_ms: Option<i64>,
    pub(crate) at_ms: Option<i64>,
}

/// A record removal that a completion makes: `(namespace, key)`.
pub(crate) type Removal = (&'static str, String);

/// What ends a claim.
pub(crate) enum Finish {
    /// Store the response and write the records, if the fence still holds the key.
    Complete {
        status: i32,
        headers: Vec<u8>,
        body: Bytes,
        puts: Vec<Put>,
        removals: Vec<Removal>,
    },
    /// Give the key up, if the fence still holds it.
    Release,
}

/// One completion or release of a held claim, its input checked.
pub(crate) struct FinishJob {
    pub(crate) scope: String,
    pub(crate) key: String,
    pub(crate) fence: i64,
    pub(crate) finish: Finish,
}

impl FinishJob {
    fn lease_lost(&self) -> StoreError {
        StoreError::LeaseLost {
            scope: self.scope.clone(),
            key: self.key.clone(),
            fence: self.fence.max(0) as u64,
        }
    }
}

impl Job for FinishJob {
    type Answer = ();

    fn route(&self) -> u64 {
        route_of(&[&self.scope, &self.key])
    }

    fn weight(&self) -> usize {
        let base = self.scope.len() + self.key.len() + 16;
        match &self.finish {
            Finish::Complete {
                headers,
                body,
                puts,
                removals,
                ..
            } => {
                base + headers.len()
                    + body.len()
                    + puts
                        .iter()
                        .map(|p| p.key.len() + p.value.len() + 32)
                        .sum::<usize>()
                    + removals.iter().map(|(_, k)| k.len() + 16).sum::<usize>()
            }
            Finish::Release => base,
        }
    }
}

/// The completion and release statements' kind of batch.
pub(crate) struct Finishes;

impl Kind for Finishes {
    type Job = FinishJob;
    const WHAT: &'static str = "complete";

    fn conflicts(job: &FinishJob, out: &mut Vec<u64>) {
        out.push(row_hash(0, &job.scope, &job.key));
        if let Finish::Complete { puts, removals, .. } = &job.finish {
            out.extend(puts.iter().map(|p| row_hash(1, p.namespace, &p.key)));
            out.extend(removals.iter().map(|(ns, k)| row_hash(1, ns, k)));
        }
    }

    async fn attempt<'a>(
        inner: &'a Inner,
        client: &'a mut Object,
        jobs: &'a [&'a FinishJob],
    ) -> Result<Vec<Item<()>>, Fail> {
        if let [job] = jobs
            && let Finish::Complete {
                status,
                headers,
                body,
                puts,
                removals,
            } = &job.finish
            && removals.is_empty()
        {
            let applied = complete_one(inner, client, job, *status, headers, body, puts).await?;
            return Ok(vec![Item::Done(if applied {
                Ok(())
            } else {
                Err(job.lease_lost())
            })]);
        }
        let mut completes = Completes::default();
        let mut releases = Releases::default();
        for (i, job) in jobs.iter().enumerate() {
            let i = i as i32;
            match &job.finish {
                Finish::Complete {
                    status,
                    headers,
                    body,
                    puts,
                    removals,
                } => {
                    completes.add(i, job, *status, headers, body);
                    for p in puts {
                        completes.owners.push(i);
                        completes.ns.push(p.namespace);
                        completes.rkeys.push(&p.key);
                        completes.values.push(&p.value);
                        completes.after_ms.push(p.after_ms);
                        completes.at_ms.push(p.at_ms);
                    }
                    for (ns, k) in removals {
                        completes.del_owners.push(i);
                        completes.del_ns.push(ns);
                        completes.del_keys.push(k);
                    }
                }
                Finish::Release => releases.add(i, job),
            }
        }
        let (applied_completes, applied_releases) = if completes.del_owners.is_empty() {
            // Two independent statements, each its own transaction, sent in one flight.
            let client = &*client;
            tokio::try_join!(completes.run(inner, client), releases.run(inner, client))?
        } else {
            let released = releases.run(inner, client).await?;
            (completes.run_with_removals(inner, client).await?, released)
        };
        let mut applied = vec![false; jobs.len()];
        for i in applied_completes.into_iter().chain(applied_releases) {
            if let Some(slot) = usize::try_from(i).ok().and_then(|i| applied.get_mut(i)) {
                *slot = true;
            }
        }
        Ok(jobs
            .iter()
            .zip(applied)
            .map(|(job, applied)| {
                Item::Done(if applied {
                    Ok(())
                } else {
                    Err(job.lease_lost())
                })
            })
            .collect())
    }
}

/// One completion without removals, with scalar parameters (see `sql::Statements::complete_one`):
/// whether it applied.
async fn complete_one(
    inner: &Inner,
    client: &Object,
    job: &FinishJob,
    status: i32,
    headers: &[u8],
    body: &[u8],
    puts: &[Put],
) -> Result<bool, Fail> {
    let ns: Vec<&str> = puts.iter().map(|p| p.namespace).collect();
    let keys: Vec<&str> = puts.iter().map(|p| p.key.as_str()).collect();
    let values: Vec<&[u8]> = puts.iter().map(|p| &p.value[..]).collect();
    let after: Vec<Option<i64>> = puts.iter().map(|p| p.after_ms).collect();
    let at: Vec<Option<i64>> = puts.iter().map(|p| p.at_ms).collect();
    let row = inner
        .sql
        .complete_one
        .query_one(
            client,
            inner.pooling,
            &[
                &job.scope, &job.key, &job.fence, &status, &headers, &body, &ns, &keys, &values,
                &after, &at,
            ],
        )
        .await?;
    Ok(row.try_get::<_, i64>("done")? > 0)
}

/// The completion statement's arrays.
#[derive(Default)]
struct Completes<'a> {
    idx: Vec<i32>,
    scopes: Vec<&'a str>,
    keys: Vec<&'a str>,
    fences: Vec<i64>,
    statuses: Vec<i32>,
    headers: Vec<&'a [u8]>,
    bodies: Vec<&'a [u8]>,
    owners: Vec<i32>,
    ns: Vec<&'a str>,
    rkeys: Vec<&'a str>,
    values: Vec<&'a [u8]>,
    after_ms: Vec<Option<i64>>,
    at_ms: Vec<Option<i64>>,
    del_owners: Vec<i32>,
    del_ns: Vec<&'a str>,
    del_keys: Vec<&'a str>,
}

impl<'a> Completes<'a> {
    fn add(&mut self, i: i32, job: &'a FinishJob, status: i32, headers: &'a [u8], body: &'a [u8]) {
        self.idx.push(i);
        self.scopes.push(&job.scope);
        self.keys.push(&job.key);
        self.fences.push(job.fence);
        self.statuses.push(status);
        self.headers.push(headers);
        self.bodies.push(body);
    }

    fn params(&self) -> [&(dyn ToSql + Sync); 13] {
        [
            &self.idx,
            &self.scopes,
            &self.keys,
            &self.fences,
            &self.statuses,
            &self.headers,
            &self.bodies,
            &self.owners,
            &self.ns,
            &self.rkeys,
            &self.values,
            &self.after_ms,
            &self.at_ms,
        ]
    }

    /// The indices of the completions that applied.
    async fn run(&self, inner: &Inner, client: &Object) -> Result<Vec<i32>, Fail> {
        if self.idx.is_empty() {
            return Ok(Vec::new());
        }
        let rows = inner
            .sql
            .complete
            .query(client, inner.pooling, &self.params())
            .await?;
        applied(&rows)
    }

    /// [`Completes::run`] and the removals of the completions that applied, in one transaction.
    async fn run_with_removals(
        &self,
        inner: &Inner,
        client: &mut Object,
    ) -> Result<Vec<i32>, Fail> {
        // Dropped without a commit (an error, or the attempt's timeout), the transaction rolls
        // back: the connection never goes back to the pool inside one.
        let tx = client.transaction().await?;
        let rows = inner
            .sql
            .complete
            .query(&tx, inner.pooling, &self.params())
            .await?;
        let applied = applied(&rows)?;
        let (mut ns, mut keys) = (Vec::new(), Vec::new());
        for ((owner, n), k) in self.del_owners.iter().zip(&self.del_ns).zip(&self.del_keys) {
            if applied.contains(owner) {
                ns.push(*n);
                keys.push(*k);
            }
        }
        if !ns.is_empty() {
            inner
                .sql
                .delete_records
                .query(&tx, inner.pooling, &[&ns, &keys])
                .await?;
        }
        tx.commit().await?;
        Ok(applied)
    }
}

/// The release statement's arrays.
#[derive(Default)]
struct Releases<'a> {
    idx: Vec<i32>,
    scopes: Vec<&'a str>,
    keys: Vec<&'a str>,
    fences: Vec<i64>,
}

impl<'a> Releases<'a> {
    fn add(&mut self, i: i32, job: &'a FinishJob) {
        self.idx.push(i);
        self.scopes.push(&job.scope);
        self.keys.push(&job.key);
        self.fences.push(job.fence);
    }

    /// The indices of the releases that applied.
    async fn run(&self, inner: &Inner, client: &Object) -> Result<Vec<i32>, Fail> {
        if self.idx.is_empty() {
            return Ok(Vec::new());
        }
        let rows = inner
            .sql
            .release
            .query(
                client,
                inner.pooling,
                &[&self.idx, &self.scopes, &self.keys, &self.fences],
            )
            .await?;
        applied(&rows)
    }
}

fn applied(rows: &[tokio_postgres::Row]) -> Result<Vec<i32>, Fail> {
    rows.iter()
        .map(|row| row.try_get::<_, i32>("idx").map_err(Fail::from))
        .collect()
}
