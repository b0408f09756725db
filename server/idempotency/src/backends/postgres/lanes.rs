//! Natural batching: calls queue on a small fixed set of lanes, and each lane sends everything that
//! queued while its previous batch was in flight as one statement.
//!
//! A call is routed to a lane by a hash its job names ([`Job::route`]: the `(scope, key)` of an
//! idempotency key, the `(namespace, key)` of a record), so two calls about one key always meet
//! in one lane and are settled there in order, and two lanes never wait on each other's
//! uncommitted rows of one key. A lane takes the first queued call, then whatever else is queued
//! at that moment (up to [`MAX_BATCH_CALLS`] calls and [`MAX_BATCH_BYTES`] of parameters), and
//! hands the batch to its [`Runner`]. There is no timer: under light load a batch is one call and
//! waits for nothing; under load, the calls that arrive while a batch is in the database form the
//! next one, so the batch grows with the load and the statements per call fall.
//!
//! Bounds: a call waits in a lane's queue at most `queue_wait` (the pool's wait timeout): if its
//! lane has not taken it by then it is withdrawn (the lane skips it; nothing was sent) and fails
//! with [`StoreError::Unavailable`], as a call that finds no free pooled connection does. Once
//! taken it is answered by the lane, whose every statement attempt is bounded. The queue holds at
//! most one job per waiting caller: its memory is bounded by the callers.
//!
//! A lane task holds no reference to the store: it ends when the store (and so the lanes'
//! senders) is dropped, after answering what it had taken.

use std::future::Future;
use std::hash::{Hash, Hasher};
use std::sync::Arc;
use std::sync::atomic::{AtomicU8, Ordering};
use std::time::Duration;

use tokio::sync::{mpsc, oneshot};
use tokio::task::JoinHandle;

use crate::store::StoreError;

/// Most calls in one batch statement. PostgreSQL has no limit that a batch comes near: every
/// batch is a fixed number of array parameters (never one parameter per call, so the protocol's
/// 65 535-parameter limit does not apply), and an array or message may be up to 1 GiB. The bound
/// keeps one statement's latency, and what one failing statement makes its neighbours wait for,
/// small.
pub(crate) const MAX_BATCH_CALLS: usize = 512;

/// Most parameter bytes in one batch (response bodies, record values, digests). A single call
/// larger than this goes in a batch of its own.
pub(crate) const MAX_BATCH_BYTES: usize = 8 << 20;

/// One queued call.
pub(crate) trait Job: Send + 'static {
    /// What the caller gets back.
    type Answer: Send + 'static;
    /// The hash that picks the lane: equal for every call about one row.
    fn route(&self) -> u64;
    /// Parameter bytes the job adds to a batch (for [`MAX_BATCH_BYTES`]).
    fn weight(&self) -> usize;
}

/// Runs one batch: one answer per job, in order.
pub(crate) trait Runner<J: Job>: Send + Sync + 'static {
    fn run(&self, jobs: Vec<J>) -> impl Future<Output = Vec<Result<J::Answer, StoreError>>> + Send;
}

/// The hash of some parts, for [`Job::route`]: fixed keys, so equal parts route alike.
pub(crate) fn route_of(parts: &[&str]) -> u64 {
    let mut h = std::hash::DefaultHasher::new();
    for part in parts {
        part.hash(&mut h);
    }
    h.finish()
}

const WAITING: u8 = 0;
const TAKEN: u8 = 1;
const WITHDRAWN: u8 = 2;

struct Queued<J: Job> {
    job: J,
    reply: oneshot::Sender<Result<J::Answer, StoreError>>,
    /// [`WAITING`] until the lane takes the job ([`TAKEN`]) or its caller gives up ([`WITHDRAWN`]):
    /// exactly one of the two wins.
    state: Arc<AtomicU8>,
}

/// A fixed set of lanes for one kind of job.
pub(crate) struct Lanes<J: Job> {
    senders: Box<[mpsc::UnboundedSender<Queued<J>>]>,
    queue_wait: Duration,
    what: &'static str,
}

