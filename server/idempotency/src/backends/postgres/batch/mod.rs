//! Running one lane's batch ([`super::lanes`]) against the database: the calls of a batch become
//! one statement per round, with the same answers each call would get alone.
//!
//! - **Rounds.** Two calls of one batch that touch one row (two claims of a key, two completions
//!   writing one record: [`Kind::conflicts`]) are never in one statement: an `ON CONFLICT DO
//!   UPDATE` may not touch a row twice, and the second call must see what the first did. The
//!   first call of each row goes in the first round, the next in the second, and so on; the
//!   rounds run one after the other, each committed before the next starts. Copies are rare
//!   (retries of one request), so nearly every batch is one round.
//! - **Calls that need another look.** A call whose row changed between the statement's snapshot
//!   and its write ([`Item::Stale`]) runs again in a later statement, at most
//!   [`MAX_ATTEMPTS`] times in all, like a lone call.
//! - **Failures.** A statement that fails with a serialization failure, a deadlock or a tripped
//!   guard runs again whole (bounded, with jitter). A connection, pool or timeout failure is
//!   every call's answer (the database is down or busy for all of them). Any other database
//!   error may come from one call's input, which validation should have refused: the batch is
//!   split in halves and each half run again, down to single calls, so only the call at fault
//!   gets the error and its neighbours are answered.

pub(crate) mod claims;
#[cfg(test)]
mod db_tests;
pub(crate) mod finish;
pub(crate) mod inserts;

use std::collections::HashSet;
use std::future::Future;
use std::marker::PhantomData;
use std::pin::Pin;
use std::sync::Weak;
use std::time::Instant;

use deadpool_postgres::Object;

use super::error::{Class, Fail, MAX_ATTEMPTS, classify, jitter, retries, settle};
use super::lanes::{Job, Runner};
use super::store::Inner;
use super::url;
use crate::store::StoreError;

/// One call's outcome in one statement.
pub(crate) enum Item<T> {
    /// Its final answer.
    Done(Result<T, StoreError>),
    /// Its row changed between the statement's snapshot and its write: run it again.
    Stale,
    /// This statement is not the one that settles it (a fast path that leaves the call to the
    /// kind's general statement): run it again at once, in the next pass.
    Next,
}

/// One kind of batched call: its statement and how rounds are formed.
pub(crate) trait Kind: Send + Sync + 'static {
    /// The queued call.
    type Job: Job + Sync;
    /// The statement's label in metrics and errors (`claim`, `complete`, `insert_once`).
    const WHAT: &'static str;
    /// Pushes a hash of every row the job writes or must see written (see the module docs).
    fn conflicts(job: &Self::Job, out: &mut Vec<u64>);
    /// One attempt: the statement(s) for `jobs` on `client`, one item per job, in order.
    fn attempt<'a>(
        inner: &'a Inner,
        client: &'a mut Object,
        jobs: &'a [&'a Self::Job],
    ) -> impl Future<Output = Result<Vec<Item<<Self::Job as Job>::Answer>>, Fail>> + Send + 'a;
}

type Answer<K> = <<K as Kind>::Job as Job>::Answer;

/// The [`Runner`] of a lane of kind `K`: it holds the store weakly, so lanes never keep it alive.
pub(crate) struct BatchRunner<K> {
    inner: Weak<Inner>,
    kind: PhantomData<fn() -> K>,
}

impl<K> BatchRunner<K> {
    pub(crate) fn new(inner: Weak<Inner>) -> Self {
        Self {
            inner,
            kind: PhantomData,
        }
    }
}

impl<K: Kind> Runner<K::Job> for BatchRunner<K> {
    async fn run(&self, jobs: Vec<K::Job>) -> Vec<Result<Answer<K>, StoreError>> {
        match self.inner.upgrade() {
            Some(inner) => run_batch::<K>(&inner, &jobs).await,
            None => jobs
                .iter()
                .map(|_| {
                    Err(StoreError::Unavailable(format!(
                        "{}: the store is closed",
                        K::WHAT
                    )))
                })
                .collect(),
        }
    }
}

