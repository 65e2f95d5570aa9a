//! The table a person reads: one row per holder and waiter, times as how
//! long ago and how long left.

use std::time::{Duration, SystemTime};

use comfy_table::Table;
use dlock::LockView;

/// Every view's holders and waiters, `now` being the time of reading.
pub fn table(views: &[LockView], now: SystemTime) -> String {
    let mut table = Table::new();
    table.load_style(comfy_table::presets::NOTHING);
    table.set_header([
        "LOCK",
        "ROLE",
        "MODE",
        "LABEL",
        "OWNER",
        "FENCE",
        "SINCE",
        "LEASE LEFT",
    ]);
    for view in views {
        let lock = match view.permits {
            Some(n) => format!("{}/{} ({n} permits)", view.group, view.name),
            None => format!("{}/{}", view.group, view.name),
        };
        if view.is_free() {
            table.add_row([lock.as_str(), "free", "", "", "", "", "", ""]);
        }
        for h in &view.holders {
            table.add_row([
                lock.clone(),
                h.slot
                    .map_or("holder".into(), |slot| format!("holder, slot {slot}")),
                h.mode.as_str().into(),
                text(&h.label),
                text(&h.owner),
                h.fence.map_or("-".into(), |f| f.to_string()),
                h.since.map_or("-".into(), |t| ago(now, t)),
                h.lease_ends.map_or("-".into(), |t| left(now, t)),
            ]);
        }
        for (place, w) in view.waiters.iter().enumerate() {
            table.add_row([
                lock.clone(),
                format!("waiter {}", place + 1),
                w.mode.as_str().into(),
                text(&w.label),
                text(&w.owner),
                "-".into(),
                w.since.map_or("-".into(), |t| ago(now, t)),
                "-".into(),
            ]);
        }
    }
    if views.is_empty() {
        return "nothing held\n".to_owned();
    }
    format!("{table}\n")
}

fn text(field: &Option<String>) -> String {
    field.clone().unwrap_or_else(|| "-".into())
}

fn ago(now: SystemTime, then: SystemTime) -> String {
    format!("{} ago", span(now.duration_since(then).unwrap_or_default()))
}

fn left(now: SystemTime, ends: SystemTime) -> String {
    span(ends.duration_since(now).unwrap_or_default())
}

/// `850ms`, `12.3s`, `4m05s`, `2h03m`.
fn span(d: Duration) -> String {
    let secs = d.as_secs();
    match secs {
        0 => format!("{}ms", d.as_millis()),
        1..60 => format!("{:.1}s", d.as_secs_f64()),
        60..3600 => format!("{}m{:02}s", secs / 60, secs % 60),
        _ => format!("{}h{:02}m", secs / 3600, secs % 3600 / 60),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn spans_read_at_a_glance() {
        let ms = Duration::from_millis;
        assert_eq!(span(ms(850)), "850ms");
        assert_eq!(span(ms(12_340)), "12.3s");
        assert_eq!(span(ms(245_000)), "4m05s");
        assert_eq!(span(ms(7_380_000)), "2h03m");
    }

    #[test]
    fn a_permit_holder_shows_its_slot() {
        let now = SystemTime::now();
        let holder = |slot| dlock::HolderRecord {
            slot,
            fence: Some(7),
            ..dlock::HolderRecord::default()
        };
        let view = LockView {
            group: "export".into(),
            name: "acme".into(),
            permits: Some(2),
            holders: vec![holder(Some(1)), holder(None)],
            waiters: Vec::new(),
        };
        let shown = table(&[view], now);
        let rows: Vec<&str> = shown.lines().skip(1).collect();
        assert!(rows[0].contains("holder, slot 1"), "{shown}");
        assert!(
            rows[1].contains("holder ") && !rows[1].contains("slot"),
            "{shown}"
        );
    }
}