impl<J: Job> Lanes<J> {
    /// `count` lanes (at least one), each a task running its batches through `runner`. Calls name
    /// `what` in their errors.
    pub(crate) fn spawn<R: Runner<J>>(
        count: usize,
        runner: R,
        queue_wait: Duration,
        what: &'static str,
    ) -> (Self, Vec<JoinHandle<()>>) {
        let runner = Arc::new(runner);
        let mut senders = Vec::with_capacity(count.max(1));
        let mut tasks = Vec::with_capacity(count.max(1));
        for _ in 0..count.max(1) {
            let (tx, rx) = mpsc::unbounded_channel();
            senders.push(tx);
            tasks.push(tokio::spawn(lane(rx, runner.clone())));
        }
        (
            Self {
                senders: senders.into_boxed_slice(),
                queue_wait,
                what,
            },
            tasks,
        )
    }

    /// Queues `job` on its lane and waits for its answer (see the module docs for the bounds).
    pub(crate) async fn submit(&self, job: J) -> Result<J::Answer, StoreError> {
        let lane = (job.route() % self.senders.len() as u64) as usize;
        let (reply, mut answer) = oneshot::channel();
        let state = Arc::new(AtomicU8::new(WAITING));
        let queued = Queued {
            job,
            reply,
            state: state.clone(),
        };
        if self.senders[lane].send(queued).is_err() {
            return Err(self.closed());
        }
        match tokio::time::timeout(self.queue_wait, &mut answer).await {
            Ok(answer) => answer.unwrap_or_else(|_| Err(self.closed())),
            Err(_) => {
                if state
                    .compare_exchange(WAITING, WITHDRAWN, Ordering::AcqRel, Ordering::Acquire)
                    .is_ok()
                {
                    return Err(StoreError::Unavailable(format!(
                        "{}: not taken by a database writer within {} ms",
                        self.what,
                        self.queue_wait.as_millis()
                    )));
                }
                // Taken: it is in a statement now, which answers within its own bound.
                answer.await.unwrap_or_else(|_| Err(self.closed()))
            }
        }
    }

    fn closed(&self) -> StoreError {
        StoreError::Unavailable(format!("{}: the store is closed", self.what))
    }
}

/// One lane: batches until every sender is gone.
async fn lane<J: Job, R: Runner<J>>(mut rx: mpsc::UnboundedReceiver<Queued<J>>, runner: Arc<R>) {
    // A job taken from the queue that did not fit the previous batch's byte bound.
    let mut held: Option<Queued<J>> = None;
    loop {
        let mut batch: Vec<Queued<J>> = Vec::new();
        let mut bytes = 0usize;
        if let Some(first) = held.take() {
            bytes += first.job.weight();
            batch.push(first);
        } else {
            match rx.recv().await {
                Some(first) => {
                    if take(&first) {
                        bytes += first.job.weight();
                        batch.push(first);
                    }
                }
                None => return,
            }
        }
        while batch.len() < MAX_BATCH_CALLS {
            let Ok(next) = rx.try_recv() else { break };
            if !take(&next) {
                continue;
            }
            let weight = next.job.weight();
            if !batch.is_empty() && bytes.saturating_add(weight) > MAX_BATCH_BYTES {
                held = Some(next);
                break;
            }
            bytes = bytes.saturating_add(weight);
            batch.push(next);
        }
        if batch.is_empty() {
            continue;
        }
        let mut replies = Vec::with_capacity(batch.len());
        let mut jobs = Vec::with_capacity(batch.len());
        for queued in batch {
            replies.push(queued.reply);
            jobs.push(queued.job);
        }
        // The batch runs in a task of its own, so that a panic in it fails its own calls (with
        // an error, not a hang) and the lane goes on.
        let batch = tokio::spawn({
            let runner = runner.clone();
            async move { runner.run(jobs).await }
        });
        match batch.await {
            Ok(answers) => {
                debug_assert_eq!(answers.len(), replies.len(), "one answer per job");
                for (reply, answer) in replies.into_iter().zip(answers) {
                    // A caller that is gone (its request was dropped) does not need the answer.
                    let _ = reply.send(answer);
                }
            }
            Err(e) => {
                tracing::error!(error = %e, calls = replies.len(), "a database batch failed: its calls fail");
                for reply in replies {
                    let _ = reply.send(Err(StoreError::Internal(
                        "the database batch carrying this call failed".into(),
                    )));
                }
            }
        }
    }
}

