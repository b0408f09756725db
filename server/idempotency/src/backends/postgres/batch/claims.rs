//! Batched claims: one statement claims every new key of a batch (`sql::Statements::claim_new`:
//! two inserts, the common case), and one more (`sql::Statements::claim`) settles the calls it
//! left: keys that have a row, scopes at their limit. Each call is answered as a lone claim would
//! be: acquired, in progress, completed, mismatch or over the scope's quota.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use bytes::Bytes;
use deadpool_postgres::Object;
use tokio_postgres::Row;

use super::{Item, Kind, row_hash};
use crate::backends::postgres::codec::response_from;
use crate::backends::postgres::error::Fail;
use crate::backends::postgres::lanes::{Job, route_of};
use crate::backends::postgres::sql::{COMPLETED, IN_PROGRESS};
use crate::backends::postgres::store::Inner;
use crate::store::{Claim, HeldClaim, StoreError, Takeover};

/// One claim, with its input checked and its digest computed.
pub(crate) struct ClaimJob {
    pub(crate) scope: String,
    pub(crate) key: String,
    pub(crate) fingerprint: [u8; 32],
    pub(crate) ttl_ms: i64,
    pub(crate) digest: Option<Bytes>,
    /// Most live keys of the scope; 0: no limit.
    pub(crate) max_live: i64,
    /// Set once the fast statement has left this call to the general one.
    general: AtomicBool,
}

impl ClaimJob {
    /// A claim of `(scope, key)`; `max_live` 0 means no limit.
    pub(crate) fn new(
        scope: String,
        key: String,
        fingerprint: [u8; 32],
        ttl_ms: i64,
        digest: Option<Bytes>,
        max_live: i64,
    ) -> Self {
        Self {
            scope,
            key,
            fingerprint,
            ttl_ms,
            digest,
            max_live,
            general: AtomicBool::new(false),
        }
    }

    fn leave_to_general(&self) {
        self.general.store(true, Ordering::Relaxed);
    }
}

impl Job for ClaimJob {
    type Answer = Claim;

    fn route(&self) -> u64 {
        route_of(&[&self.scope, &self.key])
    }

    fn weight(&self) -> usize {
        self.scope.len() + self.key.len() + 64 + self.digest.as_ref().map_or(0, Bytes::len)
    }
}

/// The claim statement's kind of batch.
pub(crate) struct Claims;

impl Kind for Claims {
    type Job = ClaimJob;
    const WHAT: &'static str = "claim";

    fn conflicts(job: &ClaimJob, out: &mut Vec<u64>) {
        out.push(row_hash(0, &job.scope, &job.key));
    }

    async fn attempt<'a>(
        inner: &'a Inner,
        client: &'a mut Object,
        jobs: &'a [&'a ClaimJob],
    ) -> Result<Vec<Item<Claim>>, Fail> {
        // One statement per attempt, so that what it committed is final: the fast statement for
        // the calls that have not been through it, or else the general one.
        let fast_limit = jobs
            .iter()
            .find(|j| !j.general.load(Ordering::Relaxed))
            .map(|j| j.max_live);
        match fast_limit {
            Some(limit) => claim_new(inner, client, jobs, limit).await,
            None => claim(inner, client, jobs).await,
        }
    }
}

