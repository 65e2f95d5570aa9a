//! A loopback TCP proxy that can cut the network between a client and a
//! server: the real connection breaks, as in a partition, and nothing in
//! the client or the server is faked.

use std::net::SocketAddr;
use std::sync::Arc;

use tokio::io::copy_bidirectional;
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::watch;

pub struct CutProxy {
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
