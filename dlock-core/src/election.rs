//! Leader election: one leader per name at a time, each with a term that
//! storage can check like a fencing token.
//!
//! An election is the write lock of its name. Campaigning waits for that
//! lock, the watchdog keeps it, and losing it ends the term; the term is
//! the hold's fence. So a leader is also what `dlock locks` lists, and an
//! operator can depose one by force (its term is refused after) or ask it
//! to step down (revoke).

use std::future::Future;
use std::sync::Arc;
use std::time::{Duration, SystemTime};

use crate::config::Wait;
use crate::kit::Kind;
use crate::{Error, Guard, Lock, LockView, Locks, LostReason, Mode};

impl Locks {
    /// The election named `name` in this group. Campaigning takes the
    /// write lock of that name, so an election and the lock of one name
    /// are one thing.
    pub fn election(&self, name: impl Into<Arc<str>>) -> Election {
        let mut lock = self.get(name).with_wait(Wait::Forever);
        lock.kind = Kind::Election(None);
        Election { lock }
    }
}

/// One leader at a time among the processes that campaign for it.
///
/// ```
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() -> Result<(), dlock::Error> {
/// let election = dlock::election("scheduler", "leader");
/// let term = election.campaign().await?; // waits until this process leads
/// // ... lead; hand term.number() to storage that checks fencing tokens ...
/// let leader = election.leader().await?.expect("someone leads");
/// assert_eq!(leader.term, term.number());
/// term.resign().await?;
/// assert_eq!(election.leader().await?, None);
/// # Ok(())
/// # }
/// ```
#[derive(Clone)]
pub struct Election {
    lock: Lock,
}

impl Election {
    /// The election's group.
    pub fn group(&self) -> &str {
        self.lock.group()
    }

    /// The election's name.
    pub fn name(&self) -> &str {
        self.lock.name()
    }

    /// Campaigns proposing `value` rather than the process's label: what
    /// observers, `etcdctl elect -l` and Curator are shown of this leader
    /// (a service's address, say). One printable line, as a label.
    /// `Error::Unsupported` at the campaign where the engine keeps no
    /// value of its own for a leader
    /// ([`Capabilities::election_values`](crate::kit::Capabilities::election_values)).
    pub fn with_value(mut self, value: impl Into<String>) -> Result<Self, Error> {
        let value = value.into();
        crate::config::check_label(&value).map_err(|problem| Error::config("election value", problem))?;
        self.lock.kind = Kind::Election(Some(value.into()));
        Ok(self)
    }

    /// How long the engine keeps a silent leader's term: the lock's lease.
    pub fn with_lease(mut self, lease: Duration) -> Self {
        self.lock = self.lock.with_lease(lease);
        self
    }

    /// Waits until this process leads, for as long as it takes.
    ///
    /// `Error::Unsupported` where the engine cannot give a term that only
    /// grows and that its records show (see [`Election::leader`]).
    pub async fn campaign(&self) -> Result<Term, Error> {
        self.check()?;
        Ok(Term(self.lock.acquire(Mode::Write).await?))
    }

    /// Who leads now, as the engine sees it; `None` while nobody does.
    pub async fn leader(&self) -> Result<Option<Leader>, Error> {
        self.check()?;
        Ok(Leader::of(&self.lock.inspect().await?))
    }

    /// Who leads, and each change of leader after, for anyone, campaigning
    /// or not.
    pub fn observe(&self) -> Observer {
        Observer {
            election: self.clone(),
            last: None,
            reported: None,
        }
    }

    /// Runs `work` while this process leads: campaigns, runs it with the
    /// term, cancels it when the term is lost and campaigns again. Asked to
    /// step down ([`Lock::revoke`](crate::Lock::revoke), `dlock revoke`), it
    /// cancels the work, resigns and campaigns again, behind the candidates
    /// already waiting. Returns what `work` returns once it ends while
    /// leading, after resigning.
    ///
    /// A failed campaign (a server away) is logged and tried again after a
    /// lease; what cannot succeed by trying again (an unsupported engine,
    /// a bad name) is returned.
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> Result<(), dlock::Error> {
    /// let election = dlock::election("cache", "warmer");
    /// let warmed = election.run_while_leader(|term| async move {
    ///     // ... work that storage fences with `term` ...
    ///     term
    /// }).await?;
    /// assert!(warmed > 0);
    /// # Ok(())
    /// # }
    /// ```
    pub async fn run_while_leader<F, Fut, T>(&self, mut work: F) -> Result<T, Error>
    where
        F: FnMut(u64) -> Fut,
        Fut: Future<Output = T>,
    {
        loop {
            let term = match self.campaign().await {
                Ok(term) => term,
                Err(error) if passes(&error) => {
                    tracing::warn!(group = self.group(), election = self.name(), %error, "campaign failed; trying again");
                    tokio::time::sleep(self.lock.lease).await;
                    continue;
                }
                Err(error) => return Err(error),
            };
            tokio::select! {
                // The loss first: a process resumed after a pause past its
                // lease stops before its work takes another step.
                biased;
                reason = term.lost() => {
                    tracing::warn!(group = self.group(), election = self.name(), term = term.number(), %reason, "leadership lost; campaigning again");
                }
                () = term.revoked() => {
                    tracing::info!(group = self.group(), election = self.name(), term = term.number(), "asked to step down; campaigning again");
                    if let Err(error) = term.resign().await {
                        tracing::warn!(group = self.group(), election = self.name(), %error, "stepping down");
                    }
                    self.behind_the_waiting().await;
                }
                done = work(term.number()) => {
                    term.resign().await?;
                    return Ok(done);
                }
            }
        }
    }

    /// After stepping down: with no queue on the server, a candidate that
    /// campaigned again at once would win the race it just left, so it
    /// waits two of the longest pauses between polls, in which every
    /// candidate already waiting tries.
    async fn behind_the_waiting(&self) {
        let group = &self.lock.group;
        if group.capabilities.fairness == crate::kit::Fairness::None {
            tokio::time::sleep(group.settings.poll.max_interval() * 2).await;
        }
    }

    /// An election needs terms that only grow, shown in the records.
    fn check(&self) -> Result<(), Error> {
        let group = &self.lock.group;
        if !group.capabilities.election() {
            return Err(group.unsupported("leader election".to_owned()));
        }
        Ok(())
    }
}

/// Errors that may pass when tried again.
fn passes(error: &Error) -> bool {
    matches!(error, Error::Engine { .. } | Error::Unavailable { .. })
}

/// This process's leadership: from the campaign that won to a resign, a
/// drop, or the loss of the hold under it.
#[must_use = "leadership ends as soon as the term is dropped"]
#[derive(Debug)]
pub struct Term(Guard);

impl Term {
    /// The term's number: greater than every earlier leader's. Storage
    /// that refuses numbers below the greatest it has seen refuses a
    /// deposed leader's writes.
    pub fn number(&self) -> u64 {
        self.0.fence()
    }

    /// Whether the term is known to have ended.
    pub fn is_lost(&self) -> bool {
        self.0.is_lost()
    }

    /// Resolves when the term ends without a resign, with why; a paused
    /// process sees it before it acts again.
    pub fn lost(&self) -> impl Future<Output = LostReason> + Send + 'static {
        self.0.lost()
    }

    /// Resolves when an operator asks this leader to step down
    /// ([`Lock::revoke`]); stepping down is the leader's choice.
    pub fn revoked(&self) -> impl Future<Output = ()> + Send + 'static {
        self.0.revoked()
    }

    /// The hold of the election's lock under this term, for code written
    /// for guards; its fence is the term's number.
    pub fn into_guard(self) -> Guard {
        self.0
    }

    /// Ends the term, so that the next candidate leads.
    pub async fn resign(self) -> Result<(), Error> {
        self.0.release().await
    }
}

