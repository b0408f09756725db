//! Natural batching: calls queue on a small fixed set of lanes, and each lane sends everything that
//! queued while its previous batch was in flight as one statement.
//!
//! A call is routed to a lane by a hash its job names ([`Job::route`]: the `(scope, key)` of an
//! idempotency key, the `(namespace, key)` of a record), so two calls about one key always meet
//! in one lane and are settled there in order, and two lanes never wait on each other's
//! uncommitted rows of one key. There is no timer:
//!
//! - A call that finds its lane idle takes the lane. If the lane's last batch carried more than
//!   one call, it first lets the scheduler turn once: under load calls travel in convoys (one
//!   batch's answers wake its callers together, and they reach their next lane microseconds
//!   apart), so the rest of a convoy queues behind it and a drainer sends them all in one
//!   statement. (Without the turn, the head of every convoy cost a statement and a commit of its
//!   own: 40–50 % of all statements at 64 connections.) A call still alone runs as a batch of
//!   one, on the caller's own task, and the lane is busy until it ends; the next call that finds
//!   the lane idle then does not wait. Under light load every call goes this way: no hand-off to
//!   another task, no wait, and no turn of the scheduler (which costs a poll of the I/O driver).
//! - A call that finds the lane busy queues. When the batch in flight ends, a drainer task takes
//!   everything queued at that moment (up to [`MAX_BATCH_CALLS`] calls and [`MAX_BATCH_BYTES`]
//!   of parameters) as the next batch, and so on until the queue is empty; then the lane is idle
//!   again. Under load the calls that arrive while a batch is in the database form the next one,
//!   so the batch grows with the load and the statements per call fall.
//!
//! Bounds: a call waits in a lane's queue at most `queue_wait` (the pool's wait timeout): if its
//! lane has not taken it by then it is withdrawn (the lane skips it; nothing was sent) and fails
//! with [`StoreError::Unavailable`], as a call that finds no free pooled connection does. Once
//! taken it is answered by the lane, whose every statement attempt is bounded. The queue holds at
//! most one job per waiting caller: its memory is bounded by the callers.
//!
//! Invariant: a lane with queued calls is busy (a batch is in flight, on a caller's task or the
//! drainer's), so a queued call is always taken. A batch that panics fails its own calls with an
//! error; a caller that leads a batch and is dropped mid-way hands the lane on, like one that
//! finishes. The drainer holds the lanes only while there is work: it ends when the queue is
//! empty, so the lanes never keep the store alive for long.

use std::collections::VecDeque;
use std::future::Future;
use std::hash::{Hash, Hasher};
use std::sync::Arc;
use std::sync::atomic::{AtomicU8, Ordering};
use std::time::Duration;

use parking_lot::Mutex;
use tokio::sync::oneshot;

use crate::layer::catch_panic::CatchPanic;
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
    /// [`WAITING`] until a batch takes the job ([`TAKEN`]) or its caller gives up ([`WITHDRAWN`]):
    /// exactly one of the two wins.
    state: Arc<AtomicU8>,
}

/// One lane: whether a batch is in flight, and the calls waiting for the next one.
struct Lane<J: Job> {
    state: Mutex<LaneState<J>>,
}

struct LaneState<J: Job> {
    busy: bool,
    queue: VecDeque<Queued<J>>,
    /// Whether calls have lately come in company: the lane's last batch carried more than one
    /// call (true at first). Only then does a call that finds the lane idle wait a turn of the
    /// scheduler for the rest of its convoy; a call that ran alone clears it, so under light load
    /// calls do not pay for the turn.
    company: bool,
}

/// A fixed set of lanes for one kind of job.
pub(crate) struct Lanes<J: Job, R> {
    lanes: Box<[Arc<Lane<J>>]>,
    runner: Arc<R>,
    queue_wait: Duration,
    what: &'static str,
}

impl<J: Job, R: Runner<J>> Lanes<J, R> {
    /// `count` lanes (at least one) running their batches through `runner`. Calls name `what`
    /// in their errors.
    pub(crate) fn new(count: usize, runner: R, queue_wait: Duration, what: &'static str) -> Self {
        let lanes = (0..count.max(1))
            .map(|_| {
                Arc::new(Lane {
                    state: Mutex::new(LaneState {
                        busy: false,
                        queue: VecDeque::new(),
                        company: true,
                    }),
                })
            })
            .collect();
        Self {
            lanes,
            runner: Arc::new(runner),
            queue_wait,
            what,
        }
    }

