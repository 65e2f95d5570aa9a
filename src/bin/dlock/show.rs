//! The table a person reads: one row per holder and waiter, times as how
//! long ago and how long left. Where the engine shows renewals, the lease
//! left reads `12.1s of 30.0s` and `RENEWED` says when: a live holder's
//! watchdog renews every third of the lease, so a renewal older than that
//! is a holder stuck or gone. Names and labels are shown as [`escaped`]:
//! they come from applications, often from user input, and a terminal
//! would act on their control characters.

/// The most characters of a name or label a table shows; JSON has all.
const SHOWN: usize = 120;

use std::time::{Duration, SystemTime};

use comfy_table::Table;
use dlock::{Cycle, LockView};

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
        "RENEWED",
    ]);
    for view in views {
        let name = escaped(&format!("{}/{}", view.group, view.name));
        let lock = match view.permits {
            Some(n) => format!("{name} ({n} permits)"),
            None => name,
        };
        if view.is_free() {
            table.add_row([lock.as_str(), "free", "", "", "", "", "", "", ""]);
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
                match (h.lease_ends, h.lease) {
                    (Some(ends), Some(lease)) => format!("{} of {}", left(now, ends), span(lease)),
                    (ends, _) => ends.map_or("-".into(), |t| left(now, t)),
                },
                h.renewed.map_or("-".into(), |t| ago(now, t)),
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
                "-".into(),
            ]);
        }
    }
    if views.is_empty() {
        return "nothing held\n".to_owned();
    }
    format!("{table}\n")
}

/// Each cycle of waits: a line per lock, its holder and what the holder
/// waits for, the one that gives up first.
pub fn cycles(cycles: &[Cycle], now: SystemTime) -> String {
    let mut out = String::new();
    for (n, cycle) in cycles.iter().enumerate() {
        out.push_str(&format!(
            "cycle {} of {} (the first gives up):\n",
            n + 1,
            cycles.len()
        ));
        let mut table = Table::new();
        table.load_style(comfy_table::presets::NOTHING);
        table.set_header(["LOCK", "HOLDER", "OWNER", "WAITS FOR", "SINCE"]);
        for (i, link) in cycle.links.iter().enumerate() {
            let next = &cycle.links[(i + 1) % cycle.links.len()];
            table.add_row([
                escaped(&format!("{}/{}", link.group, link.name)),
                text(&link.holder),
                link.owner.clone(),
                escaped(&format!("{}/{}", next.group, next.name)),
                link.waiting_since
                    .map_or_else(|| "-".into(), |since| ago(now, since)),
            ]);
        }
        out.push_str(&table.to_string());
        out.push('\n');
    }
    out
}

fn text(field: &Option<String>) -> String {
    field.as_deref().map_or_else(|| "-".into(), escaped)
}

/// `text` as a terminal may print it: control characters, a backslash and
/// the characters that reorder or hide text written as Rust escapes
/// (`\u{1b}`, `\n`, `\\`), and past [`SHOWN`] characters cut, with an
/// ellipsis and how many more there are.
pub fn escaped(text: &str) -> String {
    let hidden = |c: char| {
        c.is_control()
            || matches!(c, '\u{200b}'..='\u{200f}' | '\u{202a}'..='\u{202e}' | '\u{2066}'..='\u{2069}')
    };
    let mut shown = String::new();
    let mut chars = text.chars();
    for c in chars.by_ref().take(SHOWN) {
        match c {
            '\n' => shown.push_str("\\n"),
            '\r' => shown.push_str("\\r"),
            '\t' => shown.push_str("\\t"),
            '\\' => shown.push_str("\\\\"),
            c if hidden(c) => shown.push_str(&format!("\\u{{{:x}}}", c as u32)),
            c => shown.push(c),
        }
    }
    let more = chars.count();
    if more > 0 {
        shown.push_str(&format!("… ({more} more characters)"));
    }
    shown
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
    fn names_cannot_act_on_a_terminal_and_long_ones_are_cut() {
        assert_eq!(escaped("ops/ansi\u{1b}[31mRED"), "ops/ansi\\u{1b}[31mRED");
        assert_eq!(escaped("ops/hide\r ops/x  free"), "ops/hide\\r ops/x  free");
        assert_eq!(escaped("ops/new\nline\t\\n"), "ops/new\\nline\\t\\\\n");
        assert_eq!(
            escaped("ops/title\u{1b}]0;pwned\u{1b}\\"),
            "ops/title\\u{1b}]0;pwned\\u{1b}\\\\"
        );
        assert_eq!(escaped("a\u{202e}b\u{7f}\u{85}"), "a\\u{202e}b\\u{7f}\\u{85}");
        assert_eq!(escaped("ünï/cödé"), "ünï/cödé");
        let long = escaped(&"n".repeat(65_000));
        assert!(
            long.starts_with(&"n".repeat(SHOWN)) && long.ends_with("… (64880 more characters)"),
            "{long}"
        );
    }

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

    #[test]
    fn a_renewal_shows_beside_the_lease_it_set() {
        let now = SystemTime::UNIX_EPOCH + Duration::from_secs(1_000);
        let lease = Duration::from_secs(30);
        let record = dlock::HolderRecord::default().leased(now + Duration::from_secs(12), lease);
        let view = LockView {
            group: "order".into(),
            name: "42".into(),
            permits: None,
            holders: vec![record],
            waiters: Vec::new(),
        };
        let shown = table(&[view], now);
        let row = shown.lines().nth(1).expect("a row");
        assert!(
            row.contains("12.0s of 30.0s") && row.trim_end().ends_with("18.0s ago"),
            "{shown}"
        );
    }
}