/// Every job's answer, in order.
pub(crate) async fn run_batch<K: Kind>(
    inner: &Inner,
    jobs: &[K::Job],
) -> Vec<Result<Answer<K>, StoreError>> {
    let mut answers: Vec<Option<Result<Answer<K>, StoreError>>> =
        jobs.iter().map(|_| None).collect();
    let mut pending: Vec<usize> = (0..jobs.len()).collect();
    let mut attempt = 1;
    // Every pass settles or moves on at least one call (a call goes to the next statement at
    // most once per kind), and stale passes are bounded: the loop ends.
    while !pending.is_empty() && attempt <= MAX_ATTEMPTS {
        let (mut stale, mut next) = (Vec::new(), Vec::new());
        for round in rounds::<K>(jobs, &pending) {
            let items = run_round::<K>(inner, jobs, &round).await;
            for (&i, item) in round.iter().zip(items) {
                match item {
                    Item::Done(answer) => answers[i] = Some(answer),
                    Item::Stale => stale.push(i),
                    Item::Next => next.push(i),
                }
            }
        }
        if !stale.is_empty() {
            attempt += 1;
            if attempt <= MAX_ATTEMPTS {
                tokio::time::sleep(jitter(std::time::Duration::from_millis(2), attempt)).await;
            }
        }
        pending = stale;
        pending.append(&mut next);
        pending.sort_unstable();
    }
    answers
        .into_iter()
        .map(|answer| {
            answer.unwrap_or_else(|| {
                Err(StoreError::Unavailable(format!(
                    "{}: the key kept changing under concurrent calls ({MAX_ATTEMPTS} attempts)",
                    K::WHAT
                )))
            })
        })
        .collect()
}

/// `pending` (indices into `jobs`, ascending) in rounds: no two jobs of a round touch one row,
/// and jobs touching one row keep their order across rounds.
pub(crate) fn rounds<K: Kind>(jobs: &[K::Job], pending: &[usize]) -> Vec<Vec<usize>> {
    let mut rounds = Vec::new();
    let mut rest = pending.to_vec();
    let mut keys = Vec::new();
    while !rest.is_empty() {
        let mut seen = HashSet::with_capacity(rest.len());
        let mut round = Vec::with_capacity(rest.len());
        let mut later = Vec::new();
        for i in rest {
            keys.clear();
            K::conflicts(&jobs[i], &mut keys);
            // A job that waits also holds its rows for this round, so that a later job about one
            // of them does not overtake it.
            let clash = keys.iter().any(|k| seen.contains(k));
            seen.extend(keys.iter().copied());
            if clash {
                later.push(i);
            } else {
                round.push(i);
            }
        }
        rounds.push(round);
        rest = later;
    }
    rounds
}

type RoundFuture<'a, T> = Pin<Box<dyn Future<Output = Vec<Item<T>>> + Send + 'a>>;

