//! Deadlocks across processes. A task that holds locks and has waited
//! `deadlock_check` for another says so where every process can read it: a
//! *wait* for each lock it holds, itself a lock of the group
//! [`WAITS_GROUP`] on the waited lock's engine, named by the held lock's
//! owner digest and the waited lock (`<digest>/<group>/<name>`, the group
//! escaped). Records already show each holder's digest, so from a lock
//! one can go to its holders' waits, to the locks those wait for, and so
//! on: only the locks of the chain, across groups and engines. A chain
//! that comes back to one of the task's own holds is a cycle.
//!
//! Every member of a cycle sees the same waits, so each picks the same
//! one to give up: the youngest, whose wait began last by its record (an
//! owner digest breaks a tie), once two looks a quarter of a
//! `deadlock_check` apart found the cycle (the youngest, the last to post
//! its waits, finds it at its first look). It alone gets `Error::Deadlock`; its
//! request is withdrawn and its waits removed, and once it lets go of what
//! it holds the others go on. A task that holds nothing never looks: it
//! can close no cycle. Nor does one waiting for a permit, whose holders
//! are many (a cycle through a semaphore needs every permit's holder in
//! it), nor an engine whose records cannot be listed.

use std::collections::{BTreeMap, HashMap, HashSet, VecDeque};
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::time::{Duration, SystemTime};

use tokio::time::{Instant, sleep, sleep_until};

use crate::guard::Guard;
use crate::hold::Hold;
use crate::key::{percent_escape, percent_unescape};
use crate::kit::{Engine, Kind, Records, Request, within};
use crate::registry::{Engines, Group};
use crate::{Error, LockKey, LockView};

/// The group of the waits: on every engine, the core's own.
pub const WAITS_GROUP: &str = "dlock-waits";

/// How many locks a chain is followed through before it is left.
const LONGEST_CHAIN: usize = 64;

/// One link of a cycle: a lock, and who holds it, waiting for the next
/// link's lock (the last link's holder waits for the first's).
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize)]
pub struct Link {
    /// The lock's group.
    pub group: String,
    /// The lock's name.
    pub name: String,
    /// Its holder's label, where its record shows one.
    pub holder: Option<String>,
    /// Its holder's owner digest.
    pub owner: String,
    /// When its holder's wait for the next lock began, by its record.
    #[serde(serialize_with = "crate::records::millis")]
    pub waiting_since: Option<SystemTime>,
}

/// A cycle of waits: each link's holder waits for the next link's lock.
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize)]
pub struct Cycle {
    /// Its links, from the lock whose holder gives up
    /// ([`Cycle::youngest`]) on.
    pub links: Vec<Link>,
}

impl Cycle {
    /// The link whose holder gives up: the youngest wait, a tie broken by
    /// the greater owner digest. Every member picks the same one.
    pub fn youngest(&self) -> &Link {
        self.links
            .iter()
            .max_by(|a, b| (a.waiting_since, &a.owner).cmp(&(b.waiting_since, &b.owner)))
            .expect("a cycle has links")
    }

    /// The same cycle, starting at its youngest link: one order, whoever found it.
    fn youngest_first(mut self) -> Self {
        let youngest = self.youngest().clone();
        let at = self.links.iter().position(|l| *l == youngest).unwrap_or(0);
        self.links.rotate_left(at);
        self
    }
}

impl std::fmt::Display for Cycle {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        for link in &self.links {
            let holder = link.holder.as_deref().unwrap_or("?");
            write!(
                f,
                "{}/{} held by {holder} [{}], waiting for ",
                link.group, link.name, link.owner
            )?;
        }
        match self.links.first() {
            Some(first) => write!(f, "{}/{}", first.group, first.name),
            None => Ok(()),
        }
    }
}

/// A wait as its record shows it.
struct Waiting {
    /// Where the waited lock is: the engine the wait was found on.
    engine: Arc<dyn Engine>,
    waits_for: LockKey,
    since: Option<SystemTime>,
}

