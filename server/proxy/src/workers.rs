//! The threads that serve the proxy's connections: one event loop per CPU, as nginx runs one
//! worker process per CPU.
//!
//! The main thread accepts; each connection goes to the worker with the fewest open connections
//! (connections live long and carry many requests, so spreading them evenly spreads the load).
//! Each worker runs a single-threaded tokio runtime with its own [`App`] and its own upstream
//! client: a request, the pooled upstream connection that carries it and every task they wake stay
//! on one thread, with no work stealing and no other thread woken for a socket event. Measured
//! against one multi-threaded runtime in `benches/NOTEBOOK.md` ("Worker threads"). The store is
//! shared: the embedded store's writers and committer are threads of their own, and a PostgreSQL
//! connection is driven by the worker that opened it.
//!
//! Shutdown: [`Workers::serve_until`] stops accepting and lets every worker drain its connections
//! within the grace period. The worker runtimes keep running after that, until
//! [`Workers::release`]: tasks spawned on a worker (the rest of a request whose client left, a
//! database connection opened there) must keep running until the store is closed.

use std::future::Future;
use std::io;
use std::net::{SocketAddr, TcpStream as StdStream};
use std::pin::pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::thread::JoinHandle;
use std::time::Duration;

use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{OwnedSemaphorePermit, Semaphore, mpsc, watch};
use tokio::time::Instant;
use tracing::{error, warn};

use crate::app::App;
use crate::forward::Upstream;
use crate::serve::{Connections, Limits, accept};

/// How a worker's serving ended: the end of its grace period, or why it could not serve.
type Exit = (usize, Result<Instant, String>);

/// An accepted connection on its way to a worker.
struct Handoff {
    stream: StdStream,
    peer: SocketAddr,
    open: Open,
}

/// Held while a connection is open: its permit, and its place in its worker's count.
struct Open {
    _permit: OwnedSemaphorePermit,
    load: Arc<AtomicUsize>,
}

impl Drop for Open {
    fn drop(&mut self) {
        self.load.fetch_sub(1, Ordering::Relaxed);
    }
}

/// The way to one worker.
struct Lane {
    tx: mpsc::UnboundedSender<Handoff>,
    load: Arc<AtomicUsize>,
}

/// The running workers.
pub struct Workers {
    lanes: Vec<Lane>,
    release: watch::Sender<bool>,
    exits: mpsc::UnboundedReceiver<Exit>,
    threads: Vec<JoinHandle<()>>,
}

/// How serving ended.
pub struct Served {
    /// When the last worker's grace period ends (the shutdown's deadline).
    pub grace_ends: Instant,
    /// A worker that stopped before the shutdown signal, and why (the proxy then shuts down).
    pub failure: Option<String>,
}

/// Starts one worker per upstream client.
pub fn start(app: &App, upstreams: Vec<Arc<Upstream>>, limits: Limits) -> io::Result<Workers> {
    let (release, release_rx) = watch::channel(false);
    let (exit_tx, exits) = mpsc::unbounded_channel();
    let mut threads = Vec::with_capacity(upstreams.len());
    let mut lanes = Vec::with_capacity(upstreams.len());
    for (index, upstream) in upstreams.into_iter().enumerate() {
        let (tx, incoming) = mpsc::unbounded_channel();
        let worker = Worker {
            incoming,
            app: app.with_upstream(upstream),
            limits,
            release: release_rx.clone(),
            exit: ExitOnDrop {
                index,
                tx: exit_tx.clone(),
                sent: false,
            },
        };
        threads.push(
            std::thread::Builder::new()
                .name(format!("proxy-worker-{index}"))
                .spawn(move || worker.run())?,
        );
        lanes.push(Lane {
            tx,
            load: Arc::default(),
        });
    }
    Ok(Workers {
        lanes,
        release,
        exits,
        threads,
    })
}

impl Workers {
    /// How many workers serve.
    pub fn len(&self) -> usize {
        self.threads.len()
    }

    /// Whether there are none (never, once started).
    pub fn is_empty(&self) -> bool {
        self.threads.is_empty()
    }

