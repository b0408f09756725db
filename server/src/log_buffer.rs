//! Log lines gathered in memory and written in batches by one background thread.
//!
//! A request that logs appends its formatted line to a shared buffer (a lock and a copy) and goes
//! on; the `idemlog-log` thread writes what has gathered in one `write(2)`, then waits
//! [`FLUSH_INTERVAL`] for more before writing again. Under load that is one system call per
//! interval instead of one per line, and no thread is woken per line: the thread is woken only
//! when a line lands in an empty buffer while it sleeps on it (idle, it sleeps without a timer).
//! `tracing-appender`'s non-blocking writer, used before, sends every line as its own channel
//! message and wakes its thread for nearly every one: measured in benches/NOTEBOOK.md (issue 23, fifth
//! step).
//!
//! Invariants:
//! - Lines reach the output whole and in the order they were appended: the buffer is taken and
//!   written only while holding the output lock, so two batches never interleave or swap.
//! - Memory is bounded: a writer that finds [`HIGH_WATER`] bytes waiting (the output is stalled,
//!   say a log reader that stopped reading) writes the batch itself, behind the output lock, so
//!   requests wait for the output instead of dropping lines or growing the buffer.
//! - [`LogGuard`]'s drop writes everything appended before it. A process killed without running it
//!   (SIGKILL, an abort) loses at most the lines of the last [`FLUSH_INTERVAL`].

use std::io::{self, Write};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::thread::JoinHandle;
use std::time::Duration;

use parking_lot::{Condvar, Mutex};
use tracing_subscriber::fmt::MakeWriter;

/// How long the writer thread lets lines gather after the first of a batch arrives.
pub const FLUSH_INTERVAL: Duration = Duration::from_millis(10);

/// Bytes waiting at which the appending thread writes the batch itself (see the module docs).
pub const HIGH_WATER: usize = 256 * 1024;

struct Shared<W> {
    /// Lines appended and not yet taken for writing.
    pending: Mutex<Vec<u8>>,
    /// The writer thread sleeps here while `pending` is empty.
    arrived: Condvar,
    /// Held from taking `pending` until its bytes are written: batches keep their order.
    output: Mutex<Output<W>>,
    stop: AtomicBool,
}

struct Output<W> {
    out: W,
    /// The buffer last written, emptied, swapped in for `pending` at the next write: appending
    /// reuses memory instead of growing a fresh vector (and faulting in its pages) per batch.
    spare: Vec<u8>,
}

impl<W: Write> Shared<W> {
    fn append(&self, line: &[u8]) -> io::Result<()> {
        let mut pending = self.pending.lock();
        let was_empty = pending.is_empty();
        pending.extend_from_slice(line);
        let full = pending.len() >= HIGH_WATER;
        drop(pending);
        if full {
            return self.write_pending();
        }
        if was_empty {
            // Only the first line of a batch can find the thread asleep on an empty buffer.
            self.arrived.notify_one();
        }
        Ok(())
    }

    /// Takes what is pending and writes it, under the output lock.
    fn write_pending(&self) -> io::Result<()> {
        let mut output = self.output.lock();
        let output = &mut *output;
        std::mem::swap(&mut output.spare, &mut *self.pending.lock());
        if output.spare.is_empty() {
            return Ok(());
        }
        let written = output
            .out
            .write_all(&output.spare)
            .and_then(|()| output.out.flush());
        output.spare.clear();
        written
    }

    fn run(&self) {
        loop {
            {
                let mut pending = self.pending.lock();
                while pending.is_empty() && !self.stop.load(Ordering::Acquire) {
                    self.arrived.wait(&mut pending);
                }
            }
            let stopping = self.stop.load(Ordering::Acquire);
            if !stopping {
                std::thread::sleep(FLUSH_INTERVAL);
            }
            // Nowhere to report a failed write of the log itself; the next batch tries again.
            let _ = self.write_pending();
            if stopping {
                return;
            }
        }
    }
}

