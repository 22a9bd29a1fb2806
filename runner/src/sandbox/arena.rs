//! A worker's JavaScript heap: one reserved address range, and an image of it
//! that puts every byte back.
//!
//! The engine's whole state (the runtime, its one realm, the allocator's own
//! bookkeeping) lives inside the range. Right after a hardened realm is built,
//! [`Arena::save`] copies the used part; after each run [`Arena::restore`] copies
//! it back and clears whatever the run grew into above it. Nothing a run did
//! survives that, not even in memory the engine considers free, and restoring
//! costs a copy of about two hundred kilobytes where building a realm costs
//! about two hundred microseconds. While a run goes on, [`Arena::confine`] keeps
//! the heap's extent within the run's memory limit.
//!
//! The range is reserved without access and made writable as the heap grows,
//! so reserving room for the largest memory limit costs no memory.

use std::alloc::Layout;
use std::cell::{Cell, OnceCell};
use std::ptr::{self, NonNull};
use talc::DefaultBinning;
use talc::base::Talc;
use talc::source::Source;

use crate::limits::MAX_MEMORY_BYTES;

const PAGE: usize = 4096;
/// Room for the engine beyond the largest memory limit a run can have.
const ENGINE_ROOM: usize = 256 * 1024 * 1024;
/// Address range made writable at a time.
const COMMIT_STEP: usize = 1024 * 1024;
/// The first heap: enough for the allocator's bins and a runtime's first objects.
const FIRST_HEAP: usize = 64 * 1024;
/// Memory above the image a run may leave resident; beyond it, pages go back to the system.
const KEEP_RESIDENT: usize = 4 * 1024 * 1024;

type Heap = Talc<Growth, DefaultBinning>;

/// How much the heap grows at a time before the image is saved: little, since the image copies
/// the whole heap.
const IMAGE_STEP: usize = 16 * 1024;
/// The smallest growth while scripts run (a quarter of the heap otherwise); a restore clears
/// what a run grew, so small steps keep that cheap for small runs.
const MIN_RUN_STEP: usize = 64 * 1024;

/// Pages of the range, kept outside it: an image must not roll them back.
struct Pages {
    base: *mut u8,
    end: *mut u8,
    /// Writable up to here.
    committed: Cell<*mut u8>,
    /// Highest heap end since the last restore.
    high_water: Cell<*mut u8>,
    /// The heap may not grow past this (see [`Arena::confine`]).
    limit: Cell<*mut u8>,
    /// Whether the image is saved (scripts run from now on).
    saved: Cell<bool>,
}

impl Pages {
    /// Bytes of the reserved range.
    fn len(&self) -> usize {
        self.end as usize - self.base as usize
    }

    /// How much a heap of `heap` bytes grows at a time.
    fn step(&self, heap: usize) -> usize {
        if self.saved.get() { (heap / 4).max(MIN_RUN_STEP) } else { IMAGE_STEP }
    }

    /// Makes the range up to `end` writable.
    fn commit(&self, end: *mut u8) -> bool {
        let committed = self.committed.get();
        if end <= committed {
            return true;
        }
        let target = align_up(end as usize - self.base as usize, COMMIT_STEP).min(self.len());
        let target = self.base.wrapping_add(target);
        // SAFETY: [committed, target) lies inside the range this arena mapped.
        let done = unsafe {
            libc::mprotect(committed.cast(), target as usize - committed as usize, libc::PROT_READ | libc::PROT_WRITE)
        };
        if done != 0 {
            return false;
        }
        self.committed.set(target);
        true
    }
}

/// The allocator's source of memory; it lives inside the arena with the
/// allocator, so an image restores the heap's extent with everything else.
#[derive(Debug)]
struct Growth {
    heap_end: *mut u8,
    pages: *const Pages,
}

