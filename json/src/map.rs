//! Maps by string key as read from a review (labels, annotations, quantities: `StrMap`, keys
//! and values borrowed where the JSON had no escapes), and the values read back from the
//! overcommit annotations. Pure.
//!
//! It behaves as a `BTreeMap` (keys unique and in order, a key inserted twice keeps its last
//! value) but is a sorted vector: these maps hold a handful of entries, and the API server
//! writes them with their keys in order, so an insert is a comparison with the last key and a
//! push, and a lookup a binary search in one allocation. A `BTreeMap` cost ~120 instructions
//! per insert and a node allocation per map.

use std::borrow::Cow;
use std::fmt;

/// A map by string key, as a vector sorted by key (keys unique).
#[derive(Clone, PartialEq, Eq)]
pub struct VecMap<'a, V> {
    entries: Vec<(Cow<'a, str>, V)>,
}

/// Labels, annotations, quantities.
pub type StrMap<'a> = VecMap<'a, Cow<'a, str>>;

impl<V> Default for VecMap<'_, V> {
    fn default() -> Self {
        Self {
            entries: Vec::new(),
        }
    }
}

impl<'a, V> VecMap<'a, V> {
    pub fn new() -> Self {
        Self::default()
    }

    pub fn with_capacity(capacity: usize) -> Self {
        Self {
            entries: Vec::with_capacity(capacity),
        }
    }

    fn find(&self, key: &str) -> Result<usize, usize> {
        self.entries.binary_search_by(|(k, _)| k.as_ref().cmp(key))
    }

    /// Insert, or replace the value of an equal key.
    pub fn insert(&mut self, key: Cow<'a, str>, value: V) {
        match self.entries.last() {
            Some((last, _)) if *last < key => self.entries.push((key, value)),
            None => self.entries.push((key, value)),
            Some(_) => match self.find(&key) {
                Ok(at) => {
                    if let Some(entry) = self.entries.get_mut(at) {
                        entry.1 = value;
                    }
                }
                Err(at) => self.entries.insert(at, (key, value)),
            },
        }
    }

    /// Insert unless an equal key is there; whether it was inserted.
    pub fn insert_new(&mut self, key: Cow<'a, str>, value: V) -> bool {
        match self.entries.last() {
            Some((last, _)) if *last < key => self.entries.push((key, value)),
            None => self.entries.push((key, value)),
            Some(_) => match self.find(&key) {
                Ok(_) => return false,
                Err(at) => self.entries.insert(at, (key, value)),
            },
        }
        true
    }

    /// Where `key` is. A small map (most are: quantities, the overcommit annotations) is
    /// scanned: comparing lengths first leaves one byte comparison, where a binary search
    /// compares bytes (a `memcmp` call) at every step.
    fn position(&self, key: &str) -> Option<usize> {
        const SCANNED: usize = 8;
        if self.entries.len() <= SCANNED {
            return self.entries.iter().position(|(k, _)| k.as_ref() == key);
        }
        self.find(key).ok()
    }

    pub fn get(&self, key: &str) -> Option<&V> {
        let at = self.position(key)?;
        self.entries.get(at).map(|(_, value)| value)
    }

    pub fn contains_key(&self, key: &str) -> bool {
        self.position(key).is_some()
    }

    pub fn len(&self) -> usize {
        self.entries.len()
    }

    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }

    /// Entries in key order.
    pub fn iter(&self) -> impl Iterator<Item = (&Cow<'a, str>, &V)> + Clone {
        self.entries.iter().map(|(key, value)| (key, value))
    }

    pub fn keys(&self) -> impl Iterator<Item = &Cow<'a, str>> {
        self.entries.iter().map(|(key, _)| key)
    }
}

impl<'m, 'a, V> IntoIterator for &'m VecMap<'a, V> {
    type Item = (&'m Cow<'a, str>, &'m V);
    type IntoIter = std::iter::Map<
        std::slice::Iter<'m, (Cow<'a, str>, V)>,
        fn(&'m (Cow<'a, str>, V)) -> (&'m Cow<'a, str>, &'m V),
    >;

    fn into_iter(self) -> Self::IntoIter {
        self.entries.iter().map(|(key, value)| (key, value))
    }
}