/// The fast statement for the calls not yet through it whose scope limit is `limit` (one value
/// per statement); every other call, and every call it does not insert, goes on to the general
/// statement.
async fn claim_new(
    inner: &Inner,
    client: &Object,
    jobs: &[&ClaimJob],
    limit: i64,
) -> Result<Vec<Item<Claim>>, Fail> {
    let chosen: Vec<usize> = (0..jobs.len())
        .filter(|&i| !jobs[i].general.load(Ordering::Relaxed) && jobs[i].max_live == limit)
        .collect();
    if let [only] = chosen[..] {
        return claim_one(inner, client, jobs, only).await;
    }
    let chosen_jobs = || chosen.iter().map(|&i| jobs[i]);
    let idx: Vec<i32> = (0..chosen.len() as i32).collect();
    let scopes: Vec<&str> = chosen_jobs().map(|j| j.scope.as_str()).collect();
    let keys: Vec<&str> = chosen_jobs().map(|j| j.key.as_str()).collect();
    let fps: Vec<&[u8]> = chosen_jobs().map(|j| &j.fingerprint[..]).collect();
    let ttls: Vec<i64> = chosen_jobs().map(|j| j.ttl_ms).collect();
    let digests: Vec<Option<&[u8]>> = chosen_jobs().map(|j| j.digest.as_deref()).collect();
    let rows = inner
        .sql
        .claim_new
        .query(
            client,
            inner.pooling,
            &[
                &idx,
                &scopes,
                &keys,
                &fps,
                &ttls,
                &digests,
                &limit,
                &inner.lease_ms,
            ],
        )
        .await;
    let mut items: Vec<Item<Claim>> = jobs
        .iter()
        .map(|j| {
            j.leave_to_general();
            Item::Next
        })
        .collect();
    let rows = match rows {
        Ok(rows) => rows,
        // A scope would pass its limit: nothing was inserted, and the general statement admits
        // what fits.
        Err(e) if is_guard(&e) => return Ok(items),
        Err(e) => return Err(Fail::Db(e)),
    };
    let by_key: HashMap<(&str, &str), usize> = chosen
        .iter()
        .map(|&i| ((jobs[i].scope.as_str(), jobs[i].key.as_str()), i))
        .collect();
    for row in &rows {
        let (scope, key): (&str, &str) = (row.try_get("scope")?, row.try_get("key")?);
        let i = *by_key.get(&(scope, key)).ok_or_else(|| {
            Fail::Store(StoreError::Internal(
                "the claim statement inserted a key it was not given".into(),
            ))
        })?;
        let fence: i64 = row.try_get("fence")?;
        let expires_ms: i64 = row.try_get("expires_ms")?;
        items[i] = Item::Done(Ok(Claim::Acquired(HeldClaim {
            scope: jobs[i].scope.clone(),
            key: jobs[i].key.clone(),
            fence: fence as u64,
            takeover: None,
            expires_at_ms: expires_ms.max(0) as u64,
            handle: None,
        })));
    }
    Ok(items)
}

/// [`claim_new`] for one call (`jobs[only]`): the same statement with scalar parameters.
async fn claim_one(
    inner: &Inner,
    client: &Object,
    jobs: &[&ClaimJob],
    only: usize,
) -> Result<Vec<Item<Claim>>, Fail> {
    let job = jobs[only];
    let row = inner
        .sql
        .claim_one
        .query_one(
            client,
            inner.pooling,
            &[
                &job.scope,
                &job.key,
                &&job.fingerprint[..],
                &job.ttl_ms,
                &inner.lease_ms,
                &job.digest.as_deref(),
                &job.max_live,
            ],
        )
        .await;
    let mut items: Vec<Item<Claim>> = jobs
        .iter()
        .map(|j| {
            j.leave_to_general();
            Item::Next
        })
        .collect();
    let row = match row {
        Ok(row) => row,
        Err(Fail::Db(e)) if is_guard(&e) => return Ok(items),
        Err(e) => return Err(e),
    };
    if let (Some(fence), Some(expires_ms)) = (
        row.try_get::<_, Option<i64>>("fence")?,
        row.try_get::<_, Option<i64>>("expires_ms")?,
    ) {
        items[only] = Item::Done(Ok(Claim::Acquired(HeldClaim {
            scope: job.scope.clone(),
            key: job.key.clone(),
            fence: fence as u64,
            takeover: None,
            expires_at_ms: expires_ms.max(0) as u64,
            handle: None,
        })));
    }
    Ok(items)
}

