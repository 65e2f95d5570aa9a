//! The memcached engine's fixture: one memcached on a free loopback port,
//! run with `-M` (errors instead of evictions), as production should be.

use std::time::Duration;

use crate::conformance::server::TestServer;
use crate::conformance::{Breakable, Fixture};

/// One memcached.
pub struct Memcached {
    /// The server process.
    pub server: TestServer,
}

/// Arguments for a throwaway memcached on `port`: loopback only, no UDP, no
/// evictions. `-u` matters only when run as root, which memcached refuses.
pub fn memcached_args(port: u16) -> Vec<String> {
    let port = port.to_string();
    [
        "-l",
        "127.0.0.1",
        "-p",
        &port,
        "-U",
        "0",
        "-M",
        "-m",
        "64",
        "-u",
        "nobody",
    ]
    .map(String::from)
    .into()
}

impl Fixture for Memcached {
    const NAME: &'static str = "memcached";

    fn start() -> Self {
        Memcached {
            server: TestServer::start("memcached", memcached_args),
        }
    }

    fn engine_config(&self) -> String {
        format!("kind = \"memcached\"\naddress = \"{}\"", self.server.address())
    }
}

impl Breakable for Memcached {
    fn frees_dead_holder_within(&self) -> (Duration, &'static str) {
        // A 1 s lease is a 2 s TTL, restarted by each renewal (every 333 ms).
        (Duration::from_millis(2000 + 700), "lease 1 s, TTL 2 s")
    }

    fn kill(&mut self) {
        self.server.kill();
    }

    fn restart(&mut self) {
        self.server.restart();
    }

    /// A dead holder's item TTL (2 s), then a poll.
    fn recovers_within(&self) -> Duration {
        Duration::from_millis(2000 + 1000)
    }
}