/// The name of the wait of the hold whose owner digest is `digest` for `key`.
fn wait_name(digest: &str, key: &LockKey) -> String {
    let mut name = format!("{digest}/");
    percent_escape(key.group(), |c| c == '/', &mut name);
    name.push('/');
    name.push_str(key.name());
    name
}

/// The owner digest and the waited lock a wait's name tells.
fn parse_wait_name(name: &str) -> Option<(String, LockKey)> {
    let (digest, rest) = name.split_once('/')?;
    let (group, lock) = rest.split_once('/')?;
    let key = LockKey::new(percent_unescape(group)?, lock.to_owned()).ok()?;
    Some((digest.to_owned(), key))
}

/// Every wait on the engines of `engines` that can list their records, by
/// the owner digest of the hold whose task waits; and the engines that
/// failed to answer, each with its failure.
async fn read_waits(engines: &Engines, call_timeout: Duration) -> (HashMap<String, Waiting>, Vec<Error>) {
    let (mut waits, mut failed) = (HashMap::new(), Vec::new());
    for (engine_name, engine) in engines.iter() {
        let Some(list) = engine.facets().list else {
            continue;
        };
        let until = Instant::now() + call_timeout;
        let views = match within(until, list.list(WAITS_GROUP)).await {
            Ok(views) => views,
            Err(error) => {
                failed.push(Error::Listing {
                    engine: engine_name.clone(),
                    kind: engine.kind(),
                    address: engine.address(),
                    group: WAITS_GROUP.to_owned(),
                    source: error.into(),
                });
                continue;
            }
        };
        for view in views {
            let (Some((digest, waits_for)), Some(holder)) =
                (parse_wait_name(&view.name), view.holders.first())
            else {
                continue;
            };
            let since = holder.since;
            let engine = engine.clone();
            waits.insert(
                digest,
                Waiting {
                    engine,
                    waits_for,
                    since,
                },
            );
        }
    }
    (waits, failed)
}

/// A lock's holders, by their records: (owner digest, label).
async fn holders(
    engine: &dyn Engine,
    key: &LockKey,
    call_timeout: Duration,
) -> Vec<(String, Option<String>)> {
    let Some(inspect) = engine.facets().inspect else {
        return Vec::new();
    };
    let until = Instant::now() + call_timeout;
    match within(until, inspect.inspect(key, None)).await {
        Ok(LockView { holders, .. }) => holders
            .into_iter()
            .filter_map(|h| Some((h.owner?, h.label)))
            .collect(),
        Err(_) => Vec::new(),
    }
}

/// The cycle that the waits close through one of `mine` (owner digests
/// of this task's holds), starting from the lock `waiting` on `engine`:
/// its holders, their waits, and so on, only along the chain.
async fn cycle_through(
    mine: &HashMap<String, Option<String>>,
    waiting: (Arc<dyn Engine>, LockKey),
    waits: &HashMap<String, Waiting>,
    call_timeout: Duration,
) -> Option<Cycle> {
    // Breadth first, each lock once; `came` keeps the link into each digest.
    let mut queue = VecDeque::from([(waiting, None::<String>)]);
    let mut seen_locks = HashSet::new();
    let mut came: HashMap<String, (Option<String>, LockKey, Option<String>)> = HashMap::new();
    while let Some(((engine, key), from)) = queue.pop_front() {
        if !seen_locks.insert((engine_ptr(&engine), key.clone())) || seen_locks.len() > LONGEST_CHAIN {
            continue;
        }
        for (digest, label) in holders(&*engine, &key, call_timeout).await {
            if came.contains_key(&digest) {
                continue;
            }
            came.insert(digest.clone(), (from.clone(), key.clone(), label));
            if mine.contains_key(&digest) {
                return Some(walk_back(&digest, &came, waits));
            }
            if let Some(wait) = waits.get(&digest) {
                queue.push_back(((wait.engine.clone(), wait.waits_for.clone()), Some(digest)));
            }
        }
    }
    None
}