/// The `MakeWriter` handed to the fmt subscriber: each event's line goes to the shared buffer.
pub struct LogWriter<W> {
    shared: Arc<Shared<W>>,
}

/// One event's writer: appends whatever it is given (the fmt layer writes a line in one call).
pub struct LineSink<'a, W> {
    shared: &'a Shared<W>,
}

impl<W: Write> Write for LineSink<'_, W> {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        self.shared.append(buf)?;
        Ok(buf.len())
    }

    fn flush(&mut self) -> io::Result<()> {
        // Lines are flushed by the writer thread within FLUSH_INTERVAL, or by the guard's drop.
        Ok(())
    }
}

impl<'a, W: Write + 'a> MakeWriter<'a> for LogWriter<W> {
    type Writer = LineSink<'a, W>;

    fn make_writer(&'a self) -> Self::Writer {
        LineSink {
            shared: &self.shared,
        }
    }
}

/// Stops the writer thread and writes every line appended before the drop.
pub struct LogGuard<W: Write> {
    shared: Arc<Shared<W>>,
    thread: Option<JoinHandle<()>>,
}

impl<W: Write> Drop for LogGuard<W> {
    fn drop(&mut self) {
        self.shared.stop.store(true, Ordering::Release);
        // Taking the lock orders the store before the thread's check of `stop` under it.
        drop(self.shared.pending.lock());
        self.shared.arrived.notify_one();
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
        let _ = self.shared.write_pending();
    }
}

/// A batching writer over `output`, with its thread (named `idemlog-log`) started.
pub fn log_buffer<W: Write + Send + 'static>(output: W) -> io::Result<(LogWriter<W>, LogGuard<W>)> {
    let shared = Arc::new(Shared {
        pending: Mutex::new(Vec::with_capacity(64 * 1024)),
        arrived: Condvar::new(),
        output: Mutex::new(Output {
            out: output,
            spare: Vec::with_capacity(64 * 1024),
        }),
        stop: AtomicBool::new(false),
    });
    let thread = {
        let shared = Arc::clone(&shared);
        std::thread::Builder::new()
            .name("idemlog-log".into())
            .spawn(move || shared.run())?
    };
    Ok((
        LogWriter {
            shared: Arc::clone(&shared),
        },
        LogGuard {
            shared,
            thread: Some(thread),
        },
    ))
}

#[cfg(test)]
mod tests {
    use std::sync::mpsc;
    use std::time::Instant;

    use super::*;

    /// An output that keeps what it is given, with a count of `write` calls.
    #[derive(Clone, Default)]
    struct Kept {
        bytes: Arc<Mutex<Vec<u8>>>,
        writes: Arc<Mutex<usize>>,
    }