impl Growth {
    /// Extends the heap by at least `needed` bytes, by the growth step when `step`, never past
    /// the limit. Free space at the heap's top joins the extension, so an extension that ends
    /// at the limit may serve a request larger than the room left; a heap already at its limit
    /// cannot grow.
    fn extend<B: talc::base::binning::Binning>(talc: &mut Talc<Self, B>, needed: usize, step: bool) -> Result<(), ()> {
        // SAFETY: `pages` outlives the heap (both belong to one `Arena`).
        let pages = unsafe { &*talc.source.pages };
        let heap_end = talc.source.heap_end;
        let used = heap_end as usize - pages.base as usize;
        let room = (pages.limit.get() as usize).saturating_sub(heap_end as usize);
        if room < PAGE {
            return Err(());
        }
        let wanted = if step { pages.step(used).max(needed) } else { needed };
        let limit = pages.limit.get() as usize - pages.base as usize;
        let new_end = pages.base.wrapping_add(align_up(used + wanted.min(room), PAGE).min(limit));
        if !pages.commit(new_end) {
            return Err(());
        }
        let heap_end = NonNull::new(heap_end).ok_or(())?;
        // SAFETY: [heap_end, new_end) is writable and unclaimed.
        let end = unsafe { talc.extend(heap_end, new_end) };
        if end.as_ptr() == heap_end.as_ptr() {
            return Err(());
        }
        talc.source.heap_end = end.as_ptr();
        if end.as_ptr() > pages.high_water.get() {
            pages.high_water.set(end.as_ptr());
        }
        Ok(())
    }
}

/// Room for talc's tags around a block.
const BLOCK_OVERHEAD: usize = 64;

// SAFETY: `acquire` touches no other allocator: it only changes page
// protections and extends this heap.
unsafe impl Source for Growth {
    fn acquire<B: talc::base::binning::Binning>(talc: &mut Talc<Self, B>, layout: Layout) -> Result<(), ()> {
        let needed = layout.size().saturating_add(layout.align()).saturating_add(BLOCK_OVERHEAD);
        Growth::extend(talc, needed, true)
    }
}

impl std::fmt::Debug for Pages {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Pages").field("base", &self.base).finish()
    }
}

/// A reserved range with an allocator in it, and its saved image.
pub(crate) struct Arena {
    heap: *mut Heap,
    pages: Box<Pages>,
    image: OnceCell<Box<[u8]>>,
}

impl Arena {
    /// Reserves the range and sets up an empty heap in it.
    pub(crate) fn new() -> std::io::Result<Arena> {
        let reserved = MAX_MEMORY_BYTES + ENGINE_ROOM;
        // SAFETY: a fresh private mapping; nothing else refers to it.
        let base = unsafe {
            libc::mmap(
                ptr::null_mut(),
                reserved,
                libc::PROT_NONE,
                libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_NORESERVE,
                -1,
                0,
            )
        };
        if base == libc::MAP_FAILED {
            return Err(std::io::Error::last_os_error());
        }
        let base = base.cast::<u8>();
        let pages = Box::new(Pages {
            base,
            end: base.wrapping_add(reserved),
            committed: Cell::new(base),
            high_water: Cell::new(base),
            limit: Cell::new(base.wrapping_add(reserved)),
            saved: Cell::new(false),
        });
        let arena = Arena { heap: base.cast(), pages, image: OnceCell::new() };
        let heap_start = align_up(size_of::<Heap>(), 64);
        let first_end = base.wrapping_add(heap_start + FIRST_HEAP);
        if !arena.pages.commit(first_end) {
            return Err(std::io::Error::last_os_error());
        }
        let growth = Growth { heap_end: ptr::null_mut(), pages: &*arena.pages };
        // SAFETY: the start of the range is writable, aligned and unused; the
        // heap claimed after it is writable too.
        unsafe {
            arena.heap.write(Talc::new(growth));
            let heap = &mut *arena.heap;
            let end = heap
                .claim(base.add(heap_start), FIRST_HEAP)
                .ok_or_else(|| std::io::Error::other("the engine's first heap is too small"))?;
            heap.source.heap_end = end.as_ptr();
        }
        arena.pages.high_water.set(arena.heap_end());
        Ok(arena)
    }