/// Who leads an election.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Leader {
    /// What the leader shows: the value it campaigned with, where the
    /// engine keeps one ([`Election::with_value`]), else its process's
    /// label (`client_name`); `None` for a leader that shows neither (an
    /// `etcdctl elect` or Curator candidate with an empty one).
    pub label: Option<String>,
    /// Its term.
    pub term: u64,
    /// When its campaign's key or node was made (it may have waited in
    /// line before it led), by the server's clock; `None` where the engine
    /// keeps no time (etcd).
    pub since: Option<SystemTime>,
}

impl Leader {
    /// The writer holding the election's lock, if it shows a fence.
    fn of(view: &LockView) -> Option<Leader> {
        let holder = view.holders.iter().find(|h| h.mode == Mode::Write)?;
        Some(Leader {
            label: holder.label.clone(),
            term: holder.fence?,
            since: holder.since,
        })
    }
}

/// Reports who leads, then each change. Never reports a leader whose term
/// is older than one it reported before, whatever replica or stale read
/// answered. It reads the election's records (one inspect) every longest
/// pause of the group's `poll` setting, 200 ms by default, on every
/// engine: a change shows within about that, and a term shorter than that
/// may pass unreported.
pub struct Observer {
    election: Election,
    /// The term of what `next` last returned (`None`: nobody led); `None`
    /// before the first call.
    last: Option<Option<u64>>,
    /// The greatest term reported.
    reported: Option<u64>,
}

impl Observer {
    /// The leader now on the first call; after that, waits for the next
    /// change (a new leader, or nobody leading) and returns it.
    pub async fn next(&mut self) -> Result<Option<Leader>, Error> {
        let every = self.election.lock.group.settings.poll.max_interval();
        loop {
            let now = self.election.leader().await?;
            let stale = matches!((&now, self.reported), (Some(leader), Some(top)) if leader.term < top);
            // A change of leader, not of what a record says meanwhile (a
            // revocation's mark hides a ZooKeeper leader's label a while).
            let term = now.as_ref().map(|leader| leader.term);
            if self.last != Some(term) && !stale {
                self.reported = term.or(self.reported);
                self.last = Some(term);
                return Ok(now);
            }
            tokio::time::sleep(every).await;
        }
    }

    /// Waits for the next report of a leader, past any time nobody leads.
    pub async fn next_leader(&mut self) -> Result<Leader, Error> {
        loop {
            if let Some(leader) = self.next().await? {
                return Ok(leader);
            }
        }
    }
}
