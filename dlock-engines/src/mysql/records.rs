//! Who holds and who waits, read back: a lock's or semaphore's live rows in
//! ticket order (holders and waiters), and for a lock the session holding
//! its gate with that hold's record (`gate_records.rs`). Times are the
//! server's. A write hold taken at once ends with its session, so it shows
//! no lease end; rows of older dlock versions show no fence, time or label.

use std::collections::BTreeMap;
use std::time::{Duration, SystemTime};

use dlock_core::kit::{EngineError, OwnerId, RECORD_WAIT};
use dlock_core::{HolderRecord, LockKey, LockView, Mode, WaiterRecord};
use mysql_async::prelude::{Queryable, ToValue};
use mysql_async::{Pool, Value};

use super::gate;
use super::permits::{Range, count_of};
use super::sql::key_and_name;

/// A row's columns, as [`Row`] reads them; a `DATETIME(6)` (which holds
/// UTC) as microseconds since the epoch.
const ROW: &str = "lock_key, name, owner, mode, held, TIMESTAMPDIFF(MICROSECOND, '1970-01-01', expires), \
     fence, TIMESTAMPDIFF(MICROSECOND, '1970-01-01', since), label, slot";

type RowColumns = (
    Vec<u8>,
    Option<Vec<u8>>,
    Vec<u8>,
    u8,
    u8,
    i64,
    Option<u64>,
    Option<i64>,
    Option<Vec<u8>>,
    Option<u32>,
);

/// One live row of `dlock_queue`.
struct Row {
    key: Vec<u8>,
    name: Option<Vec<u8>>,
    owner: Option<String>,
    mode: Mode,
    held: bool,
    expires: Option<SystemTime>,
    fence: Option<u64>,
    since: Option<SystemTime>,
    label: Option<String>,
    slot: Option<u32>,
}

impl From<RowColumns> for Row {
    fn from((key, name, owner, mode, held, expires, fence, since, label, slot): RowColumns) -> Row {
        Row {
            key,
            name,
            owner: digest(&owner),
            mode: if mode == 1 { Mode::Read } else { Mode::Write },
            held: held == 1,
            expires: time(expires),
            fence,
            since: since.and_then(time),
            label: label.and_then(|l| String::from_utf8(l).ok()),
            slot,
        }
    }
}

/// A write hold taken at once: its record's fields, all `None` if it wrote
/// none.
#[derive(Default)]
struct GateHolder {
    owner: Option<String>,
    fence: Option<u64>,
    since: Option<SystemTime>,
    label: Option<String>,
}

type GateColumns = (Option<String>, Option<u64>, Option<i64>, Option<Vec<u8>>);

impl From<GateColumns> for GateHolder {
    fn from((owner, fence, since, label): GateColumns) -> GateHolder {
        GateHolder {
            owner,
            fence,
            since: since.and_then(time),
            label: label.and_then(|l| String::from_utf8(l).ok()),
        }
    }
}

impl GateHolder {
    fn record(self) -> HolderRecord {
        HolderRecord {
            label: self.label,
            mode: Mode::Write,
            fence: self.fence,
            since: self.since,
            lease_ends: None,
            owner: self.owner,
            ..HolderRecord::default()
        }
    }
}

/// Lock or semaphore `key`. A lock whose gate is held with no record (a
/// hold younger than `kit::RECORD_AFTER`, or a grant through the table in
/// progress) is read again once the hold would have written it; a gate
/// still held with no record and no held row is a hold that writes none
/// (an older dlock's), shown with what is known: a writer.
pub async fn inspect(pool: &Pool, key: &LockKey, permits: Option<u32>) -> Result<LockView, EngineError> {
    let mut conn = pool.get_conn().await.map_err(EngineError::failed)?;
    let (condition, params) = match permits {
        Some(count) => {
            let range = Range::of(key, count);
            (
                "lock_key BETWEEN ? AND ? AND name <=> ?",
                vec![range.low.to_value(), range.high.to_value(), range.name.to_value()],
            )
        }
        None => {
            let (key, name) = key_and_name(key);
            (
                "lock_key = ? AND name <=> ?",
                vec![key.to_value(), name.to_value()],
            )
        }
    };
    let rows_statement = format!(
        "SELECT {ROW} FROM dlock_queue WHERE {condition} AND expires > UTC_TIMESTAMP(6) ORDER BY ticket"
    );
    let mut waited = false;
    loop {
        let rows: Vec<RowColumns> = conn
            .exec(&rows_statement, params.clone())
            .await
            .map_err(EngineError::failed)?;
        let rows: Vec<Row> = rows.into_iter().map(Row::from).collect();
        let gate = match permits {
            Some(_) => None,
            None => gate_holder(&mut conn, key).await?,
        };
        let gate = match gate {
            Some(None) if !waited => {
                waited = true;
                tokio::time::sleep(RECORD_WAIT).await;
                continue;
            }
            Some(None) if rows.iter().any(|r| r.held) => None,
            Some(holder) => Some(holder.unwrap_or_default()),
            None => None,
        };
        let permits = permits.map(|asked| rows.first().and_then(|r| count_of(&r.key)).unwrap_or(asked));
        return Ok(view(key, permits, gate, rows));
    }
}

