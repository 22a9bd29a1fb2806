//! A worker's JavaScript heap: one reserved address range, and an image of it
//! that puts every byte back.
//!
//! The engine's whole state (the runtime, its one realm, the allocator's own
//! bookkeeping) lives inside the range. Right after a hardened realm is built,
//! [`Arena::save`] copies the used part; after each run [`Arena::restore`] copies
//! it back. Nothing a run did survives that, not even in memory the engine
//! considers free, and restoring costs a copy of about a hundred kilobytes
//! where building a realm costs a hundred microseconds.
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

/// How much the heap grows at a time: small while an image is built (the
/// image copies the whole heap), large while scripts run.
#[derive(Clone, Copy)]
pub(crate) enum GrowthStep {
    /// While building what [`Arena::save`] will copy.
    Tight,
    /// While scripts run.
    Generous,
}

impl GrowthStep {
    fn bytes(self) -> usize {
        match self {
            GrowthStep::Tight => 16 * 1024,
            GrowthStep::Generous => 512 * 1024,
        }
    }
}

/// Pages of the range, kept outside it: an image must not roll them back.
struct Pages {
    base: *mut u8,
    end: *mut u8,
    /// Writable up to here.
    committed: Cell<*mut u8>,
    /// Highest heap end since the last restore.
    high_water: Cell<*mut u8>,
    step: Cell<GrowthStep>,
}

