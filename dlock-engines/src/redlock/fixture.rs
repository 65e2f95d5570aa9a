//! The RedLock engine's fixture: 5 independent redis-servers on free
//! loopback ports.

use std::time::Duration;

use crate::conformance::server::TestServer;
use crate::conformance::{Breakable, Fixture};
use crate::redis::fixture::{kill_clients, redis_args};

/// Independent redis-servers, 5 unless made [`with_masters`](Self::with_masters).
pub struct RedLock {
    /// The masters, in the order of the config's `masters` list.
    pub masters: Vec<TestServer>,
}

impl RedLock {
    /// `masters` independent redis-servers.
    pub fn with_masters(masters: usize) -> Self {
        RedLock {
            masters: (0..masters)
                .map(|_| TestServer::start("redis-server", |port| redis_args(port, &[])))
                .collect(),
        }
    }

    /// The `masters = [...]` line for the running servers.
    pub fn masters_line(&self) -> String {
        let urls: Vec<String> = self
            .masters
            .iter()
            .map(|m| format!("\"redis://{}\"", m.address()))
            .collect();
        format!("masters = [{}]", urls.join(", "))
    }
}

impl Fixture for RedLock {
    const NAME: &'static str = "redlock";

    fn start() -> Self {
        Self::with_masters(5)
    }

    fn engine_config(&self) -> String {
        format!(
            "kind = \"redlock\"\n{}\nfence_retention = \"2s\"",
            self.masters_line()
        )
    }
}

/// Crashing "the server" crashes every master: all holds are forgotten at
/// once, as a whole-datacenter outage would.
impl Breakable for RedLock {
    fn frees_dead_holder_within(&self) -> (Duration, &'static str) {
        (Duration::from_millis(1000 + 700), "lease 1 s")
    }

    fn kill(&mut self) {
        self.masters.iter_mut().for_each(TestServer::kill);
    }

    fn restart(&mut self) {
        self.masters.iter_mut().for_each(TestServer::restart);
    }

    /// A dead holder's lease, then a poll: there is no queue to wait out.
    fn recovers_within(&self) -> Duration {
        Duration::from_millis(1000 + 1000)
    }

    /// One master of the five, as in a real outage.
    fn outage(&mut self, pick: u64, down: Duration) -> bool {
        let master = &mut self.masters[pick as usize % 5];
        master.kill();
        std::thread::sleep(down);
        master.restart();
        true
    }

    fn kill_connections(&self) -> bool {
        kill_clients(&self.masters.iter().map(|m| m.port).collect::<Vec<_>>())
    }
}