    /// Runs `job` in a batch of its lane and returns its answer (see the module docs).
    pub(crate) async fn submit(&self, job: J) -> Result<J::Answer, StoreError> {
        let lane = &self.lanes[(job.route() % self.lanes.len() as u64) as usize];
        let (reply, answer) = oneshot::channel();
        let state = Arc::new(AtomicU8::new(WAITING));
        let queued = Queued {
            job,
            reply,
            state: state.clone(),
        };
        // Queue behind the batch in flight, or take the idle lane; never held across an await.
        let lead = {
            let mut lane_state = lane.state.lock();
            if lane_state.busy {
                lane_state.queue.push_back(queued);
                None
            } else {
                lane_state.busy = true;
                Some((queued, lane_state.company))
            }
        };
        let Some((queued, expect_company)) = lead else {
            return self.wait(answer, &state).await;
        };
        // The lane was idle: wait one turn for the rest of a convoy if calls came in company
        // lately (module docs); a call still alone is the batch, on this task.
        let leader = Leader {
            lane: lane.clone(),
            runner: self.runner.clone(),
        };
        if expect_company {
            tokio::task::yield_now().await;
        }
        let alone = {
            let mut lane_state = lane.state.lock();
            if lane_state.queue.is_empty() {
                lane_state.company = false;
                Some(queued.job)
            } else {
                lane_state.queue.push_front(queued);
                None
            }
        };
        let Some(job) = alone else {
            // Company came: the leader hands the lane to a drainer, which takes this call first.
            drop(leader);
            return self.wait(answer, &state).await;
        };
        let answers = run_caught(&*self.runner, vec![job], self.what).await;
        drop(leader);
        answers
            .into_iter()
            .next()
            .unwrap_or_else(|| Err(self.lost()))
    }

    /// Waits for the answer of a queued call: at most `queue_wait` for a batch to take it
    /// (then it is withdrawn and fails), and once taken, for its batch.
    async fn wait(
        &self,
        mut answer: oneshot::Receiver<Result<J::Answer, StoreError>>,
        state: &AtomicU8,
    ) -> Result<J::Answer, StoreError> {
        match tokio::time::timeout(self.queue_wait, &mut answer).await {
            Ok(answer) => answer.unwrap_or_else(|_| Err(self.lost())),
            Err(_) => {
                if state
                    .compare_exchange(WAITING, WITHDRAWN, Ordering::AcqRel, Ordering::Acquire)
                    .is_ok()
                {
                    return Err(StoreError::Unavailable(format!(
                        "{}: not taken by a database batch within {} ms",
                        self.what,
                        self.queue_wait.as_millis()
                    )));
                }
                // Taken: it is in a statement now, which answers within its own bound.
                answer.await.unwrap_or_else(|_| Err(self.lost()))
            }
        }
    }

    fn lost(&self) -> StoreError {
        StoreError::Internal(format!(
            "{}: the batch carrying this call ended without an answer",
            self.what
        ))
    }
}

/// The lane held by a batch running on a caller's task. Dropped (when the batch ends, or when the
/// caller is dropped mid-way), it hands the lane on: to a drainer if calls queued meanwhile, or
/// back to idle.
struct Leader<J: Job, R: Runner<J>> {
    lane: Arc<Lane<J>>,
    runner: Arc<R>,
}

impl<J: Job, R: Runner<J>> Drop for Leader<J, R> {
    fn drop(&mut self) {
        let mut state = self.lane.state.lock();
        if state.queue.is_empty() {
            state.busy = false;
            return;
        }
        drop(state);
        tokio::spawn(drain(self.lane.clone(), self.runner.clone()));
    }
}

/// Runs batches of what is queued on `lane` (which is busy, held for this task) until the queue
/// is empty, then leaves the lane idle.
async fn drain<J: Job, R: Runner<J>>(lane: Arc<Lane<J>>, runner: Arc<R>) {
    loop {
        let batch = {
            let mut state = lane.state.lock();
            let batch = take_batch(&mut state.queue);
            if batch.is_empty() && state.queue.is_empty() {
                state.busy = false;
                return;
            }
            state.company = batch.len() > 1;
            batch
        };
        if batch.is_empty() {
            continue;
        }
        let mut replies = Vec::with_capacity(batch.len());
        let mut jobs = Vec::with_capacity(batch.len());
        for queued in batch {
            replies.push(queued.reply);
            jobs.push(queued.job);
        }
        let answers = run_caught(&*runner, jobs, "batched call").await;
        for (reply, answer) in replies.into_iter().zip(answers) {
            // A caller that is gone (its request was dropped) does not need the answer.
            let _ = reply.send(answer);
        }
    }
}

