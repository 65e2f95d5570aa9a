//! Records: the engine's copy of the bucket, brought up to the stream's
//! last revision, shows each line's holders (label, owner digest, fence,
//! slot, lease and last renewal by the holder's clock) and its waiters in
//! line.

use std::collections::HashMap;

use dlock_core::kit::EngineError;
use dlock_core::{HolderRecord, LockKey, LockView, Mode, WaiterRecord};

use super::keys::{Line, Stake, group_prefix};
use super::mirror::Found;
use super::{NatsEngine, Rule, failed};

impl NatsEngine {
    /// Brings the copy up to the stream's last revision, which it returns.
    pub(super) async fn current(&self) -> Result<u64, EngineError> {
        let mut stream = self.stream.clone();
        let last = stream.info().await.map_err(failed)?.state.last_sequence;
        self.mirror.caught_up(last, self.limit).await.map_err(failed)?;
        Ok(last)
    }

    /// `line`'s contenders, from a copy at least as new as the stream was
    /// when asked.
    pub(super) async fn read_line(&self, line: &Line) -> Result<Vec<Found>, EngineError> {
        let last = self.current().await?;
        self.mirror
            .line(line, last)
            .map(|(found, _)| found)
            .ok_or_else(|| failed("nats: the bucket's watch is being read again"))
    }
}

pub(super) async fn inspect(
    engine: &NatsEngine,
    key: &LockKey,
    permits: Option<u32>,
) -> Result<LockView, EngineError> {
    let (line, rule) = match permits {
        None => (Line::lock(key), Rule::Lock),
        Some(count) => (Line::semaphore(key), Rule::Permits(count)),
    };
    let found = engine.read_line(&line).await?;
    Ok(view(engine, key.group(), key.name(), &line, rule, &found))
}

/// Every lock and semaphore of `group` that someone holds or waits for.
pub(super) async fn list(engine: &NatsEngine, group: &str) -> Result<Vec<LockView>, EngineError> {
    engine.current().await?;
    let mut views = Vec::new();
    for kind in ['l', 's'] {
        for (line, found) in engine.mirror.lines(&group_prefix(kind, group)) {
            let Some(first) = found.first() else { continue };
            let Some(name) = line
                .names()
                .1
                .or_else(|| first.stake.n.clone().map(|(_, name)| name))
            else {
                continue;
            };
            let rule = match first.stake.k {
                Some(count) => Rule::Permits(count),
                None => Rule::Lock,
            };
            views.push(view(engine, group, &name, &line, rule, &found));
        }
    }
    Ok(views)
}

fn view(engine: &NatsEngine, group: &str, name: &str, line: &Line, rule: Rule, found: &[Found]) -> LockView {
    let slots = slots(engine, line, rule);
    let holding = rule.holding(found);
    LockView {
        group: group.to_owned(),
        name: name.to_owned(),
        permits: match rule {
            Rule::Lock => None,
            Rule::Permits(count) => Some(found.iter().find_map(|f| f.stake.k).unwrap_or(count)),
        },
        holders: found[..holding].iter().map(|f| holder(f, &slots)).collect(),
        waiters: found[holding..].iter().map(|f| waiter(&f.stake)).collect(),
    }
}

/// A semaphore's slots by the owner holding each: its number and fence.
fn slots(engine: &NatsEngine, line: &Line, rule: Rule) -> HashMap<String, (u32, u64)> {
    let Rule::Permits(count) = rule else {
        return HashMap::new();
    };
    (0..count)
        .filter_map(|number| {
            let found = engine.mirror.get(&line.slot(number))?;
            Some((found.stake.o, (number, found.created)))
        })
        .collect()
}

fn mode(stake: &Stake) -> Mode {
    match stake.is_writer() {
        true => Mode::Write,
        false => Mode::Read,
    }
}

fn holder(found: &Found, slots: &HashMap<String, (u32, u64)>) -> HolderRecord {
    let stake = &found.stake;
    let slot = slots.get(&stake.o);
    let fence = match slots.is_empty() {
        true => Some(found.created),
        false => slot.map(|(_, fence)| *fence),
    };
    HolderRecord {
        label: Some(stake.l.clone()),
        mode: mode(stake),
        fence,
        slot: slot.map(|(number, _)| *number),
        since: Some(stake.since()),
        owner: stake.owner().map(|owner| owner.digest()),
        ..HolderRecord::default()
    }
    .leased(stake.renewed() + stake.lease(), stake.lease())
}

fn waiter(stake: &Stake) -> WaiterRecord {
    WaiterRecord {
        label: Some(stake.l.clone()),
        mode: mode(stake),
        since: Some(stake.since()),
        owner: stake.owner().map(|owner| owner.digest()),
    }
}
