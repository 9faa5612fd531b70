//! The vocabulary lookup table: open addressing with linear probing over
//! one byte arena holding every piece. Built once at load, read on every
//! word, so it is shaped for lookups that are cheap both natively and in
//! WebAssembly: one multiply-rotate hash over 8-byte chunks, a 32-bit tag
//! in the slot that rejects almost every wrong key without touching its
//! bytes, and an inline 8-bytes-at-a-time comparison (no `memcmp` call,
//! which is a byte loop in WebAssembly).

/// Multiplier of the Fx hash (as in rustc's `FxHasher`).
const K: u64 = 0x517c_c1b7_2722_0a95;

/// Slots per entry, at least: a load factor under 1/4 keeps misses (most
/// longest-match probes are misses) at about one slot.
const SPREAD: usize = 4;

/// Pieces longer than this are refused (the offset/length packing).
const MAX_KEY: usize = 255;

/// One slot: `tag` (0 = empty), `off` into the arena with the length in
/// the top 8 bits, and the token id.
#[derive(Clone, Copy, Default)]
struct Slot {
    tag: u32,
    off_len: u32,
    id: u32,
}

/// A map from byte strings to token ids.
#[derive(Default)]
pub(crate) struct Table {
    slots: Vec<Slot>,
    shift: u32,
    arena: Vec<u8>,
    len: usize,
    max_key: usize,
}

impl std::fmt::Debug for Table {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Table({} keys, {} slots)", self.len, self.slots.len())
    }
}

impl Table {
    /// A table for `entries` (a later duplicate key replaces the earlier id,
    /// as Python's dict does when Hugging Face reads `vocab.txt`).
    pub(crate) fn build(entries: &[(&str, u32)]) -> Result<Table, String> {
        let cap = (entries.len().max(1) * SPREAD).next_power_of_two();
        let mut t = Table {
            slots: vec![Slot::default(); cap],
            shift: 64 - cap.trailing_zeros(),
            ..Table::default()
        };
        for &(key, id) in entries {
            t.insert(key.as_bytes(), id)?;
        }
        Ok(t)
    }

    fn insert(&mut self, key: &[u8], id: u32) -> Result<(), String> {
        if key.len() > MAX_KEY {
            return Err(format!(
                "vocabulary piece of {} bytes is too long (at most {MAX_KEY})",
                key.len()
            ));
        }
        if self.arena.len() + key.len() >= 1 << 24 {
            return Err("vocabulary is too large (its pieces exceed 16 MiB)".into());
        }
        let (mut i, tag) = self.start(key);
        loop {
            let s = self.slots[i];
            if s.tag == 0 {
                self.slots[i] = Slot {
                    tag,
                    off_len: self.arena.len() as u32 | (key.len() as u32) << 24,
                    id,
                };
                self.arena.extend_from_slice(key);
                self.len += 1;
                self.max_key = self.max_key.max(key.len());
                return Ok(());
            }
            if s.tag == tag && self.key_at(s) == key {
                self.slots[i].id = id;
                return Ok(());
            }
            i = (i + 1) & (self.slots.len() - 1);
        }
    }

    /// The id of `key`, if present.
    #[inline(always)]
    pub(crate) fn get(&self, key: &[u8]) -> Option<u32> {
        let (mut i, tag) = self.start(key);
        loop {
            let s = self.slots[i];
            if s.tag == 0 {
                return None;
            }
            if s.tag == tag && (s.off_len >> 24) as usize == key.len() {
                let off = (s.off_len & 0xff_ffff) as usize;
                if same(&self.arena[off..off + key.len()], key) {
                    return Some(s.id);
                }
            }
            i = (i + 1) & (self.slots.len() - 1);
        }
    }

    /// The length in bytes of the longest key.
    pub(crate) fn max_key(&self) -> usize {
        self.max_key
    }

    /// Number of keys.
    #[cfg(test)]
    pub(crate) fn len(&self) -> usize {
        self.len
    }