/// One round's statement, run again when it fails as a whole for a transient reason, and split
/// when it fails in a way one call's input could cause.
fn run_round<'a, K: Kind>(
    inner: &'a Inner,
    jobs: &'a [K::Job],
    round: &'a [usize],
) -> RoundFuture<'a, Answer<K>> {
    Box::pin(async move {
        let refs: Vec<&K::Job> = round.iter().map(|&i| &jobs[i]).collect();
        let mut tries = 0;
        loop {
            tries += 1;
            inner.batch_sizes.observe(K::WHAT, refs.len());
            let result = tokio::time::timeout(inner.attempt_timeout, async {
                let mut client = inner.pool.get().await.map_err(Fail::Pool)?;
                let started = Instant::now();
                let result = K::attempt(inner, &mut client, &refs).await;
                inner.latency.observe(K::WHAT, started.elapsed());
                result
            })
            .await
            .unwrap_or(Err(Fail::TimedOut));
            if retries(&result) && tries < MAX_ATTEMPTS {
                tokio::time::sleep(jitter(std::time::Duration::from_millis(2), tries)).await;
                continue;
            }
            if round.len() > 1
                && let Err(Fail::Db(e)) = &result
                && classify(e) == Class::Internal
            {
                tracing::debug!(
                    statement = K::WHAT,
                    calls = round.len(),
                    error = %super::error::describe(e),
                    "a batch statement failed: running its halves apart"
                );
                let (a, b) = round.split_at(round.len() / 2);
                let mut items = run_round::<K>(inner, jobs, a).await;
                items.extend(run_round::<K>(inner, jobs, b).await);
                return items;
            }
            return match settle(K::WHAT, result, &inner.state, inner.pool_wait, |s| {
                url::scrub(&s, inner.password.as_deref())
            }) {
                Ok(items) => items,
                Err(e) => round.iter().map(|_| Item::Done(Err(e.clone()))).collect(),
            };
        }
    })
}

/// A hash of a row's identity, for [`Kind::conflicts`]: `tag` names the table.
pub(crate) fn row_hash(tag: u8, a: &str, b: &str) -> u64 {
    use std::hash::{Hash, Hasher};
    let mut h = std::hash::DefaultHasher::new();
    tag.hash(&mut h);
    a.hash(&mut h);
    b.hash(&mut h);
    h.finish()
}

#[cfg(test)]
mod tests {
    use super::*;

    struct Rows(Vec<u64>);

    impl Job for Rows {
        type Answer = ();
        fn route(&self) -> u64 {
            0
        }
        fn weight(&self) -> usize {
            0
        }
    }

    struct ByRows;

    impl Kind for ByRows {
        type Job = Rows;
        const WHAT: &'static str = "test";
        fn conflicts(job: &Rows, out: &mut Vec<u64>) {
            out.extend(&job.0);
        }
        #[allow(clippy::manual_async_fn)]
        fn attempt<'a>(
            _inner: &'a Inner,
            _client: &'a mut Object,
            _jobs: &'a [&'a Rows],
        ) -> impl Future<Output = Result<Vec<Item<()>>, Fail>> + Send + 'a {
            async { Ok(Vec::new()) }
        }
    }

    fn rounds_of(jobs: &[&[u64]]) -> Vec<Vec<usize>> {
        let jobs: Vec<Rows> = jobs.iter().map(|r| Rows(r.to_vec())).collect();
        let pending: Vec<usize> = (0..jobs.len()).collect();
        rounds::<ByRows>(&jobs, &pending)
    }

    #[test]
    fn calls_on_different_rows_share_one_round() {
        assert_eq!(rounds_of(&[&[1], &[2], &[3]]), vec![vec![0, 1, 2]]);
    }

    #[test]
    fn copies_of_one_row_go_in_successive_rounds_in_their_order() {
        assert_eq!(
            rounds_of(&[&[1], &[2], &[1], &[1], &[3]]),
            vec![vec![0, 1, 4], vec![2], vec![3]]
        );
    }

    #[test]
    fn a_call_never_overtakes_a_waiting_call_on_a_row_they_share() {
        // Job 1 waits for job 0 (row 1); job 2 shares row 2 with job 1, so it waits too.
        assert_eq!(
            rounds_of(&[&[1], &[1, 2], &[2], &[3]]),
            vec![vec![0, 3], vec![1], vec![2]]
        );
    }

    #[test]
    fn row_hashes_keep_the_parts_apart() {
        assert_ne!(row_hash(0, "a", "bc"), row_hash(0, "ab", "c"));
        assert_ne!(row_hash(0, "a", "b"), row_hash(1, "a", "b"));
        assert_eq!(row_hash(2, "a", "b"), row_hash(2, "a", "b"));
    }
}