impl Pages {
    /// Makes the range up to `end` writable.
    fn commit(&self, end: *mut u8) -> bool {
        let committed = self.committed.get();
        if end <= committed {
            return true;
        }
        let target =
            align_up(end as usize - self.base as usize, COMMIT_STEP).min(self.end as usize - self.base as usize);
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

// SAFETY: `acquire` touches no other allocator: it only changes page
// protections and extends this heap.
unsafe impl Source for Growth {
    fn acquire<B: talc::base::binning::Binning>(talc: &mut Talc<Self, B>, layout: Layout) -> Result<(), ()> {
        // SAFETY: `pages` outlives the heap (both belong to one `Arena`).
        let pages = unsafe { &*talc.source.pages };
        let heap_end = talc.source.heap_end;
        let used = heap_end as usize - pages.base as usize;
        let room = pages.end as usize - heap_end as usize;
        let wanted = layout.size().saturating_add(layout.align()).saturating_add(64).max(pages.step.get().bytes());
        if wanted > room {
            return Err(());
        }
        let new_end =
            pages.base.wrapping_add(align_up(used + wanted, PAGE).min(pages.end as usize - pages.base as usize));
        if !pages.commit(new_end) {
            return Err(());
        }
        let heap_end = NonNull::new(heap_end).ok_or(())?;
        // SAFETY: [heap_end, new_end) is writable and unclaimed.
        let end = unsafe { talc.extend(heap_end, new_end) };
        talc.source.heap_end = end.as_ptr();
        if end.as_ptr() > pages.high_water.get() {
            pages.high_water.set(end.as_ptr());
        }
        Ok(())
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
    reserved: usize,
    image: OnceCell<Box<[u8]>>,
}

impl Arena {
    /// Reserves the range and sets up an empty heap in it.
    pub(crate) fn new() -> Result<Arena, String> {
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
            return Err(format!("cannot reserve the engine's heap: {}", std::io::Error::last_os_error()));
        }
        let base = base.cast::<u8>();
        let pages = Box::new(Pages {
            base,
            end: base.wrapping_add(reserved),
            committed: Cell::new(base),
            high_water: Cell::new(base),
            step: Cell::new(GrowthStep::Tight),
        });
        let arena = Arena { heap: base.cast(), pages, reserved, image: OnceCell::new() };
        let heap_start = align_up(size_of::<Heap>(), 64);
        let first_end = base.wrapping_add(heap_start + FIRST_HEAP);
        if !arena.pages.commit(first_end) {
            return Err(format!("cannot commit the engine's heap: {}", std::io::Error::last_os_error()));
        }
        let growth = Growth { heap_end: ptr::null_mut(), pages: &*arena.pages };
        // SAFETY: the start of the range is writable, aligned and unused; the
        // heap claimed after it is writable too.
        unsafe {
            arena.heap.write(Talc::new(growth));
            let heap = &mut *arena.heap;
            let end = heap.claim(base.add(heap_start), FIRST_HEAP).ok_or("the engine's first heap is too small")?;
            heap.source.heap_end = end.as_ptr();
        }
        arena.pages.high_water.set(arena.heap_end());
        Ok(arena)
    }

    fn heap_end(&self) -> *mut u8 {
        // SAFETY: the heap lives as long as the arena.
        unsafe { (*self.heap).source.heap_end }
    }

    /// Sets how the heap grows from now on.
    pub(crate) fn grow_by(&self, step: GrowthStep) {
        self.pages.step.set(step);
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
        unsafe { (*self.heap).deallocate(block, layout) }
    }

    /// Resizes a block, in place when possible; null (and the old block kept) on failure.
    ///
    /// # Safety
    /// `block` came from this arena with `layout`.
    pub(crate) unsafe fn reallocate(&self, block: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        unsafe {
            let heap = &mut *self.heap;
            if heap.try_realloc_in_place(block, layout, new_size) {
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

    /// Copies the heap as it is now, once; [`Arena::restore`] brings this state back.
    pub(crate) fn save(&self) {
        let len = self.heap_end() as usize - self.pages.base as usize;
        // SAFETY: [base, heap_end) is committed; every byte of it is initialized
        // (fresh pages are zero) and nothing writes it during the copy.
        let bytes = unsafe { std::slice::from_raw_parts(self.pages.base, len) };
        if self.image.set(bytes.into()).is_ok() {
            self.pages.high_water.set(self.heap_end());
        }
    }

    /// Puts every byte of the saved heap back; pages the run grew into beyond
    /// [`KEEP_RESIDENT`] go back to the system. Does nothing without an image.
    ///
    /// # Safety
    /// No engine code runs during the call, and nothing outside the arena
    /// refers to memory allocated since [`Arena::save`], or holds a counted
    /// reference it took since then.
    pub(crate) unsafe fn restore(&self) {
        let Some(image) = self.image.get() else { return };
        unsafe { ptr::copy_nonoverlapping(image.as_ptr(), self.pages.base, image.len()) };
        let image_end = self.pages.base.wrapping_add(image.len());
        let high_water = self.pages.high_water.get();
        if high_water as usize > image_end as usize + KEEP_RESIDENT {
            let from = self.pages.base.wrapping_add(align_up(image.len(), PAGE));
            // SAFETY: [from, high_water) is inside the committed range and now unused.
            unsafe { libc::madvise(from.cast(), high_water as usize - from as usize, libc::MADV_DONTNEED) };
        }
        self.pages.high_water.set(image_end);
    }
}

impl Drop for Arena {
    fn drop(&mut self) {
        // SAFETY: the range was mapped by `new`; whoever allocated in it is gone.
        unsafe { libc::munmap(self.pages.base.cast(), self.reserved) };
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
        unsafe { kept.write_bytes(7, 100) };
        arena.save();
        arena.grow_by(GrowthStep::Generous);
        for round in 0..3u8 {
            unsafe { kept.write_bytes(round, 100) };
            let blocks: Vec<*mut u8> = (0..1000).map(|i| arena.allocate(layout(16 + i * 8))).collect();
            assert!(blocks.iter().all(|b| !b.is_null()));
            let big = arena.allocate(layout(8 * 1024 * 1024));
            assert!(!big.is_null());
            unsafe { big.write_bytes(1, 8 * 1024 * 1024) };
            unsafe { arena.restore() };
            assert!((0..100).all(|i| unsafe { *kept.add(i) } == 7));
            // The same allocations land in the same places: the allocator's state came back too.
            let again = arena.allocate(layout(16));
            assert_eq!(again, blocks[0], "round {round}");
            unsafe { arena.restore() };
        }
    }

    #[test]
    fn the_heap_grows_to_the_reserve_and_fails_beyond() {
        let arena = Arena::new().unwrap();
        arena.grow_by(GrowthStep::Generous);
        let block = arena.allocate(layout(64 * 1024 * 1024));
        assert!(!block.is_null());
        unsafe { block.add(64 * 1024 * 1024 - 1).write(1) };
        let reallocated = unsafe { arena.reallocate(block, layout(64 * 1024 * 1024), 65 * 1024 * 1024) };
        assert!(!reallocated.is_null());
        assert!(arena.allocate(layout(MAX_MEMORY_BYTES + ENGINE_ROOM)).is_null());
    }

    /// Pages a big run grew into go back to the system with the restore.
    #[test]
    fn a_restore_returns_what_a_big_run_grew_into() {
        let arena = Arena::new().unwrap();
        arena.save();
        arena.grow_by(GrowthStep::Generous);
        let size = 32 * 1024 * 1024;
        let block = arena.allocate(layout(size));
        unsafe { block.write_bytes(1, size) };
        let resident = |block: *mut u8| {
            let start = (block as usize / PAGE) * PAGE;
            let pages = size / PAGE;
            let mut flags = vec![0u8; pages + 1];
            assert_eq!(unsafe { libc::mincore(start as *mut libc::c_void, pages * PAGE, flags.as_mut_ptr()) }, 0);
            flags.iter().filter(|f| **f & 1 == 1).count()
        };
        assert!(resident(block) > size / PAGE / 2);
        unsafe { arena.restore() };
        // Only pages inside the image (its first few) stay.
        assert!(resident(block) < 64, "{} pages still resident", resident(block));
    }
}