impl<'a, V> IntoIterator for VecMap<'a, V> {
    type Item = (Cow<'a, str>, V);
    type IntoIter = std::vec::IntoIter<(Cow<'a, str>, V)>;

    fn into_iter(self) -> Self::IntoIter {
        self.entries.into_iter()
    }
}

impl<'a, V> FromIterator<(Cow<'a, str>, V)> for VecMap<'a, V> {
    fn from_iter<I: IntoIterator<Item = (Cow<'a, str>, V)>>(entries: I) -> Self {
        let mut map = VecMap::new();
        for (key, value) in entries {
            map.insert(key, value);
        }
        map
    }
}

impl<V: fmt::Debug> fmt::Debug for VecMap<'_, V> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_map().entries(self.iter()).finish()
    }
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;

    use super::*;

    /// Every order of inserting a few keys, some twice: the same entries as a `BTreeMap` (with
    /// `insert_new`: the first value of each key, and `false` for the repeats).
    #[test]
    fn inserts_in_any_order_give_the_btree_map_entries() {
        let inserts = [
            ("b", "1"),
            ("a", "2"),
            ("c", "3"),
            ("a", "4"),
            ("", "5"),
            ("b", "6"),
        ];
        for rotation in 0..inserts.len() {
            for reverse in [false, true] {
                let mut order = inserts.to_vec();
                order.rotate_left(rotation);
                if reverse {
                    order.reverse();
                }
                let mut ours = StrMap::new();
                let mut first_only = StrMap::new();
                let mut btree = BTreeMap::new();
                let mut btree_first = BTreeMap::new();
                for (k, v) in &order {
                    ours.insert(Cow::Borrowed(*k), Cow::Borrowed(*v));
                    let new = !btree_first.contains_key(k);
                    assert_eq!(
                        first_only.insert_new(Cow::Borrowed(*k), Cow::Borrowed(*v)),
                        new,
                        "{k} in {order:?}"
                    );
                    btree_first.entry(*k).or_insert(*v);
                    btree.insert(*k, *v);
                }
                let first_entries: Vec<(&str, &str)> = first_only
                    .iter()
                    .map(|(k, v)| (k.as_ref(), v.as_ref()))
                    .collect();
                assert_eq!(first_entries, btree_first.into_iter().collect::<Vec<_>>());
                let ours_entries: Vec<(&str, &str)> =
                    ours.iter().map(|(k, v)| (k.as_ref(), v.as_ref())).collect();
                let btree_entries: Vec<(&str, &str)> = btree.into_iter().collect();
                assert_eq!(ours_entries, btree_entries, "{order:?}");
                assert_eq!(ours.len(), 4);
                for (k, v) in &btree_entries {
                    assert_eq!(ours.get(k).map(|v| v.as_ref()), Some(*v));
                    assert!(ours.contains_key(k));
                }
                assert_eq!(ours.get("d"), None);
                assert!(!ours.contains_key("aa"));
            }
        }
        assert!(StrMap::new().is_empty());
        assert_eq!(StrMap::new().get(""), None);
    }

    /// Lookups in maps of every size around the scanned limit: each key found with its value,
    /// keys beside them (shorter, longer, between) not.
    #[test]
    fn lookups_find_every_key_at_every_size() {
        let keys: Vec<String> = (0..20).map(|n| format!("k{:02}", n * 2)).collect();
        for size in 0..keys.len() {
            let map: StrMap<'_> = keys
                .iter()
                .take(size)
                .map(|k| (Cow::Borrowed(k.as_str()), Cow::Owned(format!("v{k}"))))
                .collect();
            for (n, key) in keys.iter().enumerate() {
                let expected = (n < size).then(|| format!("v{key}"));
                assert_eq!(
                    map.get(key).map(|v| v.to_string()),
                    expected,
                    "{key} in {size}"
                );
                assert_eq!(map.contains_key(key), n < size, "{key} in {size}");
                for absent in [
                    format!("k{:02}", n * 2 + 1),
                    format!("{key}0"),
                    key[..2].into(),
                ] {
                    assert_eq!(map.get(&absent), None, "{absent} in {size}");
                    assert!(!map.contains_key(&absent), "{absent} in {size}");
                }
            }
        }
    }
}
