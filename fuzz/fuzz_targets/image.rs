//! Images handed to the `ops` kernels (`image-decode` from a plugin):
//! `tern_ops::image::probe` and `decode` with a memory budget (what is left
//! under the plugin's `max_memory_bytes`).
//!
//! Input: byte 0 picks the colour (mod 5) and the budget (bits 4-5: 16 KiB,
//! 256 KiB, 4 MiB, 64 MiB); the rest is the file.
//!
//! Invariants: a decoded image is `height x width x channels` of the
//! colour asked, its size what `probe` reported, its pixels within the
//! budget; and the heap never grows by more than the budget (plus 1 MiB of
//! decoder state) while it decodes (a counting allocator measures it).
#![no_main]

use std::alloc::{GlobalAlloc, Layout, System};
use std::sync::atomic::{AtomicUsize, Ordering};

use libfuzzer_sys::fuzz_target;
use tern_ops::image::{decode, probe, Color};

/// The system allocator, counting the bytes live and their peak.
struct Counting;

static LIVE: AtomicUsize = AtomicUsize::new(0);
static PEAK: AtomicUsize = AtomicUsize::new(0);

unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        let p = unsafe { System.alloc(layout) };
        if !p.is_null() {
            let now = LIVE.fetch_add(layout.size(), Ordering::Relaxed) + layout.size();
            PEAK.fetch_max(now, Ordering::Relaxed);
        }
        p
    }
    unsafe fn dealloc(&self, p: *mut u8, layout: Layout) {
        unsafe { System.dealloc(p, layout) };
        LIVE.fetch_sub(layout.size(), Ordering::Relaxed);
    }
    unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
        let p = unsafe { System.alloc_zeroed(layout) };
        if !p.is_null() {
            let now = LIVE.fetch_add(layout.size(), Ordering::Relaxed) + layout.size();
            PEAK.fetch_max(now, Ordering::Relaxed);
        }
        p
    }
    unsafe fn realloc(&self, p: *mut u8, layout: Layout, new: usize) -> *mut u8 {
        let q = unsafe { System.realloc(p, layout, new) };
        if !q.is_null() {
            LIVE.fetch_sub(layout.size(), Ordering::Relaxed);
            let now = LIVE.fetch_add(new, Ordering::Relaxed) + new;
            PEAK.fetch_max(now, Ordering::Relaxed);
        }
        q
    }
}

#[global_allocator]
static ALLOC: Counting = Counting;

const COLORS: [Color; 5] = [
    Color::Gray,
    Color::Rgb,
    Color::Bgr,
    Color::Rgba,
    Color::Bgra,
];
const BUDGETS: [usize; 4] = [16 << 10, 256 << 10, 4 << 20, 64 << 20];
const DECODER_STATE: usize = 1 << 20;
fuzz_target!(
    init: {
        // `probe` and `decode` catch a panic in the third-party decoders and
        // report a bad image (crates/ops/src/image.rs, `guarded`); let such a
        // panic unwind to them instead of aborting in libfuzzer-sys's hook.
        // Any other panic aborts as before, and one that escapes them aborts
        // in libfuzzer-sys's wrapper.
        let abort = std::panic::take_hook();
        std::panic::set_hook(Box::new(move |info| {
            let third_party = info
                .location()
                .is_some_and(|l| l.file().contains("/registry/src/"));
            if !third_party {
                abort(info);
            }
        }));
    },
    |data: &[u8]| {
    let Some((&mode, file)) = data.split_first() else {
        return;
    };
    let color = COLORS[usize::from(mode & 15) % COLORS.len()];
    let budget = BUDGETS[usize::from(mode >> 4) & 3];
    let probed = probe(file);
    let base = LIVE.load(Ordering::Relaxed);
    PEAK.store(base, Ordering::Relaxed);
    let decoded = decode(file, color, budget);
    let grew = PEAK.load(Ordering::Relaxed).saturating_sub(base);
    let allowed = budget + DECODER_STATE;
    assert!(
        grew <= allowed,
        "decoding took {grew} bytes of heap with a budget of {budget} ({:?})",
        probed
    );
    let Ok(img) = decoded else { return };
    let (w, h, _) = probed.expect("a decodable image probes");
    let shape = img.shape().to_vec();
    assert_eq!(shape, vec![h as usize, w as usize, color.channels()]);
    assert_eq!(img.data().len(), shape.iter().product::<usize>());
    assert!(img.data().len() <= budget);
    }
);