/// Whether the gate of lock `key` is held (`Some`), and the hold's record
/// if it wrote one.
async fn gate_holder(
    conn: &mut mysql_async::Conn,
    key: &LockKey,
) -> Result<Option<Option<GateHolder>>, EngineError> {
    let (lock_key, name) = key_and_name(key);
    let gate = gate::name(key);
    let statement = "SELECT IS_USED_LOCK(?), g.owner, g.fence, TIMESTAMPDIFF(MICROSECOND, '1970-01-01', g.since), \
         g.label FROM (SELECT 1) one LEFT JOIN dlock_gates g \
         ON g.gate = ? AND g.conn = IS_USED_LOCK(?) AND g.lock_key = ? AND g.name <=> ?";
    let params: Vec<Value> = vec![
        gate.to_value(),
        gate.to_value(),
        gate.to_value(),
        lock_key.to_value(),
        name.to_value(),
    ];
    type Columns = (
        Option<u64>,
        Option<String>,
        Option<u64>,
        Option<i64>,
        Option<Vec<u8>>,
    );
    let found: Option<Columns> = conn
        .exec_first(statement, params)
        .await
        .map_err(EngineError::failed)?;
    Ok(match found {
        Some((Some(_), owner, fence, since, label)) => Some(
            owner
                .is_some()
                .then(|| GateHolder::from((owner, fence, since, label))),
        ),
        _ => None,
    })
}

/// A gate record's key, name, owner digest, fence, since and label.
type ListedGate = (Vec<u8>, Option<Vec<u8>>, String, u64, i64, Vec<u8>);

/// What a listing found of one lock or semaphore.
type Found = (Option<GateHolder>, Vec<Row>);

/// Every lock and semaphore of `group` that someone holds or waits for.
/// It first waits for write holds taken just before to write their records:
/// one that has none cannot be found (a gate's name is a hash).
pub async fn list(pool: &Pool, group: &str) -> Result<Vec<LockView>, EngineError> {
    if LockKey::new(group, "-").is_err() {
        return Ok(Vec::new());
    }
    tokio::time::sleep(RECORD_WAIT).await;
    let mut conn = pool.get_conn().await.map_err(EngineError::failed)?;
    // A lock's readable key, or a hashed one's full name, starts with
    // 0x01 and the group's length and bytes; a semaphore's with 0x03.
    let stem = [&[1, group.len() as u8][..], group.as_bytes()].concat();
    let semaphore_stem = [&[3u8][..], &stem[1..]].concat();
    let rows: Vec<RowColumns> = conn
        .exec(
            format!(
                "SELECT {ROW} FROM dlock_queue WHERE expires > UTC_TIMESTAMP(6) \
                 AND LEFT(COALESCE(name, lock_key), ?) IN (?, ?) ORDER BY ticket"
            ),
            vec![stem.len().to_value(), stem.to_value(), semaphore_stem.to_value()],
        )
        .await
        .map_err(EngineError::failed)?;
    let gates: Vec<ListedGate> = conn
        .exec(
            "SELECT lock_key, name, owner, fence, TIMESTAMPDIFF(MICROSECOND, '1970-01-01', since), label \
             FROM dlock_gates WHERE IS_USED_LOCK(gate) = conn AND LEFT(COALESCE(name, lock_key), ?) = ?",
            vec![stem.len().to_value(), stem.to_value()],
        )
        .await
        .map_err(EngineError::failed)?;
    // By name and count: the gate's holder, and the rows.
    let mut found: BTreeMap<(String, Option<u32>), Found> = BTreeMap::new();
    for (key, name, owner, fence, since, label) in gates {
        if let Some((_, lock, None)) = locate(&key, name.as_deref()) {
            let holder = GateHolder::from((Some(owner), Some(fence), Some(since), Some(label)));
            found.entry((lock, None)).or_default().0 = Some(holder);
        }
    }
    for row in rows.into_iter().map(Row::from) {
        if let Some((_, lock, permits)) = locate(&row.key, row.name.as_deref()) {
            found.entry((lock, permits)).or_default().1.push(row);
        }
    }
    Ok(found
        .into_iter()
        .filter_map(|((name, permits), (gate, rows))| {
            let key = LockKey::new(group, name.as_str()).ok()?;
            Some(view(&key, permits, gate, rows))
        })
        .collect())
}

