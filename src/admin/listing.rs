//! A page of a group's listing, cut on the server: a browser showing a
//! group of thousands of locks receives one page of them a refresh.

use serde::{Deserialize, Serialize};

use crate::LockView;

/// The views a page holds unless asked for fewer.
const LIMIT: usize = 100;
/// The most views a page holds, whatever is asked.
const MAX_LIMIT: usize = 1000;

/// `?contains=&after=&limit=`: which page.
#[derive(Deserialize)]
pub(super) struct Page {
    /// Keeps the names holding this text.
    #[serde(default)]
    contains: String,
    /// Starts past this name: the last of the page before.
    after: Option<String>,
    /// How many views, [`LIMIT`] unless given, at most [`MAX_LIMIT`].
    limit: Option<usize>,
}

/// One page of the views the filter keeps, and counts of them all.
#[derive(Serialize)]
pub(super) struct Listing {
    /// The page's views, by name.
    locks: Vec<LockView>,
    /// How many views come before the page.
    before: usize,
    /// How many views there are, on every page.
    total: usize,
    /// How many of them someone holds.
    held: usize,
    /// How many requests wait for them.
    waiting: usize,
    /// Whether a page follows.
    more: bool,
}

impl Page {
    /// This page of `views`, a group's listing sorted by name.
    pub(super) fn of(&self, mut views: Vec<LockView>) -> Listing {
        views.retain(|view| view.name.contains(&self.contains));
        let total = views.len();
        let held = views.iter().filter(|view| !view.holders.is_empty()).count();
        let waiting = views.iter().map(|view| view.waiters.len()).sum();
        let before = match &self.after {
            Some(after) => views.partition_point(|view| view.name <= *after),
            None => 0,
        };
        let limit = self.limit.unwrap_or(LIMIT).clamp(1, MAX_LIMIT);
        let mut end = total.min(before + limit);
        // A lock and semaphores may share a name: the page takes every
        // view of its last name, so that the next, after that name, misses none.
        while end < total && views[end].name == views[end - 1].name {
            end += 1;
        }
        let more = end < total;
        views.truncate(end);
        views.drain(..before);
        Listing {
            locks: views,
            before,
            total,
            held,
            waiting,
            more,
        }
    }
}
