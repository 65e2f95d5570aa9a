//! A loopback TCP proxy that can cut the network between a client and a
//! server: the real connection breaks, as in a partition, and nothing in
//! the client or the server is faked.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::{Duration, Instant};

use dlock_core::{Error, Guard, LostReason};

use tokio::io::copy_bidirectional;
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::watch;

/// The proxy; see the module docs.
pub struct CutProxy {
    /// Where clients connect instead of the server.
    pub address: SocketAddr,
    cut: watch::Sender<bool>,
}

impl CutProxy {
    /// Listens on a free loopback port and forwards every connection to `target`.
    pub async fn start(target: SocketAddr) -> Arc<Self> {
        let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind proxy");
        let (cut, _) = watch::channel(false);
        let proxy = Arc::new(CutProxy {
            address: listener.local_addr().expect("proxy address"),
            cut,
        });
        let cuts = proxy.cut.subscribe();
        tokio::spawn(async move {
            while let Ok((client, _)) = listener.accept().await {
                if *cuts.borrow() {
                    continue; // Dropped at once: the client sees the door shut.
                }
                tokio::spawn(forward(client, target, cuts.clone()));
            }
        });
        proxy
    }

    /// Cuts every open connection and refuses new ones until [`heal`](Self::heal).
    pub fn cut(&self) {
        self.cut.send_replace(true);
    }

    /// Lets new connections through again (cut ones stay cut).
    pub fn heal(&self) {
        self.cut.send_replace(false);
    }
}

async fn forward(mut client: TcpStream, target: SocketAddr, mut cuts: watch::Receiver<bool>) {
    let Ok(mut server) = TcpStream::connect(target).await else {
        return;
    };
    tokio::select! {
        _ = copy_bidirectional(&mut client, &mut server) => {}
        _ = cuts.wait_for(|cut| *cut) => {}
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