/// The view of `key` from its gate's holder and its live rows, in ticket order.
fn view(key: &LockKey, permits: Option<u32>, gate: Option<GateHolder>, rows: Vec<Row>) -> LockView {
    let mut view = LockView {
        group: key.group().to_owned(),
        name: key.name().to_owned(),
        permits,
        holders: gate.map(GateHolder::record).into_iter().collect(),
        waiters: Vec::new(),
    };
    for row in rows {
        if row.held {
            view.holders.push(HolderRecord {
                label: row.label,
                mode: row.mode,
                fence: row.fence,
                since: row.since,
                lease_ends: row.expires,
                owner: row.owner,
                slot: row.slot,
                ..HolderRecord::default()
            });
        } else {
            view.waiters.push(WaiterRecord {
                label: row.label,
                mode: row.mode,
                since: row.since,
                owner: row.owner,
            });
        }
    }
    view
}

/// The group, name and, for a semaphore, count of a row or gate record,
/// from its `lock_key` and, when that is a hash, its `name` (see
/// `sql::key_and_name` and `permits::Range`).
fn locate(key: &[u8], name: Option<&[u8]>) -> Option<(String, String, Option<u32>)> {
    match key.first()? {
        1 => readable(key, false).map(|(g, n)| (g, n, None)),
        2 => readable(name?, false).map(|(g, n)| (g, n, None)),
        3 => readable(&key[..key.len().checked_sub(4)?], true).map(|(g, n)| (g, n, count_of(key))),
        4 => readable(name?, true).map(|(g, n)| (g, n, count_of(key))),
        _ => None,
    }
}

/// The group and name of a readable key: its kind, the group's length, the
/// group, then the name (after its 2-byte length, for a semaphore).
fn readable(full: &[u8], semaphore: bool) -> Option<(String, String)> {
    let group_len = usize::from(*full.get(1)?);
    let group = full.get(2..2 + group_len)?;
    let mut name = full.get(2 + group_len..)?;
    if semaphore {
        name = name.get(2..)?;
    }
    let text = |bytes: &[u8]| String::from_utf8(bytes.to_vec()).ok();
    Some((text(group)?, text(name)?))
}

/// The digest of an owner id stored as 16 bytes; the id goes no further.
pub(super) fn digest(owner: &[u8]) -> Option<String> {
    let bits = u128::from_be_bytes(owner.try_into().ok()?);
    Some(OwnerId::from_u128(bits).digest())
}

fn time(micros: i64) -> Option<SystemTime> {
    Some(SystemTime::UNIX_EPOCH + Duration::from_micros(u64::try_from(micros).ok()?))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rows_and_records_come_back_to_their_group_and_name() {
        let key = LockKey::new("g", "a b").unwrap();
        let (lock_key, name) = key_and_name(&key);
        assert_eq!(
            locate(&lock_key, name.as_deref()),
            Some(("g".into(), "a b".into(), None))
        );
        let range = Range::of(&key, 3);
        assert_eq!(
            locate(&range.key, range.name.as_deref()),
            Some(("g".into(), "a b".into(), Some(3)))
        );
        let long = "n".repeat(300);
        let hashed = LockKey::new("g", long.as_str()).unwrap();
        let (lock_key, name) = key_and_name(&hashed);
        assert_eq!(
            locate(&lock_key, name.as_deref()),
            Some(("g".into(), long.clone(), None))
        );
        let range = Range::of(&hashed, 2);
        assert_eq!(
            locate(&range.key, range.name.as_deref()),
            Some(("g".into(), long, Some(2)))
        );
    }

    #[test]
    fn a_stored_owner_shows_as_its_digest_only() {
        let owner = OwnerId::random();
        let shown = digest(&owner.as_u128().to_be_bytes()).unwrap();
        assert_eq!(shown, owner.digest());
        assert_eq!(digest(b"short"), None);
    }
}
