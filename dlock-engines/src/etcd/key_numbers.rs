//! Key names reused across a lock's requests. etcd keeps an index entry for
//! every key name ever used under a prefix until the history is compacted,
//! and a range read walks them all: a fresh name per request made every
//! acquisition slower the more a lock had been used (1.6× the floor after
//! 4,000 cycles). A request takes the lowest number free among this
//! engine's requests on the lock, and gives it back once its key is deleted.

use std::collections::{BTreeSet, HashMap};
use std::sync::{Arc, Mutex};

#[derive(Default)]
pub(crate) struct KeyNumbers(Arc<Mutex<HashMap<String, BTreeSet<u32>>>>);

/// A number taken on one lock, given back on drop.
pub(crate) struct KeyNumber {
    numbers: Arc<Mutex<HashMap<String, BTreeSet<u32>>>>,
    prefix: String,
    pub number: u32,
}

impl KeyNumbers {
    pub fn take(&self, prefix: &str) -> KeyNumber {
        let mut numbers = self.0.lock().unwrap_or_else(|e| e.into_inner());
        let taken = numbers.entry(prefix.to_owned()).or_default();
        let number = (0..).find(|n| !taken.contains(n)).expect("a free number");
        taken.insert(number);
        KeyNumber {
            numbers: self.0.clone(),
            prefix: prefix.to_owned(),
            number,
        }
    }
}

impl Drop for KeyNumber {
    fn drop(&mut self) {
        let mut numbers = self.numbers.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(taken) = numbers.get_mut(&self.prefix) {
            taken.remove(&self.number);
            if taken.is_empty() {
                numbers.remove(&self.prefix);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_lowest_free_number_and_nothing_kept_once_given_back() {
        let numbers = KeyNumbers::default();
        let (a, b) = (numbers.take("p/"), numbers.take("p/"));
        assert_eq!((a.number, b.number, numbers.take("q/").number), (0, 1, 0));
        drop(a);
        assert_eq!(numbers.take("p/").number, 0);
        drop(b);
        assert!(numbers.0.lock().unwrap().is_empty());
    }
}