/// An engine told apart from others by its address in memory.
fn engine_ptr(engine: &Arc<dyn Engine>) -> usize {
    Arc::as_ptr(engine) as *const () as usize
}

/// The cycle ending at this task's hold `last`, read back through `came`.
fn walk_back(
    last: &str,
    came: &HashMap<String, (Option<String>, LockKey, Option<String>)>,
    waits: &HashMap<String, Waiting>,
) -> Cycle {
    let mut links = Vec::new();
    let mut at = Some(last.to_owned());
    while let Some(digest) = at {
        let (from, key, label) = &came[&digest];
        links.push(Link {
            group: key.group().to_owned(),
            name: key.name().to_owned(),
            holder: label.clone(),
            waiting_since: waits.get(&digest).and_then(|w| w.since),
            owner: digest,
        });
        at = from.clone();
    }
    // Read back from this task's hold: each link's holder waits for the
    // lock of the link before it. Reversed, each waits for the next.
    links.reverse();
    Cycle { links }.youngest_first()
}

impl crate::Registry {
    /// Every cycle of waits between tasks holding locks, on every engine
    /// whose records can be listed (see [`Error::Deadlock`]): each names
    /// its locks, their holders' labels and owner digests, and since when
    /// each waits. A wait shows once it has lasted `deadlock_check`, and
    /// its cycle is gone once its youngest member gives up, a quarter of a
    /// `deadlock_check` later. `Error::Listing` if an engine could not
    /// answer. [`Locks::deadlocks`](crate::Locks::deadlocks) keeps a
    /// group's.
    pub async fn deadlocks(&self) -> Result<Vec<Cycle>, Error> {
        let (engines, call_timeout) = self.engines_and_call_timeout();
        cycles(engines, call_timeout).await
    }
}

/// Every cycle the waits on `engines` close, each once; an engine that
/// failed to answer fails it all, as what it holds may close one.
pub(crate) async fn cycles(engines: &Engines, call_timeout: Duration) -> Result<Vec<Cycle>, Error> {
    let (waits, failed) = read_waits(engines, call_timeout).await;
    if let Some(error) = failed.into_iter().next() {
        return Err(error);
    }
    let mut found: BTreeMap<Vec<String>, Cycle> = BTreeMap::new();
    for (digest, wait) in &waits {
        let mine = HashMap::from([(digest.clone(), None)]);
        let waiting = (wait.engine.clone(), wait.waits_for.clone());
        if let Some(cycle) = cycle_through(&mine, waiting, &waits, call_timeout).await {
            let mut owners: Vec<String> = cycle.links.iter().map(|l| l.owner.clone()).collect();
            owners.sort();
            found.entry(owners).or_insert(cycle);
        }
    }
    Ok(found.into_values().collect())
}

