//! A loopback TCP proxy that can cut the network between a client and a
//! server, or turn it into a black hole, and a listener that never
//! answers: the real connections break or go quiet, as in a partition, a
//! stuck proxy or a half-open firewall, and nothing in the client or the
//! server is faked.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::{Duration, Instant};

use dlock_core::{Error, Guard, LostReason};

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::tcp::{OwnedReadHalf, OwnedWriteHalf};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::watch;

/// The proxy; see the module docs.
pub struct CutProxy {
    /// Where clients connect instead of the server.
    pub address: SocketAddr,
    state: watch::Sender<State>,
}

/// What the proxy does now. `cuts` counts the cuts, so a connection cut
/// and healed before its pump looked still ends.
#[derive(Clone, Copy, PartialEq, Eq)]
struct State {
    silent: bool,
    refusing: bool,
    cuts: u64,
}

impl CutProxy {
    /// Listens on a free loopback port and forwards every connection to `target`.
    pub async fn start(target: SocketAddr) -> Arc<Self> {
        let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind proxy");
        let (state, _) = watch::channel(State {
            silent: false,
            refusing: false,
            cuts: 0,
        });
        let proxy = Arc::new(CutProxy {
            address: listener.local_addr().expect("proxy address"),
            state,
        });
        let states = proxy.state.subscribe();
        tokio::spawn(async move {
            while let Ok((client, _)) = listener.accept().await {
                if states.borrow().refusing {
                    continue; // Dropped at once: the client sees the door shut.
                }
                tokio::spawn(forward(client, target, states.clone()));
            }
        });
        proxy
    }

    /// Cuts every open connection and refuses new ones until [`heal`](Self::heal).
    pub fn cut(&self) {
        self.state.send_modify(|s| {
            s.refusing = true;
            s.cuts += 1;
        });
    }

    /// Makes the network a black hole until [`heal`](Self::heal): nothing
    /// passes either way, every socket stays open, and new connections are
    /// accepted and then hear nothing.
    pub fn silence(&self) {
        self.state.send_modify(|s| s.silent = true);
    }

    /// Lets new connections through again, and what a silence held back
    /// (cut connections stay cut).
    pub fn heal(&self) {
        self.state.send_modify(|s| {
            s.refusing = false;
            s.silent = false;
        });
    }
}

async fn forward(client: TcpStream, target: SocketAddr, states: watch::Receiver<State>) {
    let cuts = states.borrow().cuts;
    // A silenced proxy holds the client before it reaches the server too.
    if !passes(&mut states.clone(), cuts).await {
        return;
    }
    let Ok(server) = TcpStream::connect(target).await else {
        return;
    };
    let (client_in, client_out) = client.into_split();
    let (server_in, server_out) = server.into_split();
    tokio::join!(
        pump(client_in, server_out, states.clone(), cuts),
        pump(server_in, client_out, states, cuts),
    );
}

/// Copies one direction until its end, a cut (both sockets close as the
/// halves drop) or a failure; stands still while the proxy is silent.
async fn pump(
    mut from: OwnedReadHalf,
    mut to: OwnedWriteHalf,
    mut states: watch::Receiver<State>,
    cuts: u64,
) {
    let mut buffer = vec![0; 16 * 1024];
    loop {
        if !passes(&mut states, cuts).await {
            return;
        }
        let read = tokio::select! {
            read = from.read(&mut buffer) => read,
            _ = states.changed() => continue,
        };
        let n = match read {
            Ok(0) | Err(_) => {
                let _ = to.shutdown().await;
                return;
            }
            Ok(n) => n,
        };
        // Read just as the silence began: held back until it ends.
        if !passes(&mut states, cuts).await || to.write_all(&buffer[..n]).await.is_err() {
            return;
        }
    }
}

/// Waits out a silence; false once the connection was cut.
async fn passes(states: &mut watch::Receiver<State>, cuts: u64) -> bool {
    match states.wait_for(|s| s.cuts != cuts || !s.silent).await {
        Ok(state) => state.cuts == cuts,
        Err(_) => false,
    }
}

/// A loopback listener that accepts every connection and never writes a
/// byte, nor closes one, until dropped: a server that is up and says
/// nothing.
pub struct SilentListener {
    /// Where it listens.
    pub address: SocketAddr,
    task: tokio::task::JoinHandle<()>,
}

impl SilentListener {
    /// Listens on a free loopback port.
    pub async fn start() -> Self {
        let listener = TcpListener::bind("127.0.0.1:0")
            .await
            .expect("bind silent listener");
        let address = listener.local_addr().expect("silent listener address");
        let task = tokio::spawn(async move {
            let mut held = Vec::new();
            while let Ok((socket, _)) = listener.accept().await {
                held.push(socket);
            }
        });
        SilentListener { address, task }
    }
}

impl Drop for SilentListener {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// Holding `guard` through `proxy`, with another client queued by `next`
/// (taking the same lock, or campaigning in the same election), cuts the
/// proxy. Returns how long after the cut the
/// holder heard of its loss and the next one got in; panics unless the
/// loss came from the engine, before the next got in, and the fence rose.
/// Heals the proxy and lets both go.
pub async fn cut_holder_then_next(
    proxy: &CutProxy,
    guard: Guard,
    next: impl Future<Output = Result<Guard, Error>> + Send + 'static,
) -> (Duration, Duration) {
    let lost = guard.lost();
    let next = tokio::spawn(next);
    tokio::time::sleep(Duration::from_millis(200)).await;
    let cut_at = Instant::now();
    proxy.cut();
    let reason = tokio::time::timeout(Duration::from_secs(10), lost)
        .await
        .expect("lost never fired");
    assert_eq!(reason, LostReason::Engine);
    let lost_after = cut_at.elapsed();
    let next = tokio::time::timeout(Duration::from_secs(10), next)
        .await
        .expect("the waiter never got the lock")
        .expect("task")
        .expect("lock");
    let admitted_after = cut_at.elapsed();
    assert!(
        lost_after < admitted_after,
        "the holder heard of its loss {lost_after:?} after the cut, after the next got in ({admitted_after:?})"
    );
    assert!(next.fence() > guard.fence(), "the fence went back");
    proxy.heal();
    assert!(matches!(guard.release().await, Err(Error::Lost { .. })));
    next.release().await.expect("release");
    (lost_after, admitted_after)
}