/// The general statement: every case, for calls the fast one left.
async fn claim(
    inner: &Inner,
    client: &Object,
    jobs: &[&ClaimJob],
) -> Result<Vec<Item<Claim>>, Fail> {
    let n = jobs.len();
    let idx: Vec<i32> = (0..n as i32).collect();
    let scopes: Vec<&str> = jobs.iter().map(|j| j.scope.as_str()).collect();
    let keys: Vec<&str> = jobs.iter().map(|j| j.key.as_str()).collect();
    let fps: Vec<&[u8]> = jobs.iter().map(|j| &j.fingerprint[..]).collect();
    let ttls: Vec<i64> = jobs.iter().map(|j| j.ttl_ms).collect();
    let digests: Vec<Option<&[u8]>> = jobs.iter().map(|j| j.digest.as_deref()).collect();
    let max_live: Vec<i64> = jobs.iter().map(|j| j.max_live).collect();
    let rows = inner
        .sql
        .claim
        .query(
            client,
            inner.pooling,
            &[
                &idx,
                &scopes,
                &keys,
                &fps,
                &ttls,
                &digests,
                &max_live,
                &inner.lease_ms,
            ],
        )
        .await
        .map_err(stale_on_guard)?;
    let mut items: Vec<Option<Item<Claim>>> = (0..n).map(|_| None).collect();
    for row in &rows {
        let i = usize::try_from(row.try_get::<_, i32>("idx")?)
            .ok()
            .filter(|&i| i < n)
            .ok_or_else(|| {
                Fail::Store(StoreError::Internal(
                    "the claim statement answered for a call it was not given".into(),
                ))
            })?;
        items[i] = Some(outcome(row, jobs[i])?);
    }
    // Every call gets a row; one without is treated as having raced, and looked at again.
    Ok(items
        .into_iter()
        .map(|item| item.unwrap_or(Item::Stale))
        .collect())
}

fn is_guard(e: &tokio_postgres::Error) -> bool {
    e.code() == Some(&tokio_postgres::error::SqlState::DIVISION_BY_ZERO)
}

/// The claim statement's guard divides by zero when its count and its inserts disagree (see
/// `sql`): the statement rolled back, and running it again resolves it.
fn stale_on_guard(e: tokio_postgres::Error) -> Fail {
    if is_guard(&e) {
        Fail::Stale
    } else {
        Fail::Db(e)
    }
}

/// What one answer row of the claim statement says.
fn outcome(row: &Row, job: &ClaimJob) -> Result<Item<Claim>, Fail> {
    if row.try_get::<_, bool>("stale")? {
        return Ok(Item::Stale);
    }
    if row.try_get::<_, bool>("quota_full")? {
        let wait = row
            .try_get::<_, Option<i64>>("next_expiry_ms")?
            .unwrap_or(1000);
        return Ok(Item::Done(Ok(Claim::QuotaExceeded {
            retry_after: Duration::from_millis(wait.max(1) as u64),
        })));
    }
    let Some(fence) = row.try_get::<_, Option<i64>>("fence")? else {
        // Neither claimed, nor found, nor refused: the key changed under the statement.
        return Ok(Item::Stale);
    };
    let expires_ms: i64 = row.try_get::<_, Option<i64>>("expires_ms")?.unwrap_or(0);
    if row.try_get::<_, bool>("acquired")? {
        let takeover = match row.try_get::<_, Option<i16>>("takeover")? {
            Some(1) => Some(Takeover::Expired),
            Some(2) => Some(Takeover::LeaseExpired),
            _ => None,
        };
        return Ok(Item::Done(Ok(Claim::Acquired(HeldClaim {
            scope: job.scope.clone(),
            key: job.key.clone(),
            fence: fence as u64,
            takeover,
            expires_at_ms: expires_ms.max(0) as u64,
            handle: None,
        }))));
    }
    if row.try_get::<_, Option<bool>>("same_fp")? != Some(true) {
        let digest: Option<Vec<u8>> = row.try_get("request_digest")?;
        return Ok(Item::Done(Ok(Claim::Mismatch {
            request_digest: digest.map(Bytes::from),
        })));
    }
    let answer = match row.try_get::<_, Option<i16>>("state")? {
        Some(IN_PROGRESS) => Ok(Claim::InProgress {
            lease_left: Duration::from_millis(
                row.try_get::<_, Option<i64>>("lease_left_ms")?
                    .unwrap_or(0)
                    .max(0) as u64,
            ),
        }),
        Some(COMPLETED) => response_from(
            row.try_get("status")?,
            row.try_get("headers")?,
            row.try_get("body")?,
        )
        .map(Claim::Completed),
        other => Err(StoreError::Internal(format!(
            "key in unknown state {other:?}"
        ))),
    };
    Ok(Item::Done(answer))
}
