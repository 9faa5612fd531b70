//! The `local` cache: entries in process memory within a byte budget,
//! least recently used evicted first (Triton's `local` cache, without its
//! fixed arena: an entry is charged its packed size).

use std::collections::{BTreeMap, HashMap};
use std::sync::Mutex;

use bytes::Bytes;
use tern_core::error::{Error, Result};
use tern_core::prometheus::{header, sample};

use super::{Key, Store, StoreFuture};

/// An LRU map of entries charged by their length against `size` bytes.
pub struct Local {
    size: usize,
    state: Mutex<Lru>,
}

#[derive(Default)]
struct Lru {
    entries: HashMap<Key, (Bytes, u64)>,
    /// Use tick → key, oldest first.
    order: BTreeMap<u64, Key>,
    tick: u64,
    used: usize,
    evictions: u64,
}

impl Lru {
    fn touch(&mut self, key: &Key) -> Option<Bytes> {
        self.tick += 1;
        let tick = self.tick;
        let (bytes, used) = self.entries.get_mut(key)?;
        self.order.remove(used);
        *used = tick;
        self.order.insert(tick, *key);
        Some(bytes.clone())
    }

    fn evict_oldest(&mut self) -> bool {
        let Some((_, key)) = self.order.pop_first() else {
            return false;
        };
        if let Some((bytes, _)) = self.entries.remove(&key) {
            self.used -= bytes.len();
            self.evictions += 1;
        }
        true
    }
}

impl Local {
    /// A cache of `size` bytes.
    pub fn new(size: usize) -> Local {
        Local {
            size,
            state: Mutex::default(),
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Lru> {
        self.state
            .lock()
            .expect("cache lock poisoned: nothing panics while holding it")
    }

    #[cfg(test)]
    fn len(&self) -> usize {
        self.lock().entries.len()
    }
}

impl Store for Local {
    fn lookup<'a>(&'a self, key: &'a Key) -> StoreFuture<'a, Option<Bytes>> {
        Box::pin(std::future::ready(Ok(self.lock().touch(key))))
    }

    fn insert<'a>(&'a self, key: &'a Key, entry: Vec<u8>) -> StoreFuture<'a, ()> {
        Box::pin(std::future::ready(self.put(key, entry)))
    }

    fn render(&self, out: &mut String, totals: &super::Totals) {
        self.render_gauges(out, totals);
    }
}

impl Local {
    fn put(&self, key: &Key, entry: Vec<u8>) -> Result<()> {
        if entry.len() > self.size {
            // Nothing is evicted for an entry that can never fit.
            return Err(Error::internal(format!(
                "Requested byte_size: {} is greater than total cache size: {}",
                entry.len(),
                self.size
            )));
        }
        let mut lru = self.lock();
        if lru.touch(key).is_some() {
            return Ok(()); // a concurrent miss of the same request inserted it first
        }
        while lru.used + entry.len() > self.size {
            if !lru.evict_oldest() {
                break;
            }
        }
        lru.tick += 1;
        let tick = lru.tick;
        lru.used += entry.len();
        lru.order.insert(tick, *key);
        lru.entries.insert(*key, (Bytes::from(entry), tick));
        Ok(())
    }

    fn render_gauges(&self, out: &mut String, totals: &super::Totals) {
        let lru = self.lock();
        let gauges: [(&str, &str, f64); 8] = [
            (
                "nv_cache_num_entries",
                "Number of responses stored in response cache",
                lru.entries.len() as f64,
            ),
            (
                "nv_cache_num_lookups",
                "Number of cache lookups in response cache",
                (totals.hits() + totals.misses()) as f64,
            ),
            (
                "nv_cache_num_hits",
                "Number of cache hits in response cache",
                totals.hits() as f64,
            ),
            (
                "nv_cache_num_misses",
                "Number of cache misses in response cache",
                totals.misses() as f64,
            ),
            (
                "nv_cache_num_evictions",
                "Number of cache evictions in response cache",
                lru.evictions as f64,
            ),
            (
                "nv_cache_lookup_duration",
                "Total cache lookup duration (hit and miss), in microseconds",
                totals.lookup_us() as f64,
            ),
            (
                "nv_cache_insertion_duration",
                "Total cache insertion duration, in microseconds",
                totals.insert_us() as f64,
            ),
            (
                "nv_cache_util",
                "Cache utilization [0.0 - 1.0]",
                lru.used as f64 / self.size.max(1) as f64,
            ),
        ];
        for (name, help, value) in gauges {
            header(out, name, "gauge", help);
            sample(out, name, "", value);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn key(n: u8) -> Key {
        [n; 32]
    }

    #[test]
    fn the_least_recently_used_entry_goes_first() {
        let c = Local::new(250);
        c.put(&key(1), vec![1; 100]).unwrap();
        c.put(&key(2), vec![2; 100]).unwrap();
        assert!(c.lock().touch(&key(1)).is_some()); // 1 is now newer than 2
        c.put(&key(3), vec![3; 100]).unwrap();
        assert!(c.lock().touch(&key(2)).is_none(), "2 was evicted");
        assert_eq!(c.lock().touch(&key(1)).unwrap()[0], 1);
        assert_eq!(c.lock().touch(&key(3)).unwrap()[0], 3);
        assert_eq!(c.len(), 2);
        assert_eq!(c.lock().used, 200);
        assert_eq!(c.lock().evictions, 1);
    }

    #[test]
    fn an_entry_larger_than_the_cache_is_refused_and_evicts_nothing() {
        let c = Local::new(100);
        c.put(&key(1), vec![1; 60]).unwrap();
        let e = c.put(&key(2), vec![2; 101]).unwrap_err();
        assert_eq!(
            e.message,
            "Requested byte_size: 101 is greater than total cache size: 100"
        );
        assert!(c.lock().touch(&key(1)).is_some());
        // One that fits only alone empties the cache for itself.
        c.put(&key(3), vec![3; 100]).unwrap();
        assert_eq!(c.len(), 1);
    }

    #[test]
    fn inserting_a_key_twice_keeps_one_entry() {
        let c = Local::new(1000);
        c.put(&key(1), vec![1; 10]).unwrap();
        c.put(&key(1), vec![9; 10]).unwrap();
        assert_eq!(c.len(), 1);
        assert_eq!(c.lock().used, 10);
        assert_eq!(c.lock().touch(&key(1)).unwrap()[0], 1);
    }

    #[test]
    fn the_gauges_say_what_is_held() {
        let c = Local::new(400);
        c.put(&key(1), vec![1; 100]).unwrap();
        let totals = super::super::Totals::default();
        let mut out = String::new();
        c.render_gauges(&mut out, &totals);
        assert!(out.contains("nv_cache_num_entries 1\n"), "{out}");
        assert!(out.contains("nv_cache_util 0.25\n"), "{out}");
        assert!(
            out.contains("# TYPE nv_cache_num_evictions gauge\n"),
            "{out}"
        );
    }
}
