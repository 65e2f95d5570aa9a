//! What an engine's fixture is: how the conformance and fault suites get a
//! real engine. Each engine's own is a file in `fixtures/`.

use std::sync::Arc;
use std::time::Duration;

use dlock_core::Config;
use dlock_core::kit::Engine;

/// An engine's test setup: its server(s) on free loopback ports, and the
/// `[engines.<name>]` table that points at them.
pub trait Fixture: Sized + Send + Sync + 'static {
    /// For messages and figures: `"redis"`, `"zookeeper"`, ...
    const NAME: &'static str;

    /// What `scripts/install` provides for it: the commands and files its
    /// servers and its tools need, as the script's `needs` name them.
    const INSTALLED: &'static [&'static str];

    /// Whether the engine talks to a server at all; one that does names
    /// each by `127.0.0.1:<port>` in its config, where the silence checks
    /// put theirs.
    const HAS_SERVER: bool = true;

    /// Whether the engine's client learns the addresses it talks to from
    /// the servers (a cluster's slots, a sentinel's primary): then a proxy
    /// put in the config does not sit on every connection.
    const ADDRESSES_FROM_SERVERS: bool = false;

    /// Starts the server(s) and waits until they serve.
    fn start() -> Self;

    /// The body of an `[engines.<name>]` table for the running server(s):
    /// `kind` and settings, fit for the suites' 1 s leases.
    fn engine_config(&self) -> String;
}

/// What the fault suite also needs: how soon a dead holder stops blocking
/// others, and a server to crash and restart where the setup has one.
pub trait Breakable: Fixture {
    /// How soon a holder that died frees its lock (a 1 s lease, a 2 s
    /// session...), and what sets it, for messages.
    fn frees_dead_holder_within(&self) -> (Duration, &'static str);

    /// Whether the setup is one server to crash; not a cluster, whose locks
    /// live on one node of several. Crash scenarios skip, saying so, if not.
    const CRASHES: bool = true;

    /// Whether a crash is a failover, after which the setup serves again
    /// on its own (Sentinel): nothing is ever gone. Scenarios of a server
    /// gone for good skip, saying so.
    const FAILS_OVER: bool = false;

    /// Crashes the server (SIGKILL).
    fn kill(&mut self);

    /// The ids of the setup's server processes: each, with every process
    /// under it, is paused (SIGSTOP) when the servers go silent.
    fn servers(&self) -> Vec<u32>;

    /// Starts the crashed server again on its port; returns once it serves.
    fn restart(&mut self);

    /// How long after a fault ends the lock may go without anyone entering
    /// it (and, with a queue, any one worker): a dead holder's lease, a dead
    /// waiter's time at the head of the queue, reconnecting, a server's
    /// recovery. The randomized run holds the engine to it.
    fn recovers_within(&self) -> Duration;

    /// For the randomized run: an outage as a real one would go, down for
    /// `down`: the server, or one of several (`pick` chooses), or a
    /// failover. False where the setup has none to give.
    fn outage(&mut self, pick: u64, down: Duration) -> bool {
        let _ = pick;
        if !Self::CRASHES {
            return false;
        }
        self.kill();
        std::thread::sleep(down);
        self.restart();
        true
    }

    /// For the randomized run: kills every client connection the servers
    /// hold (`CLIENT KILL`, `pg_terminate_backend`, `KILL CONNECTION`, a
    /// lease revoked); false where the server offers no way to.
    fn kill_connections(&self) -> bool {
        false
    }
}

/// Builds the fixture's engine through the registered kinds, from its
/// config, as an application would.
pub async fn engine(fixture: &impl Fixture) -> Arc<dyn Engine> {
    let text = format!("[engines.main]\n{}", fixture.engine_config());
    let config = Config::parse(&text, std::iter::empty()).expect("the fixture's config parses");
    dlock_engines::kinds()
        .build("main", &config.engines["main"])
        .await
        .expect("the fixture's engine connects")
}