    fn heap_end(&self) -> *mut u8 {
        // SAFETY: the heap lives as long as the arena.
        unsafe { (*self.heap).source.heap_end }
    }

    /// A block of `layout`, or null.
    pub(crate) fn allocate(&self, layout: Layout) -> *mut u8 {
        // SAFETY: the heap is only used from the thread that owns this arena.
        unsafe { (*self.heap).allocate(layout).map_or(ptr::null_mut(), NonNull::as_ptr) }
    }

    /// Frees a block this arena allocated with `layout`.
    ///
    /// # Safety
    /// `block` came from [`Arena::allocate`] or [`Arena::reallocate`] with `layout`.
    pub(crate) unsafe fn deallocate(&self, block: *mut u8, layout: Layout) {
        // SAFETY: the caller guarantees `block` came from this heap with `layout`; the heap lives
        // as long as the arena and is used only from its thread, with no other borrow of it live.
        unsafe { (*self.heap).deallocate(block, layout) }
    }

    /// Resizes a block, in place when possible; null (and the old block kept) on failure.
    ///
    /// # Safety
    /// `block` came from this arena with `layout`, and `new_size` is not zero.
    pub(crate) unsafe fn reallocate(&self, block: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        // SAFETY: the heap lives as long as the arena and is used only from its thread, so this is
        // the one borrow of it; `block` came from it with `layout` and `new_size` is non-zero (the
        // caller's contract); the copy runs between two distinct live blocks, within both, and the
        // old block is freed with its own layout.
        unsafe {
            let heap = &mut *self.heap;
            if heap.try_realloc_in_place(block, layout, new_size) {
                return block;
            }
            // A block at the heap's top grows in place once the heap grows by the difference
            // (growing arrays and strings do this all the time): without it, the old and the
            // new block would both have to fit within the run's confined heap for a moment.
            if new_size > layout.size()
                && Growth::extend(heap, new_size - layout.size() + BLOCK_OVERHEAD, false).is_ok()
                && heap.try_realloc_in_place(block, layout, new_size)
            {
                return block;
            }
            let Ok(new_layout) = Layout::from_size_align(new_size, layout.align()) else { return ptr::null_mut() };
            let Some(moved) = heap.allocate(new_layout) else { return ptr::null_mut() };
            ptr::copy_nonoverlapping(block, moved.as_ptr(), layout.size().min(new_size));
            heap.deallocate(block, layout);
            moved.as_ptr()
        }
    }

    /// Bytes [`Arena::restore`] copies.
    #[cfg(test)]
    pub(crate) fn image_bytes(&self) -> usize {
        self.image.get().map_or(0, |image| image.len())
    }

    /// Copies the heap as it is now, once; [`Arena::restore`] brings this state back. From
    /// now on the heap grows in larger steps.
    pub(crate) fn save(&self) {
        let len = self.heap_end() as usize - self.pages.base as usize;
        // SAFETY: [base, heap_end) is committed; every byte of it is initialized
        // (fresh pages are zero) and nothing writes it during the copy.
        let bytes = unsafe { std::slice::from_raw_parts(self.pages.base, len) };
        if self.image.set(bytes.into()).is_ok() {
            self.pages.high_water.set(self.heap_end());
            self.pages.saved.set(true);
        }
    }

    /// Keeps the heap's whole extent within `bytes` above the image until the next restore: what
    /// a run holds, garbage and the gaps between its blocks all count, so the memory a run
    /// makes resident stays within its limit. Growth beyond it fails like any allocation.
    pub(crate) fn confine(&self, bytes: usize) {
        let image = self.image.get().map_or(0, |image| image.len());
        let limit = image.saturating_add(bytes).min(self.pages.len());
        self.pages.limit.set(self.pages.base.wrapping_add(limit));
    }