/// Takes a queued job for a batch, unless its caller has withdrawn it.
fn take<J: Job>(queued: &Queued<J>) -> bool {
    queued
        .state
        .compare_exchange(WAITING, TAKEN, Ordering::AcqRel, Ordering::Acquire)
        .is_ok()
}

#[cfg(test)]
mod tests {
    use super::*;
    use parking_lot::Mutex;
    use tokio::sync::Notify;

    struct Echo {
        route: u64,
        weight: usize,
        value: u32,
    }

    impl Job for Echo {
        type Answer = u32;
        fn route(&self) -> u64 {
            self.route
        }
        fn weight(&self) -> usize {
            self.weight
        }
    }

    /// Records each batch's values; the first batch waits for `gate`.
    #[derive(Clone, Default)]
    struct Recorder {
        batches: Arc<Mutex<Vec<Vec<u32>>>>,
        gate: Arc<Notify>,
        gated: Arc<std::sync::atomic::AtomicBool>,
    }

    impl Runner<Echo> for Recorder {
        async fn run(&self, jobs: Vec<Echo>) -> Vec<Result<u32, StoreError>> {
            if self.gated.swap(false, Ordering::AcqRel) {
                self.gate.notified().await;
            }
            self.batches
                .lock()
                .push(jobs.iter().map(|j| j.value).collect());
            jobs.iter().map(|j| Ok(j.value * 10)).collect()
        }
    }

    fn echo(value: u32, weight: usize) -> Echo {
        Echo {
            route: 7,
            weight,
            value,
        }
    }

    #[tokio::test]
    async fn a_lone_call_is_a_batch_of_one_and_gets_its_own_answer() {
        let recorder = Recorder::default();
        let (lanes, _tasks) =
            Lanes::spawn(2, recorder.clone(), Duration::from_secs(5), "test call");
        assert_eq!(lanes.submit(echo(4, 1)).await.unwrap(), 40);
        assert_eq!(*recorder.batches.lock(), vec![vec![4]]);
    }

    #[tokio::test]
    async fn calls_queued_while_a_batch_is_in_flight_form_the_next_batch() {
        let recorder = Recorder::default();
        recorder.gated.store(true, Ordering::Release);
        let (lanes, _tasks) =
            Lanes::spawn(1, recorder.clone(), Duration::from_secs(5), "test call");
        let lanes = Arc::new(lanes);
        let first = tokio::spawn({
            let lanes = lanes.clone();
            async move { lanes.submit(echo(1, 1)).await }
        });
        // The first batch is in flight (held at the gate) while three more calls queue.
        tokio::task::yield_now().await;
        while recorder.gated.load(Ordering::Acquire) {
            tokio::task::yield_now().await;
        }
        let rest: Vec<_> = (2..=4)
            .map(|v| {
                let lanes = lanes.clone();
                tokio::spawn(async move { lanes.submit(echo(v, 1)).await })
            })
            .collect();
        for _ in 0..10 {
            tokio::task::yield_now().await;
        }
        recorder.gate.notify_one();
        assert_eq!(first.await.unwrap().unwrap(), 10);
        for (v, task) in (2..=4).zip(rest) {
            assert_eq!(task.await.unwrap().unwrap(), v * 10);
        }
        assert_eq!(*recorder.batches.lock(), vec![vec![1], vec![2, 3, 4]]);
    }