/// The next batch from `queue`: the calls not withdrawn, in order, up to the bounds. A call that
/// would pass the byte bound stays first in the queue, unless it is alone (then it goes alone).
fn take_batch<J: Job>(queue: &mut VecDeque<Queued<J>>) -> Vec<Queued<J>> {
    let mut batch = Vec::new();
    let mut bytes = 0usize;
    while batch.len() < MAX_BATCH_CALLS {
        let Some(next) = queue.front() else { break };
        let weight = next.job.weight();
        if !batch.is_empty() && bytes.saturating_add(weight) > MAX_BATCH_BYTES {
            break;
        }
        let Some(next) = queue.pop_front() else { break };
        if !take(&next) {
            continue;
        }
        bytes = bytes.saturating_add(weight);
        batch.push(next);
    }
    batch
}

/// `runner.run(jobs)`, with a panic turned into every call's error.
async fn run_caught<J: Job, R: Runner<J>>(
    runner: &R,
    jobs: Vec<J>,
    what: &str,
) -> Vec<Result<J::Answer, StoreError>> {
    let calls = jobs.len();
    match CatchPanic::new(runner.run(jobs)).await {
        Ok(answers) if answers.len() == calls => answers,
        Ok(answers) => {
            tracing::error!(
                calls,
                answers = answers.len(),
                what,
                "a database batch answered the wrong number of calls"
            );
            (0..calls)
                .map(|_| {
                    Err(StoreError::Internal(
                        "the database batch carrying this call failed".into(),
                    ))
                })
                .collect()
        }
        Err(panic) => {
            tracing::error!(
                panic = crate::layer::catch_panic::message(&panic),
                calls,
                what,
                "a database batch panicked: its calls fail"
            );
            (0..calls)
                .map(|_| {
                    Err(StoreError::Internal(
                        "the database batch carrying this call failed".into(),
                    ))
                })
                .collect()
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
        let lanes = Lanes::new(2, recorder.clone(), Duration::from_secs(5), "test call");
        assert_eq!(lanes.submit(echo(4, 1)).await.unwrap(), 40);
        assert_eq!(*recorder.batches.lock(), vec![vec![4]]);
    }

    #[tokio::test]
    async fn a_convoy_reaching_an_idle_lane_together_goes_as_one_batch() {
        // Four calls woken in one turn of the scheduler (as the answers of one batch wake their
        // callers) reach the idle lane one after another: the first waits one turn for the
        // rest, and the drainer sends all four in one statement, the first first.
        let recorder = Recorder::default();
        let lanes = Arc::new(Lanes::new(
            1,
            recorder.clone(),
            Duration::from_secs(5),
            "test call",
        ));
        let tasks: Vec<_> = (1..=4)
            .map(|v| {
                let lanes = lanes.clone();
                tokio::spawn(async move { lanes.submit(echo(v, 1)).await })
            })
            .collect();
        for (v, task) in (1..=4).zip(tasks) {
            assert_eq!(task.await.unwrap().unwrap(), v * 10);
        }
        assert_eq!(*recorder.batches.lock(), vec![vec![1, 2, 3, 4]]);
    }

    #[tokio::test]
    async fn a_leader_dropped_while_waiting_for_company_leaves_the_lane_usable() {
        let recorder = Recorder::default();
        let lanes = Arc::new(Lanes::new(
            1,
            recorder.clone(),
            Duration::from_secs(5),
            "test call",
        ));
        // Polled once: the call takes the idle lane and yields; then its caller is gone.
        let mut lead = Box::pin(lanes.submit(echo(1, 1)));
        assert!(futures_poll_once(lead.as_mut()).is_none());
        drop(lead);
        assert_eq!(lanes.submit(echo(2, 1)).await.unwrap(), 20);
        assert_eq!(*recorder.batches.lock(), vec![vec![2]]);
    }

    #[tokio::test]
    async fn after_a_call_that_ran_alone_the_next_lone_call_does_not_wait_a_turn() {
        let recorder = Recorder::default();
        let lanes = Lanes::new(1, recorder.clone(), Duration::from_secs(5), "test call");
        // The first call on a fresh lane waits one turn for company (none comes)...
        let mut first = Box::pin(lanes.submit(echo(1, 1)));
        assert!(futures_poll_once(first.as_mut()).is_none());
        assert_eq!(first.await.unwrap(), 10);
        // ...and then the lane expects none: the next call is answered on its first poll.
        let mut second = Box::pin(lanes.submit(echo(2, 1)));
        assert_eq!(
            futures_poll_once(second.as_mut()).map(Result::unwrap),
            Some(20)
        );
        assert_eq!(*recorder.batches.lock(), vec![vec![1], vec![2]]);
    }

    /// Polls `future` once with a waker that does nothing.
    fn futures_poll_once<F: Future>(future: std::pin::Pin<&mut F>) -> Option<F::Output> {
        let mut cx = std::task::Context::from_waker(std::task::Waker::noop());
        match future.poll(&mut cx) {
            std::task::Poll::Ready(out) => Some(out),
            std::task::Poll::Pending => None,
        }
    }

    #[tokio::test]
    async fn calls_queued_while_a_batch_is_in_flight_form_the_next_batch() {
        let recorder = Recorder::default();
        recorder.gated.store(true, Ordering::Release);
        let lanes = Lanes::new(1, recorder.clone(), Duration::from_secs(5), "test call");
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
        let lanes = Lanes::new(1, recorder.clone(), Duration::from_secs(5), "test call");
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
        let lanes = Lanes::new(1, recorder.clone(), Duration::from_millis(50), "test call");
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
        let lanes = Lanes::new(1, Panicky, Duration::from_secs(5), "test call");
        let err = lanes.submit(echo(13, 1)).await.unwrap_err();
        assert!(matches!(err, StoreError::Internal(_)), "{err:?}");
        assert_eq!(lanes.submit(echo(14, 1)).await.unwrap(), 14);
    }

    /// Records the task each batch ran on.
    struct TaskOf(Arc<Mutex<Vec<Option<tokio::task::Id>>>>);

    impl Runner<Echo> for TaskOf {
        async fn run(&self, jobs: Vec<Echo>) -> Vec<Result<u32, StoreError>> {
            self.0.lock().push(tokio::task::try_id());
            jobs.iter().map(|j| Ok(j.value)).collect()
        }
    }

    #[tokio::test]
    async fn a_call_that_finds_its_lane_idle_runs_on_the_callers_task() {
        let seen = Arc::new(Mutex::new(Vec::new()));
        let lanes = Arc::new(Lanes::new(
            1,
            TaskOf(seen.clone()),
            Duration::from_secs(5),
            "test call",
        ));
        let caller = tokio::spawn({
            let lanes = lanes.clone();
            async move {
                let answer = lanes.submit(echo(5, 1)).await;
                (answer, tokio::task::id())
            }
        });
        let (answer, caller_id) = caller.await.unwrap();
        assert_eq!(answer.unwrap(), 5);
        assert_eq!(
            *seen.lock(),
            vec![Some(caller_id)],
            "no hand-off to another task"
        );
    }

    #[tokio::test]
    async fn a_caller_dropped_while_leading_a_batch_hands_the_lane_on() {
        let recorder = Recorder::default();
        recorder.gated.store(true, Ordering::Release);
        let lanes = Arc::new(Lanes::new(
            1,
            recorder.clone(),
            Duration::from_secs(5),
            "test call",
        ));
        let leader = tokio::spawn({
            let lanes = lanes.clone();
            async move { lanes.submit(echo(1, 1)).await }
        });
        while recorder.gated.load(Ordering::Acquire) {
            tokio::task::yield_now().await;
        }
        let queued = tokio::spawn({
            let lanes = lanes.clone();
            async move { lanes.submit(echo(2, 1)).await }
        });
        for _ in 0..10 {
            tokio::task::yield_now().await;
        }
        // The leader's request goes away mid-batch: the queued call still runs.
        leader.abort();
        assert_eq!(queued.await.unwrap().unwrap(), 20);
        assert_eq!(lanes.submit(echo(3, 1)).await.unwrap(), 30);
        assert_eq!(*recorder.batches.lock(), vec![vec![2], vec![3]]);
    }

    #[tokio::test]
    async fn calls_about_one_row_always_meet_in_one_lane() {
        let a = route_of(&["acct", "key-1"]);
        assert_eq!(a, route_of(&["acct", "key-1"]));
        // The parts are hashed with their boundaries: moving text across them changes the route.
        assert_ne!(route_of(&["acct", "k"]), route_of(&["acctk", ""]));
    }
}
