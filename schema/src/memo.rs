//! A worker's memo of values made from text (compiled patterns, validated configs): requests
//! bring the same text again and again, so each value is made once and shared. Bounded: a full
//! memo forgets one entry for the new one.

use hashbrown::HashMap;
use std::cell::RefCell;
use std::rc::Rc;
use std::thread::LocalKey;

pub struct Memo<T> {
    entries: HashMap<String, Rc<T>>,
    capacity: usize,
}

impl<T> Memo<T> {
    pub fn new(capacity: usize) -> Self {
        Memo { entries: HashMap::new(), capacity }
    }
}

/// The value `make` makes from `key`, from `memo` when it was made lately. Errors are not kept
/// (bad text is the rare case). `make` runs while the memo is not borrowed.
pub fn cached<T, E>(
    memo: &'static LocalKey<RefCell<Memo<T>>>,
    key: &str,
    make: impl FnOnce() -> Result<T, E>,
) -> Result<Rc<T>, E> {
    if let Some(value) = memo.with(|memo| memo.borrow().entries.get(key).cloned()) {
        return Ok(value);
    }
    let value = Rc::new(make()?);
    memo.with(|memo| {
        let mut memo = memo.borrow_mut();
        if memo.entries.len() >= memo.capacity {
            if let Some(forgotten) = memo.entries.keys().next().cloned() {
                memo.entries.remove(&forgotten);
            }
        }
        memo.entries.insert(key.to_string(), Rc::clone(&value));
    });
    Ok(value)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::unit_tests::test;

    thread_local! {
        static LENGTHS: RefCell<Memo<usize>> = RefCell::new(Memo::new(4));
    }

    fn length(text: &str) -> Result<Rc<usize>, String> {
        cached(&LENGTHS, text, || if text.is_empty() { Err("empty".to_string()) } else { Ok(text.len()) })
    }

    #[test]
    fn a_value_is_made_once_errors_are_not_kept_and_the_memo_stays_bounded() {
        let first = length("abc").unwrap();
        assert!(Rc::ptr_eq(&first, &length("abc").unwrap()));
        assert_eq!(length("").unwrap_err(), "empty");
        for i in 0..10 {
            assert_eq!(*length(&"x".repeat(i + 1)).unwrap(), i + 1);
        }
        assert!(LENGTHS.with(|memo| memo.borrow().entries.len()) <= 4);
        assert_eq!(*length("abc").unwrap(), 3, "a forgotten value is made again");
    }
}