    fn key_at(&self, s: Slot) -> &[u8] {
        let off = (s.off_len & 0xff_ffff) as usize;
        &self.arena[off..off + (s.off_len >> 24) as usize]
    }

    /// First slot and tag of `key`: the slot from the hash's top bits, the
    /// tag (never 0) from lower ones.
    #[inline]
    fn start(&self, key: &[u8]) -> (usize, u32) {
        let h = hash(key);
        ((h >> self.shift) as usize, (h >> 8) as u32 | 1)
    }
}

#[inline]
fn mix(h: u64, x: u64) -> u64 {
    (h.rotate_left(5) ^ x).wrapping_mul(K)
}

/// Fx-style hash: 8 bytes at a time, the tail in at most three loads.
#[inline]
fn hash(key: &[u8]) -> u64 {
    let mut h = key.len() as u64;
    let mut chunks = key.chunks_exact(8);
    for c in &mut chunks {
        h = mix(h, u64::from_le_bytes(c.try_into().expect("8 bytes")));
    }
    mix(h, tail(chunks.remainder()))
}

/// Up to 7 bytes as a little-endian integer, without a byte loop.
#[inline]
fn tail(r: &[u8]) -> u64 {
    let mut t = 0u64;
    let mut i = 0;
    if r.len() >= 4 {
        t = u32::from_le_bytes(r[..4].try_into().expect("4 bytes")) as u64;
        i = 4;
    }
    if r.len() - i >= 2 {
        t |= (u16::from_le_bytes(r[i..i + 2].try_into().expect("2 bytes")) as u64) << (8 * i);
        i += 2;
    }
    if r.len() > i {
        t |= (r[i] as u64) << (8 * i);
    }
    t
}

/// `a == b` for slices of equal length, 8 bytes at a time.
#[inline]
fn same(a: &[u8], b: &[u8]) -> bool {
    let (mut ca, mut cb) = (a.chunks_exact(8), b.chunks_exact(8));
    for (x, y) in (&mut ca).zip(&mut cb) {
        if x != y {
            return false;
        }
    }
    tail(ca.remainder()) == tail(cb.remainder())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn finds_every_key_and_nothing_else() {
        let words: Vec<String> = (0..5000)
            .map(|i| format!("w{i}{}", "x".repeat(i % 23)))
            .collect();
        let entries: Vec<(&str, u32)> = words
            .iter()
            .enumerate()
            .map(|(i, w)| (w.as_str(), i as u32))
            .collect();
        let t = Table::build(&entries).unwrap();
        assert_eq!(t.len(), words.len());
        for (i, w) in words.iter().enumerate() {
            assert_eq!(t.get(w.as_bytes()), Some(i as u32), "{w}");
            // Every proper prefix that is not itself a key is absent.
            let p = &w.as_bytes()[..w.len() - 1];
            if !words.iter().any(|o| o.as_bytes() == p) {
                assert_eq!(t.get(p), None);
            }
        }
        assert_eq!(t.get(b""), None);
        assert_eq!(t.max_key(), words.iter().map(String::len).max().unwrap());
    }

    #[test]
    fn later_duplicates_win_and_long_keys_are_refused() {
        let t = Table::build(&[("a", 1), ("b", 2), ("a", 3)]).unwrap();
        assert_eq!((t.get(b"a"), t.get(b"b"), t.len()), (Some(3), Some(2), 2));
        let long = "y".repeat(MAX_KEY + 1);
        assert!(Table::build(&[(long.as_str(), 0)])
            .unwrap_err()
            .contains("too long"));
    }

    #[test]
    fn comparison_and_tail_cover_every_length() {
        for n in 0..20 {
            let a: Vec<u8> = (0..n as u8).collect();
            assert!(same(&a, &a.clone()));
            for i in 0..n {
                let mut b = a.clone();
                b[i] ^= 0x80;
                assert!(!same(&a, &b), "length {n}, byte {i}");
            }
        }
        assert_eq!(tail(&[1, 2, 3, 4, 5, 6, 7]), 0x0007_0605_0403_0201);
    }
}
