//! What an engine promises about its locks ([`Guarantees`], declared), and
//! the summary of all it offers ([`Capabilities`], derived).

use std::time::Duration;

use super::{Engine, Facets};

/// What an engine promises about its locks, declared once per engine
/// ([`Engine::guarantees`]). The default promises the least: write mode
/// only, no queue, no fencing, leases in whole seconds.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Guarantees {
    /// Read (shared) mode; without it read requests get `Error::Unsupported`.
    pub read: bool,
    /// Whether the server keeps a queue; see [`Fairness`].
    pub fairness: Fairness,
    /// How far the fencing token can be trusted; see [`Fencing`].
    pub fencing: Fencing,
    /// What ends a hold nobody renews; see [`Expiry`].
    pub expiry: Expiry,
    /// Leases count whole units of this (1 s on servers whose TTLs are in
    /// seconds); a shorter lease gets `Error::Unsupported`.
    pub lease_unit: Duration,
    /// A queued request that does not poll within this is dropped as dead;
    /// the core then checks at startup that waiters poll often enough. It is
    /// the engine's `waiter_ttl` setting.
    pub waiter_ttl: Option<Duration>,
}

impl Default for Guarantees {
    fn default() -> Self {
        Guarantees {
            read: false,
            fairness: Fairness::None,
            fencing: Fencing::None,
            expiry: Expiry::Lease,
            lease_unit: Duration::from_secs(1),
            waiter_ttl: None,
        }
    }
}

/// All an engine offers, in one summary: its [`Guarantees`] and which
/// [`Facets`] it has. Derived, never declared
/// (`engine.capabilities()`):
/// the core refuses what an engine lacks with a typed error, the
/// conformance suite runs or skips its cases by it, and the guarantee
/// table (`docs/guarantees.md`) uses its words ([`Capabilities::words`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Capabilities {
    /// Read (shared) mode.
    pub read: bool,
    /// Whether the server keeps a queue.
    pub fairness: Fairness,
    /// How far the fencing token can be trusted.
    pub fencing: Fencing,
    /// What ends a hold nobody renews.
    pub expiry: Expiry,
    /// The unit leases count in.
    pub lease_unit: Duration,
    /// How long a queued request may go without polling.
    pub waiter_ttl: Option<Duration>,
    /// The [`Semaphores`](super::Semaphores) facet.
    pub semaphore: bool,
    /// Permits in slots, each fenced on its own
    /// ([`Semaphores::slots`](super::Semaphores::slots)).
    pub slots: bool,
    /// The [`Inspect`](super::Inspect) and [`List`](super::List) facets.
    pub records: Records,
    /// Whether a record shows the hold's fence
    /// ([`Inspect::shows_fences`](super::Inspect::shows_fences)).
    pub fence_in_records: bool,
    /// Whether a record shows the hold's lease and last renewal
    /// ([`Inspect::shows_renewals`](super::Inspect::shows_renewals)).
    pub renewals_in_records: bool,
    /// The [`Control`](super::Control) facet: force release and revoke.
    pub control: bool,
    /// The [`PermitControl`](super::PermitControl) facet: force release and
    /// revoke of permits.
    pub permit_control: bool,
    /// The [`HoldAtLeast`](super::HoldAtLeast) facet.
    pub hold_at_least: bool,
    /// The [`ElectionValues`](super::ElectionValues) facet.
    pub election_values: bool,
    /// The [`Watch`](super::Watch) facet.
    pub watch: bool,
    /// The [`HeldWrites`](super::HeldWrites) facet.
    pub held_writes: bool,
}

impl Capabilities {
    /// What `engine` offers: its guarantees, and a flag per facet it has.
    pub fn of(engine: &(impl Engine + ?Sized)) -> Self {
        let Guarantees {
            read,
            fairness,
            fencing,
            expiry,
            lease_unit,
            waiter_ttl,
        } = engine.guarantees();
        let Facets {
            semaphores,
            inspect,
            list,
            control,
            permit_control,
            hold_at_least,
            election_values,
            watch,
            held_writes,
        } = engine.facets();
        Capabilities {
            read,
            fairness,
            fencing,
            expiry,
            lease_unit,
            waiter_ttl,
            semaphore: semaphores.is_some(),
            slots: semaphores.is_some_and(|semaphores| semaphores.slots()),
            records: match (&inspect, &list) {
                (None, _) => Records::None,
                (Some(_), None) => Records::ByName,
                (Some(_), Some(_)) => Records::Listed,
            },
            fence_in_records: inspect.is_some_and(|inspect| inspect.shows_fences()),
            renewals_in_records: inspect.is_some_and(|inspect| inspect.shows_renewals()),
            control: control.is_some(),
            permit_control: permit_control.is_some(),
            hold_at_least: hold_at_least.is_some(),
            election_values: election_values.is_some(),
            watch: watch.is_some(),
            held_writes: held_writes.is_some(),
        }
    }