/// Runs `waited`, the wait for `req`'s lock; should it take
/// `deadlock_check` while this task holds locks, looks for a cycle of
/// waits through them, then every half of that, until `waited` ends. The
/// youngest member of a cycle found gets `Error::Deadlock` in its place.
pub(crate) async fn watched<T>(
    group: &Arc<Group>,
    req: &Request,
    since: Instant,
    waited: impl Future<Output = Result<T, Error>>,
    take: TakeWait,
) -> Result<T, Error> {
    let check = group.settings.deadlock_check;
    let mut waited = std::pin::pin!(waited);
    let looks = !check.is_zero()
        && !req.try_once
        && req.kind == Kind::Lock
        && group.capabilities.records == Records::Listed;
    if !looks {
        return waited.await;
    }
    tokio::select! {
        biased;
        out = &mut waited => return out,
        _ = sleep_until(since + check) => {}
    }
    let holds = crate::hold::held_by_this_task();
    if holds.is_empty() {
        return waited.await;
    }
    let (posted, ready) = post_waits(group, req, &holds, take);
    // Looked for only once posted: every member reads the same waits,
    // this one's among them.
    tokio::select! {
        biased;
        out = &mut waited => return out,
        _ = ready => {}
    }
    let mine: HashMap<String, Option<String>> = holds.iter().map(|h| (h.req.owner.digest(), None)).collect();
    let call_timeout = group.settings.call_timeout;
    // A cycle is acted on once two looks in a row found it: a wait that
    // ended just before a look (its record not yet gone) closes none.
    let mut seen_before: Option<Cycle> = None;
    loop {
        let look = async {
            // An engine that cannot answer now is read again at the next look.
            let (waits, _) = read_waits(&group.engines, call_timeout).await;
            let waiting = (group.engine.clone(), req.key.clone());
            cycle_through(&mine, waiting, &waits, call_timeout).await
        };
        let found = tokio::select! {
            biased;
            out = &mut waited => return out,
            found = look => found,
        };
        let again = found.is_some() && found == seen_before;
        match found {
            Some(cycle) if again && mine.contains_key(&cycle.youngest().owner) => {
                drop(posted);
                return Err(Error::Deadlock {
                    key: req.key.clone(),
                    cycle,
                });
            }
            found => seen_before = found,
        }
        // A cycle seen once is looked at again soon; none, half a check on.
        let next = if seen_before.is_some() {
            check / 4
        } else {
            check / 2
        };
        tokio::select! {
            biased;
            out = &mut waited => return out,
            _ = sleep(next) => {}
        }
    }
}

/// Takes the wait named so in its group, trying once: the acquisition's
/// own, handed in by it (a wait is a lock like any other).
pub(crate) type TakeWait = fn(Arc<Group>, String) -> Pin<Box<dyn Future<Output = Option<Guard>> + Send>>;

/// Posts a wait for each of `holds` and keeps them, renewed, in a task of
/// their own (so that they are no holds of this task), until dropped; the
/// receiver hears once they are posted (or could not be).
fn post_waits(
    group: &Arc<Group>,
    req: &Request,
    holds: &[Arc<Hold>],
    take: TakeWait,
) -> (Posted, tokio::sync::oneshot::Receiver<()>) {
    let waits = Arc::new(group.beside(WAITS_GROUP));
    let names: Vec<String> = holds
        .iter()
        .map(|h| wait_name(&h.req.owner.digest(), &req.key))
        .collect();
    let (posted, ready) = tokio::sync::oneshot::channel();
    let task = tokio::spawn(async move {
        let mut kept = Vec::new();
        for name in names {
            kept.extend(take(waits.clone(), name).await);
        }
        let _ = posted.send(());
        std::future::pending::<()>().await;
        drop(kept);
    });
    (Posted(task.abort_handle()), ready)
}

/// The posted waits: removed when dropped (their guards, dropped with the
/// task that keeps them, let go).
struct Posted(tokio::task::AbortHandle);

impl Drop for Posted {
    fn drop(&mut self) {
        self.0.abort();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_wait_name_reads_back_with_slashes_in_the_group_and_name() {
        let key = LockKey::new("g/roup%", "na/me").unwrap();
        let name = wait_name("0a1b2c3d", &key);
        assert_eq!(parse_wait_name(&name), Some(("0a1b2c3d".to_owned(), key)));
    }

    #[test]
    fn every_member_picks_the_same_youngest_and_order() {
        let at = |s: u64| Some(SystemTime::UNIX_EPOCH + Duration::from_secs(s));
        let link = |lock: &str, owner: &str, since| Link {
            group: "g".into(),
            name: lock.into(),
            holder: None,
            owner: owner.into(),
            waiting_since: since,
        };
        let a = Cycle {
            links: vec![
                link("A", "01", at(5)),
                link("B", "02", at(9)),
                link("C", "03", at(7)),
            ],
        }
        .youngest_first();
        let b = Cycle {
            links: vec![
                link("C", "03", at(7)),
                link("A", "01", at(5)),
                link("B", "02", at(9)),
            ],
        }
        .youngest_first();
        assert_eq!(a, b);
        assert_eq!(a.youngest().owner, "02");
        assert_eq!(a.links[0].owner, "02");
    }
}
