//! The background thread of each durability mode.
//!
//! `Periodic(t)` fdatasyncs whatever was appended every `t`; `None` writes buffered frames to the OS
//! every 50 ms so that a process crash loses at most that much, and sooner when the writer kicks it
//! ([`Wakeup::kick`]) because a lot is buffered: the copy into the page cache then happens on this
//! thread's core instead of on a caller's path. Under `Sync` the thread is the *committer*: it
//! flushes on behalf of tasks that await durability without blocking a thread
//! ([`crate::Store::durable`]); each such task kicks it when it registers, and it keeps flushing
//! (group commit, with the writer's usual gathering) while any remain. Blocking callers still lead
//! their own flushes; the two share the writer's single-leader protocol. A failure poisons the writer
//! like any other I/O failure, so the next caller learns of it.

use std::sync::{Arc, Weak};
use std::thread::JoinHandle;
use std::time::Duration;

use super::group_commit::Due;
use super::wakeup::Wakeup;
use super::writer::LogWriter;
use crate::options::Durability;

const NONE_INTERVAL: Duration = Duration::from_millis(50);

/// Under `Sync`, how often the committer looks for waiters without being kicked: a safety net only,
/// every registration kicks it.
const COMMITTER_INTERVAL: Duration = Duration::from_millis(100);

/// Owns the thread; stopping it (or dropping this) joins it.
pub(crate) struct Flusher {
    wakeup: Arc<Wakeup>,
    handle: Option<JoinHandle<()>>,
}

impl Flusher {
    /// Starts the thread the durability mode needs, if any.
    pub(crate) fn start(writer: &Arc<LogWriter>, durability: Durability) -> Option<Flusher> {
        let (interval, round) = match durability {
            Durability::Sync => (COMMITTER_INTERVAL, Round::ForWaiters),
            Durability::Periodic(interval) => (interval, Round::Sync),
            Durability::None => (NONE_INTERVAL, Round::Write),
        };
        let wakeup = writer.wakeup();
        let weak: Weak<LogWriter> = Arc::downgrade(writer);
        let thread_wakeup = Arc::clone(&wakeup);
        let handle = std::thread::Builder::new()
            .name("idemlog-flusher".into())
            .spawn(move || run(weak, &thread_wakeup, interval, round))
            .ok()?;
        Some(Flusher {
            wakeup,
            handle: Some(handle),
        })
    }

    /// Stops and joins the thread.
    pub(crate) fn stop(&mut self) {
        self.wakeup.stop();
        if let Some(handle) = self.handle.take() {
            let _ = handle.join();
        }
    }
}

impl Drop for Flusher {
    fn drop(&mut self) {
        self.stop();
    }
}

/// What one round of the thread does.
#[derive(Debug, Clone, Copy)]
enum Round {
    /// Write and fdatasync everything appended (`Periodic`).
    Sync,
    /// Write everything appended to the OS (`None`).
    Write,
    /// While tasks await durability, make everything appended durable (`Sync`).
    ForWaiters,
}

fn run(writer: Weak<LogWriter>, wakeup: &Wakeup, interval: Duration, round: Round) {
    let mut timeout = interval;
    while wakeup.wait(timeout) {
        timeout = interval;
        let Some(writer) = writer.upgrade() else {
            break;
        };
        let result = match round {
            Round::Sync => writer.sync_all(),
            Round::Write => writer.write_all(),
            Round::ForWaiters => {
                // Tasks that registered during a flush are covered by the next one: loop while the
                // group-commit rule says a sync is due, rather than sleeping and being kicked again;
                // when it says to wait for more waiters, sleep until then (or the kick of the
                // waiter that reaches the goal).
                // A round that moves nothing (every waiter left is covered, or waits for a frame
                // not appended yet) ends the loop instead of spinning; the next kick resumes it.
                let mut result = Ok(());
                while result.is_ok() {
                    match writer.commit_due() {
                        Due::Now => {}
                        Due::In(left) => {
                            timeout = left;
                            break;
                        }
                        Due::Idle => break,
                    }
                    let before = writer.synced_pos();
                    result = writer.sync_all();
                    if writer.synced_pos() == before {
                        break;
                    }
                }
                result
            }
        };
        if result.is_err() {
            // The writer is poisoned and reports the cause to every caller; nothing more to do here.
            break;
        }
    }
}

#[cfg(test)]
mod tests {
    use std::time::Instant;

    use super::*;

    const LONG: Duration = Duration::from_secs(30);

    #[test]
    fn a_kick_before_the_wait_starts_the_next_round_at_once() {
        let wakeup = Wakeup::default();
        // Kicked while the thread was busy with a round: the kick must not be lost.
        wakeup.kick();
        let started = Instant::now();
        assert!(wakeup.wait(LONG), "not stopped");
        assert!(started.elapsed() < LONG / 2, "the wait ran its interval");
    }

    #[test]
    fn a_kick_wakes_a_waiting_flusher() {
        let wakeup = Arc::new(Wakeup::default());
        let waiter = std::thread::spawn({
            let wakeup = Arc::clone(&wakeup);
            move || {
                let started = Instant::now();
                let running = wakeup.wait(LONG);
                (running, started.elapsed())
            }
        });
        std::thread::sleep(Duration::from_millis(20));
        wakeup.kick();
        let (running, waited) = waiter.join().expect("waiter");
        assert!(running);
        assert!(waited < LONG / 2, "the kick did not wake it");
    }

    #[test]
    fn stop_ends_the_loop() {
        let wakeup = Wakeup::default();
        wakeup.stop();
        assert!(!wakeup.wait(LONG));
    }
}