    /// Puts every byte of the saved heap back and clears what the run grew into above it: up
    /// to [`KEEP_RESIDENT`] is zeroed in place, pages beyond go back to the system (and read
    /// as zero when touched again). So no byte a run wrote is left anywhere in the arena.
    /// Lifts [`Arena::confine`]. Does nothing without an image.
    ///
    /// # Safety
    /// No engine code runs during the call, and nothing outside the arena refers to memory
    /// allocated since [`Arena::save`], or holds a counted reference it took since then. In
    /// particular no rquickjs object that keeps runtime-wide Rust state (a Rust function
    /// or class instance of a type not made before the image, user data) may be created
    /// during a run: rquickjs would keep a handle to it across the restore.
    pub(crate) unsafe fn restore(&self) {
        let Some(image) = self.image.get() else { return };
        // SAFETY: the image was copied from [base, base + len), which stays committed (commits are
        // never undone); the image's own buffer lives outside the range; and by the caller's
        // contract nothing uses or borrows the heap while it is overwritten.
        unsafe { ptr::copy_nonoverlapping(image.as_ptr(), self.pages.base, image.len()) };
        let image_end = self.pages.base.wrapping_add(image.len());
        let grown = (self.pages.high_water.get() as usize).saturating_sub(image_end as usize);
        // Both branches below clear [image_end, high_water): committed memory that, after the
        // copy, lies outside the heap.
        if grown <= KEEP_RESIDENT {
            // SAFETY: [image_end, image_end + grown) is committed (the heap never grew past the
            // committed end) and, after the copy, no block and nothing outside refers to it.
            unsafe { image_end.write_bytes(0, grown) };
        } else {
            let page = self.pages.base.wrapping_add(align_up(image.len(), PAGE));
            // SAFETY: `page` is page-aligned and lies between `image_end` and `high_water` (which
            // is more than `KEEP_RESIDENT` above it), all committed and, after the copy, unused;
            // dropping private anonymous pages makes them read as zero, never unmaps them.
            unsafe {
                image_end.write_bytes(0, page as usize - image_end as usize);
                libc::madvise(page.cast(), self.pages.high_water.get() as usize - page as usize, libc::MADV_DONTNEED);
            }
        }
        self.pages.high_water.set(image_end);
        self.pages.limit.set(self.pages.end);
    }
}

impl Drop for Arena {
    fn drop(&mut self) {
        // SAFETY: the range was mapped by `new`; whoever allocated in it is gone.
        unsafe { libc::munmap(self.pages.base.cast(), self.pages.len()) };
    }
}

fn align_up(value: usize, to: usize) -> usize {
    value.div_ceil(to) * to
}

#[cfg(test)]
mod tests {
    use super::*;

    fn layout(size: usize) -> Layout {
        Layout::from_size_align(size, 16).unwrap()
    }

    #[test]
    fn a_restore_brings_back_every_byte_and_the_allocator_state() {
        let arena = Arena::new().unwrap();
        let kept = arena.allocate(layout(100));
        // SAFETY: `kept` is a 100-byte block of the fresh arena (its first heap has room).
        unsafe { kept.write_bytes(7, 100) };
        arena.save();
        for round in 0..3u8 {
            // SAFETY: `kept` predates the image, so every restore brings it back as a live block.
            unsafe { kept.write_bytes(round, 100) };
            let blocks: Vec<*mut u8> = (0..1000).map(|i| arena.allocate(layout(16 + i * 8))).collect();
            assert!(blocks.iter().all(|b| !b.is_null()));
            let big = arena.allocate(layout(8 * 1024 * 1024));
            assert!(!big.is_null());
            // SAFETY: `big` is non-null (asserted), a block of 8 MiB.
            unsafe { big.write_bytes(1, 8 * 1024 * 1024) };
            // SAFETY: no engine runs here, and the blocks made since the save are only compared
            // by address afterwards, never read or written.
            unsafe { arena.restore() };
            // SAFETY: the restore brought back `kept` with the 100 bytes it had at the save.
            assert!((0..100).all(|i| unsafe { *kept.add(i) } == 7));
            // The same allocations land in the same places: the allocator's state came back too.
            let again = arena.allocate(layout(16));
            assert_eq!(again, blocks[0], "round {round}");
            // SAFETY: as above: nothing made since the save is used after this restore.
            unsafe { arena.restore() };
        }
    }