    /// Accepts on `listener` (a connection only with one of `permits`; at the cap, clients wait
    /// in the listen backlog) and hands each connection to the least loaded worker, until
    /// `signal` resolves or a worker stops on its own; then lets every worker drain.
    pub async fn serve_until(
        &mut self,
        listener: TcpListener,
        permits: Arc<Semaphore>,
        signal: impl Future<Output = ()>,
        grace: Duration,
    ) -> Served {
        let mut exited = 0;
        let mut failure = None;
        let mut signal = pin!(signal);
        loop {
            let next = tokio::select! {
                next = accept(&listener, &permits, signal.as_mut()) => next,
                Some((index, result)) = self.exits.recv() => {
                    exited += 1;
                    let why = match result {
                        Ok(_) => "stopped serving before the shutdown signal".to_owned(),
                        Err(e) => e,
                    };
                    error!(worker = index, reason = %why, "a proxy worker stopped: shutting down");
                    failure = Some(format!("proxy worker {index}: {why}"));
                    break;
                }
            };
            let Some((stream, peer, permit)) = next else {
                break;
            };
            self.hand_off(stream, peer, permit);
        }
        drop(listener);
        let mut grace_ends = Instant::now() + grace;
        // Closing the lanes tells each worker that no connection will come: it drains.
        self.lanes.clear();
        while exited < self.threads.len() {
            match self.exits.recv().await {
                Some((_, Ok(ends))) => grace_ends = grace_ends.max(ends),
                Some((index, Err(e))) => {
                    error!(worker = index, error = %e, "a proxy worker failed while draining");
                    failure.get_or_insert(format!("proxy worker {index}: {e}"));
                }
                None => break,
            }
            exited += 1;
        }
        Served {
            grace_ends,
            failure,
        }
    }

    /// Sends a connection to the worker with the fewest open connections.
    fn hand_off(&self, stream: TcpStream, peer: SocketAddr, permit: OwnedSemaphorePermit) {
        let Some(lane) = self
            .lanes
            .iter()
            .min_by_key(|lane| lane.load.load(Ordering::Relaxed))
        else {
            return;
        };
        let stream = match stream.into_std() {
            Ok(stream) => stream,
            Err(e) => {
                warn!(%peer, error = %e, "accepted connection could not be handed to a worker");
                return;
            }
        };
        lane.load.fetch_add(1, Ordering::Relaxed);
        let open = Open {
            _permit: permit,
            load: Arc::clone(&lane.load),
        };
        // A worker that is gone has reported its exit; the connection closes with the handoff.
        let _ = lane.tx.send(Handoff { stream, peer, open });
    }

    /// Lets the worker runtimes end (call once the store is closed) and joins their threads.
    pub fn release(self) {
        let _ = self.release.send(true);
        for thread in self.threads {
            if thread.join().is_err() {
                error!("a proxy worker thread panicked");
            }
        }
    }
}

/// One worker, moved to its thread.
struct Worker {
    incoming: mpsc::UnboundedReceiver<Handoff>,
    app: App,
    limits: Limits,
    release: watch::Receiver<bool>,
    exit: ExitOnDrop,
}

impl Worker {
    fn run(self) {
        let Worker {
            mut incoming,
            app,
            limits,
            mut release,
            mut exit,
        } = self;
        let runtime = match tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
        {
            Ok(runtime) => runtime,
            Err(e) => return exit.send(Err(format!("could not start its runtime: {e}"))),
        };
        runtime.block_on(async move {
            let connections = Connections::new(app, limits);
            while let Some(Handoff { stream, peer, open }) = incoming.recv().await {
                match TcpStream::from_std(stream) {
                    Ok(stream) => connections.serve(stream, peer, open),
                    Err(e) => warn!(%peer, error = %e, "connection could not join the worker's event loop"),
                }
            }
            exit.send(Ok(connections.drain().await));
            // Tasks spawned on this thread run until the store is closed.
            let _ = release.wait_for(|released| *released).await;
        });
    }
}

/// Reports a worker's end exactly once, as a failure if the thread unwinds before reporting.
struct ExitOnDrop {
    index: usize,
    tx: mpsc::UnboundedSender<Exit>,
    sent: bool,
}

impl ExitOnDrop {
    fn send(&mut self, result: Result<Instant, String>) {
        self.sent = true;
        let _ = self.tx.send((self.index, result));
    }
}

impl Drop for ExitOnDrop {
    fn drop(&mut self) {
        if !self.sent {
            let _ = self
                .tx
                .send((self.index, Err("its thread panicked".to_owned())));
        }
    }
}