    impl Write for Kept {
        fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
            self.bytes.lock().extend_from_slice(buf);
            *self.writes.lock() += 1;
            Ok(buf.len())
        }
        fn flush(&mut self) -> io::Result<()> {
            Ok(())
        }
    }

    fn line(writer: &LogWriter<impl Write>, text: &str) {
        writer
            .make_writer()
            .write_all(text.as_bytes())
            .expect("append");
    }

    #[test]
    fn lines_from_many_threads_arrive_whole_and_in_each_threads_order() {
        let kept = Kept::default();
        let (writer, guard) = log_buffer(kept.clone()).expect("start");
        let writer = Arc::new(writer);
        let threads: Vec<_> = (0..4)
            .map(|t| {
                let writer = Arc::clone(&writer);
                std::thread::spawn(move || {
                    for i in 0..5_000 {
                        line(
                            &writer,
                            &format!("thread {t} line {i} {}\n", "x".repeat(i % 97)),
                        );
                    }
                })
            })
            .collect();
        for thread in threads {
            thread.join().expect("writer thread");
        }
        drop(guard);
        let text = String::from_utf8(kept.bytes.lock().clone()).expect("utf-8");
        let mut next = [0usize; 4];
        for l in text.lines() {
            let words: Vec<&str> = l.split(' ').collect();
            let (t, i): (usize, usize) =
                (words[1].parse().expect("t"), words[3].parse().expect("i"));
            assert_eq!(i, next[t], "thread {t}'s lines out of order or torn: {l:?}");
            assert_eq!(
                words.get(4).map_or(0, |x| x.len()),
                i % 97,
                "torn line {l:?}"
            );
            next[t] += 1;
        }
        assert_eq!(next, [5_000; 4]);
    }

    #[test]
    fn a_line_is_written_without_waiting_for_more() {
        let kept = Kept::default();
        let (writer, _guard) = log_buffer(kept.clone()).expect("start");
        line(&writer, "only line\n");
        let deadline = Instant::now() + Duration::from_secs(10);
        while kept.bytes.lock().is_empty() {
            assert!(Instant::now() < deadline, "a lone line was never written");
            std::thread::sleep(Duration::from_millis(1));
        }
        assert_eq!(&*kept.bytes.lock(), b"only line\n");
    }

    #[test]
    fn lines_appended_together_go_out_in_one_write() {
        let kept = Kept::default();
        let (writer, guard) = log_buffer(kept.clone()).expect("start");
        // Faster than FLUSH_INTERVAL by far: the thread is still gathering when the last arrives.
        for i in 0..100 {
            line(&writer, &format!("line {i}\n"));
        }
        drop(guard);
        assert!(
            *kept.writes.lock() <= 2,
            "100 lines took {} writes",
            kept.writes.lock()
        );
        assert_eq!(
            String::from_utf8_lossy(&kept.bytes.lock()).lines().count(),
            100
        );
    }

    #[test]
    fn dropping_the_guard_writes_every_line_appended_before() {
        let kept = Kept::default();
        let (writer, guard) = log_buffer(kept.clone()).expect("start");
        line(&writer, "first\n");
        line(&writer, "last\n");
        drop(guard);
        assert_eq!(&*kept.bytes.lock(), b"first\nlast\n");
    }

    /// An output that blocks every write until the test lets it go.
    struct Stalled {
        release: mpsc::Receiver<()>,
        written: Arc<Mutex<usize>>,
    }

    impl Write for Stalled {
        fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
            let _ = self.release.recv();
            *self.written.lock() += buf.len();
            Ok(buf.len())
        }
        fn flush(&mut self) -> io::Result<()> {
            Ok(())
        }
    }

    #[test]
    fn a_stalled_output_holds_writers_back_instead_of_growing_the_buffer() {
        let (release, gate) = mpsc::sync_channel(0);
        let written = Arc::new(Mutex::new(0));
        let (writer, guard) = log_buffer(Stalled {
            release: gate,
            written: Arc::clone(&written),
        })
        .expect("start");
        let writer = Arc::new(writer);
        let (done_tx, done) = mpsc::channel();
        let appender = {
            let writer = Arc::clone(&writer);
            std::thread::spawn(move || {
                let text = "y".repeat(1023) + "\n";
                for _ in 0..2_048 {
                    line(&writer, &text); // 2 MiB in all: 8 × HIGH_WATER
                }
                let _ = done_tx.send(());
            })
        };
        // The output takes nothing: the appender must end up waiting with the buffer bounded.
        std::thread::sleep(Duration::from_millis(300));
        assert!(
            done.try_recv().is_err(),
            "2 MiB appended past a stalled output"
        );
        assert!(
            writer.shared.pending.lock().len() <= HIGH_WATER + 1024,
            "the buffer grew past its bound: {}",
            writer.shared.pending.lock().len()
        );
        // Let the output go: every byte arrives.
        let releaser = std::thread::spawn(move || while release.send(()).is_ok() {});
        done.recv().expect("appender finished");
        appender.join().expect("appender");
        drop(guard);
        drop(writer);
        releaser.join().expect("releaser");
        assert_eq!(*written.lock(), 2_048 * 1024);
    }
}