    #[test]
    fn the_heap_grows_to_the_reserve_and_fails_beyond() {
        let arena = Arena::new().unwrap();
        let block = arena.allocate(layout(64 * 1024 * 1024));
        assert!(!block.is_null());
        // SAFETY: `block` is non-null (asserted), a block of 64 MiB; this is its last byte.
        unsafe { block.add(64 * 1024 * 1024 - 1).write(1) };
        // SAFETY: `block` came from this arena with this layout, and the new size is not zero.
        let reallocated = unsafe { arena.reallocate(block, layout(64 * 1024 * 1024), 65 * 1024 * 1024) };
        assert!(!reallocated.is_null());
        assert!(arena.allocate(layout(MAX_MEMORY_BYTES + ENGINE_ROOM)).is_null());
    }

    /// Pages a big run grew into go back to the system with the restore.
    #[test]
    fn a_restore_returns_what_a_big_run_grew_into() {
        let arena = Arena::new().unwrap();
        arena.save();
        let size = 32 * 1024 * 1024;
        let block = arena.allocate(layout(size));
        // SAFETY: `block` is a block of `size` bytes (the reserve is far larger).
        unsafe { block.write_bytes(1, size) };
        let resident = |block: *mut u8| {
            let start = (block as usize / PAGE) * PAGE;
            let pages = size / PAGE;
            let mut flags = vec![0u8; pages + 1];
            // SAFETY: [start, start + pages * PAGE) is page-aligned and inside the arena's mapping,
            // and `flags` has a byte for each of those pages.
            assert_eq!(unsafe { libc::mincore(start as *mut libc::c_void, pages * PAGE, flags.as_mut_ptr()) }, 0);
            flags.iter().filter(|f| **f & 1 == 1).count()
        };
        assert!(resident(block) > size / PAGE / 2);
        // SAFETY: no engine runs here, and `block` is only used afterwards as an address.
        unsafe { arena.restore() };
        // Only pages inside the image (its first few) stay.
        assert!(resident(block) < 64, "{} pages still resident", resident(block));
    }

    /// A confined heap cannot grow past its allowance, whatever the allocation; the restore
    /// lifts it.
    #[test]
    fn a_confined_heap_stays_within_its_allowance() {
        let arena = Arena::new().unwrap();
        arena.save();
        arena.confine(1024 * 1024);
        let small: Vec<*mut u8> = (0..100).map(|_| arena.allocate(layout(4096))).collect();
        assert!(small.iter().all(|b| !b.is_null()));
        assert!(arena.allocate(layout(2 * 1024 * 1024)).is_null());
        let extent = arena.heap_end() as usize - arena.pages.base as usize;
        assert!(extent <= arena.image_bytes() + 1024 * 1024, "{extent}");
        // SAFETY: no engine runs here, and the blocks in `small` are never used again.
        unsafe { arena.restore() };
        assert!(!arena.allocate(layout(2 * 1024 * 1024)).is_null());
    }

    /// After a restore no byte a run wrote above the image is left, small runs and big.
    #[test]
    fn a_restore_leaves_nothing_above_the_image() {
        let arena = Arena::new().unwrap();
        arena.save();
        for size in [100 * 1024, 16 * 1024 * 1024] {
            let block = arena.allocate(layout(size));
            // SAFETY: `block` is a block of `size` bytes (the reserve is far larger).
            unsafe { block.write_bytes(0xA5, size) };
            // SAFETY: no engine runs here; `block` is only read below as the arena's raw memory.
            unsafe { arena.restore() };
            let image_end = arena.pages.base.wrapping_add(arena.image_bytes());
            let start = (block as usize).max(image_end as usize) as *const u8;
            // SAFETY: [start, block + size) is committed memory of the arena (commits are never
            // undone) that nothing writes while the slice lives; cleared or dropped pages read as 0.
            let tail = unsafe { std::slice::from_raw_parts(start, block as usize + size - start as usize) };
            assert!(tail.iter().all(|&b| b == 0), "{size}: a run's bytes survived the restore");
        }
    }
}