    #[tokio::test]
    async fn a_batch_stops_at_the_byte_bound_and_the_rest_goes_next() {
        let recorder = Recorder::default();
        recorder.gated.store(true, Ordering::Release);
        let (lanes, _tasks) =
            Lanes::spawn(1, recorder.clone(), Duration::from_secs(5), "test call");
        let lanes = Arc::new(lanes);
        let first = tokio::spawn({
            let lanes = lanes.clone();
            async move { lanes.submit(echo(1, 1)).await }
        });
        while recorder.gated.load(Ordering::Acquire) {
            tokio::task::yield_now().await;
        }
        let half = MAX_BATCH_BYTES / 2;
        let rest: Vec<_> = [(2, half), (3, half), (4, half), (5, MAX_BATCH_BYTES * 2)]
            .into_iter()
            .map(|(v, w)| {
                let lanes = lanes.clone();
                let task = tokio::spawn(async move { lanes.submit(echo(v, w)).await });
                (v, task)
            })
            .collect();
        for _ in 0..10 {
            tokio::task::yield_now().await;
        }
        recorder.gate.notify_one();
        first.await.unwrap().unwrap();
        for (v, task) in rest {
            assert_eq!(task.await.unwrap().unwrap(), v * 10);
        }
        // Two halves fill a batch; an oversized call goes alone.
        assert_eq!(
            *recorder.batches.lock(),
            vec![vec![1], vec![2, 3], vec![4], vec![5]]
        );
    }

    #[tokio::test]
    async fn a_call_not_taken_within_the_queue_wait_is_withdrawn_and_never_run() {
        let recorder = Recorder::default();
        recorder.gated.store(true, Ordering::Release);
        let (lanes, _tasks) =
            Lanes::spawn(1, recorder.clone(), Duration::from_millis(50), "test call");
        let lanes = Arc::new(lanes);
        // The first call is taken at once, then held at the gate past its queue wait: it is
        // still answered.
        let first = tokio::spawn({
            let lanes = lanes.clone();
            async move { lanes.submit(echo(1, 1)).await }
        });
        while recorder.gated.load(Ordering::Acquire) {
            tokio::task::yield_now().await;
        }
        let err = lanes.submit(echo(2, 1)).await.unwrap_err();
        assert!(
            matches!(&err, StoreError::Unavailable(m) if m.contains("test call") && m.contains("50 ms")),
            "{err:?}"
        );
        recorder.gate.notify_one();
        assert_eq!(first.await.unwrap().unwrap(), 10);
        // The withdrawn call was skipped: the next batch holds only the next call.
        assert_eq!(lanes.submit(echo(3, 1)).await.unwrap(), 30);
        assert_eq!(*recorder.batches.lock(), vec![vec![1], vec![3]]);
    }

    struct Panicky;

    impl Runner<Echo> for Panicky {
        async fn run(&self, jobs: Vec<Echo>) -> Vec<Result<u32, StoreError>> {
            assert!(jobs.iter().all(|j| j.value != 13), "a bug in a batch");
            jobs.iter().map(|j| Ok(j.value)).collect()
        }
    }

    #[tokio::test]
    async fn a_batch_that_panics_fails_its_calls_and_the_lane_goes_on() {
        let (lanes, _tasks) = Lanes::spawn(1, Panicky, Duration::from_secs(5), "test call");
        let err = lanes.submit(echo(13, 1)).await.unwrap_err();
        assert!(matches!(err, StoreError::Internal(_)), "{err:?}");
        assert_eq!(lanes.submit(echo(14, 1)).await.unwrap(), 14);
    }

    #[tokio::test]
    async fn calls_about_one_row_always_meet_in_one_lane() {
        let a = route_of(&["acct", "key-1"]);
        assert_eq!(a, route_of(&["acct", "key-1"]));
        // The parts are hashed with their boundaries: moving text across them changes the route.
        assert_ne!(route_of(&["acct", "k"]), route_of(&["acctk", ""]));
    }
}
