//! What real permit holders record, to count how many held a valid permit
//! at once: every few milliseconds while inside, each holder appends
//! `<fence> <unix ns>`, taken *before* it checks that its permit is not
//! lost. A holder paused past its lease stops stamping when the pause
//! begins, and finds its permit lost when it resumes, so its interval ends
//! where its validity did. One `O_APPEND` write per line keeps the lines
//! of several processes whole.

use std::fs::{File, OpenOptions};
use std::io::Write;
use std::path::Path;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use dlock::Guard;

/// How often a holder stamps that it is inside.
const STAMP_EVERY: Duration = Duration::from_millis(5);

/// The log of visits, shared by the workers of a scenario.
pub struct Visits(File);

/// One holder's valid stay: its first and last stamp, ns since the epoch.
#[derive(Clone, Copy, Debug)]
pub struct Stay {
    /// The holder's fence.
    pub fence: u64,
    /// Its first stamp.
    pub from: u128,
    /// Its last stamp.
    pub to: u128,
}

impl Visits {
    /// Opens (creating) the log at `path` for appending.
    pub fn open(path: &Path) -> Self {
        let file = OpenOptions::new()
            .create(true)
            .append(true)
            .open(path)
            .unwrap_or_else(|e| panic!("visits log {}: {e}", path.display()));
        Visits(file)
    }

    /// The time to stamp, read before the check of validity it goes with.
    pub fn now() -> u128 {
        SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .expect("clock after 1970")
            .as_nanos()
    }

    /// Records that the holder of `fence` held a valid permit `at`.
    pub fn stamp(&self, fence: u64, at: u128) {
        (&self.0)
            .write_all(format!("{fence} {at}\n").as_bytes())
            .expect("stamp a visit");
    }

    /// Stays `stay` inside with the permit `guard` holds, stamping while it
    /// is valid, then lets go: `Ok(true)` made whole, `Ok(false)` cut short
    /// by a loss.
    pub async fn stay(&self, guard: Guard, stay: Duration) -> Result<bool, dlock::Error> {
        if !self.stay_holding(&guard, stay).await {
            let _ = guard.release().await;
            return Ok(false);
        }
        match guard.release().await {
            Ok(()) => Ok(true),
            Err(dlock::Error::Lost { .. }) => Ok(false),
            Err(e) => Err(e),
        }
    }

    /// Stays `stay` inside with the permit `guard` holds, stamping while it
    /// is valid, and keeps it: `false` if it was found lost.
    pub async fn stay_holding(&self, guard: &Guard, stay: Duration) -> bool {
        let fence = guard.fence();
        let until = tokio::time::Instant::now() + stay;
        loop {
            let at = Visits::now();
            if guard.is_lost() {
                return false;
            }
            self.stamp(fence, at);
            if tokio::time::Instant::now() >= until {
                return true;
            }
            tokio::time::sleep(STAMP_EVERY).await;
        }
    }

    /// Every holder's stay, from the log at `path`.
    pub fn stays(path: &Path) -> Vec<Stay> {
        let text = std::fs::read_to_string(path).unwrap_or_default();
        let mut stays = std::collections::HashMap::<u64, Stay>::new();
        for line in text.lines() {
            let (fence, at) = line.split_once(' ').expect("`<fence> <ns>`");
            let (fence, at) = (fence.parse().expect("fence"), at.parse().expect("ns"));
            let stay = stays.entry(fence).or_insert(Stay {
                fence,
                from: at,
                to: at,
            });
            stay.from = stay.from.min(at);
            stay.to = stay.to.max(at);
        }
        stays.into_values().collect()
    }

    /// The most stays that overlap at one instant.
    pub fn most_at_once(stays: &[Stay]) -> usize {
        // Ends before starts at one instant: touching stays do not overlap.
        let mut edges: Vec<(u128, i8)> = stays.iter().flat_map(|s| [(s.from, 1), (s.to, -1)]).collect();
        edges.sort_unstable();
        let (mut now, mut most) = (0i64, 0i64);
        for (_, step) in edges {
            now += i64::from(step);
            most = most.max(now);
        }
        most as usize
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn stay(fence: u64, from: u128, to: u128) -> Stay {
        Stay { fence, from, to }
    }

    #[test]
    fn overlaps_are_counted_at_their_peak_and_touching_stays_do_not_overlap() {
        let stays = [stay(1, 0, 10), stay(2, 5, 20), stay(3, 6, 7), stay(4, 20, 30)];
        assert_eq!(Visits::most_at_once(&stays), 3);
        assert_eq!(Visits::most_at_once(&stays[3..]), 1);
        assert_eq!(Visits::most_at_once(&[stay(1, 0, 10), stay(2, 10, 20)]), 1);
    }
}