    /// Whether leader election works here: it needs terms that only grow
    /// and that the records show, for observers to tell leaders apart.
    pub fn election(&self) -> bool {
        self.fencing == Fencing::Strict && self.fence_in_records && self.records != Records::None
    }

    /// The shortest lease this engine accepts.
    pub fn min_lease(&self) -> Duration {
        self.lease_unit.max(crate::config::MIN_LEASE)
    }

    /// `read write, fifo, fence strict, ends with lease, lease unit 1ms,
    /// semaphores, records listed, force release, revoke, hold at least`:
    /// the words the guarantee table uses.
    pub fn words(&self) -> String {
        format!(
            "{}, {}, fence {}, ends with {}, lease unit {:?}, {}, {}{}{}{}, {}{}, {}, {}, {}",
            if self.read { "read write" } else { "write only" },
            self.fairness.as_str(),
            self.fencing.as_str(),
            self.expiry.as_str(),
            self.lease_unit,
            match (self.semaphore, self.slots) {
                (true, true) => "semaphores in slots",
                (true, false) => "semaphores",
                (false, _) => "no semaphores",
            },
            self.records.as_str(),
            match self.records != Records::None && !self.fence_in_records {
                true => " without fences",
                false => "",
            },
            if self.renewals_in_records {
                " with renewals"
            } else {
                ""
            },
            if self.watch { ", watched" } else { "" },
            if self.control {
                "force release, revoke"
            } else {
                "no force release, no revoke"
            },
            if self.permit_control { " (permits too)" } else { "" },
            if self.hold_at_least {
                "hold at least"
            } else {
                "no hold at least"
            },
            match (self.election(), self.election_values) {
                (true, true) => "election with values",
                (true, false) => "election",
                (false, _) => "no election",
            },
            if self.held_writes {
                "held writes"
            } else {
                "no held writes"
            },
        )
    }
}

/// What an engine can tell about who holds and who waits.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Records {
    /// Nothing: inspecting gets `Error::Unsupported`.
    None,
    /// One lock or semaphore by name ([`Inspect`](super::Inspect)).
    ByName,
    /// That, and a group's locks and semaphores ([`List`](super::List)).
    Listed,
}

impl Records {
    /// The guarantee table's words.
    pub fn as_str(self) -> &'static str {
        match self {
            Records::None => "no records",
            Records::ByName => "records by name",
            Records::Listed => "records listed",
        }
    }
}

/// Who gets the lock next.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Fairness {
    /// The server keeps a queue: first come, first served across clients,
    /// queued readers admitted together.
    Fifo,
    /// No queue on the server: whoever tries first after a release. With
    /// `queue = "local"` a process still serves its own waiters in order.
    None,
}

impl Fairness {
    /// The word the guarantee table uses: `fifo`, `no queue`.
    pub fn as_str(self) -> &'static str {
        match self {
            Fairness::Fifo => "fifo",
            Fairness::None => "no queue",
        }
    }
}

/// How far the fencing token can be trusted.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Fencing {
    /// Strictly increasing per lock, across holders and server restarts.
    Strict,
    /// Strictly increasing while the server keeps its memory; a restart or
    /// eviction may repeat a token (the engine's docs say exactly when).
    BestEffort,
    /// No ordering: the token only tells holds apart.
    None,
}

impl Fencing {
    /// The word the guarantee table uses: `strict`, `best effort`, `none`.
    pub fn as_str(self) -> &'static str {
        match self {
            Fencing::Strict => "strict",
            Fencing::BestEffort => "best effort",
            Fencing::None => "none",
        }
    }
}

/// What ends a hold whose holder stops renewing it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Expiry {
    /// The server forgets the hold once its lease runs out unrenewed.
    Lease,
    /// The hold lives as long as the client's session with the server: a
    /// crashed or cut-off client loses it after the session timeout, a live
    /// one keeps it until it lets go (ZooKeeper, etcd).
    Session,
    /// The hold lives as long as the client's connection. No built-in
    /// engine declares it: the postgres engine's sessions end one lease
    /// after their last statement, so it declares [`Expiry::Lease`].
    Connection,
}

impl Expiry {
    /// The word the guarantee table uses: `lease`, `session`, `connection`.
    pub fn as_str(self) -> &'static str {
        match self {
            Expiry::Lease => "lease",
            Expiry::Session => "session",
            Expiry::Connection => "connection",
        }
    }
}
