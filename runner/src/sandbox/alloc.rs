//! A metered allocator: the engine's heap limit, with a latch the guest cannot catch.
//!
//! QuickJS turns a failed allocation into an ordinary, catchable exception.
//! Counting every byte here lets the runner notice the failure itself: the
//! `exceeded` latch stays set, the interrupt handler then stops the run, and the
//! run ends with `RUN_MEMORY_LIMIT` whatever the script caught.
//!
//! Guest blocks come from the worker's [`Arena`]; the compiler's from
//! mimalloc (the system allocator's per-thread arenas grow and shrink with an
//! `mprotect` call each time a context is built and freed).

use super::arena::Arena;
use mimalloc::MiMalloc;
use rquickjs::allocator::Allocator;
use std::alloc::{GlobalAlloc, Layout};
use std::cell::Cell;
use std::rc::Rc;

const HEADER: usize = 16;
const ALIGN: usize = 16;

/// Shared between the allocator and the worker that owns the runtime.
#[derive(Default)]
pub(crate) struct HeapMeter {
    used: Cell<usize>,
    /// Absolute ceiling on `used`; `usize::MAX` while setting up a realm.
    ceiling: Cell<usize>,
    exceeded: Cell<bool>,
}

impl HeapMeter {
    pub(crate) fn new() -> Rc<Self> {
        let meter = Rc::new(HeapMeter::default());
        meter.ceiling.set(usize::MAX);
        meter
    }

    /// Bytes currently allocated by the engine (live and garbage).
    pub(crate) fn used(&self) -> usize {
        self.used.get()
    }

    /// Allows `budget` more bytes than are in use now; clears the latch.
    pub(crate) fn start_budget(&self, budget: usize) {
        self.exceeded.set(false);
        self.ceiling.set(self.used.get().saturating_add(budget));
    }

    /// Lifts the ceiling (between runs).
    pub(crate) fn lift(&self) {
        self.ceiling.set(usize::MAX);
    }

    /// Sets the count back to `used` (after the heap was restored to an image).
    pub(crate) fn reset_to(&self, used: usize) {
        self.used.set(used);
    }

    /// Whether an allocation was refused since the budget started.
    pub(crate) fn exceeded(&self) -> bool {
        self.exceeded.get()
    }

    fn admit(&self, extra: usize) -> bool {
        let next = self.used.get().saturating_add(extra);
        if next > self.ceiling.get() {
            self.exceeded.set(true);
            return false;
        }
        true
    }
}

/// Where a metered allocator's blocks come from.
pub(crate) trait Blocks: 'static {
    /// A block of `layout`, zeroed when asked; null on failure.
    fn allocate(&self, layout: Layout, zeroed: bool) -> *mut u8;
    /// Frees a block.
    ///
    /// # Safety
    /// `block` came from this source with `layout`.
    unsafe fn deallocate(&self, block: *mut u8, layout: Layout);
    /// Resizes a block; null (the old block kept) on failure.
    ///
    /// # Safety
    /// `block` came from this source with `layout`, and `new_size` is non-zero and is the size
    /// of a valid layout with `layout`'s alignment.
    unsafe fn reallocate(&self, block: *mut u8, layout: Layout, new_size: usize) -> *mut u8;
}

/// Blocks from mimalloc (the compiler's runtime).
pub(crate) struct SystemBlocks;

impl Blocks for SystemBlocks {
    fn allocate(&self, layout: Layout, zeroed: bool) -> *mut u8 {
        // SAFETY: `layout` has a non-zero size (it includes the header).
        unsafe { if zeroed { MiMalloc.alloc_zeroed(layout) } else { MiMalloc.alloc(layout) } }
    }

    unsafe fn deallocate(&self, block: *mut u8, layout: Layout) {
        // SAFETY: the caller guarantees `block` came from mimalloc (this source) with `layout`.
        unsafe { MiMalloc.dealloc(block, layout) }
    }

    unsafe fn reallocate(&self, block: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        // SAFETY: `block` came from mimalloc with `layout`, and `new_size` is non-zero and valid
        // for `layout`'s alignment (the caller's contract).
        unsafe { MiMalloc.realloc(block, layout, new_size) }
    }
}

/// Blocks from a worker's arena (the guest runtime).
impl Blocks for Rc<Arena> {
    fn allocate(&self, layout: Layout, zeroed: bool) -> *mut u8 {
        let block = Arena::allocate(self, layout);
        if zeroed && !block.is_null() {
            // SAFETY: the block has `layout.size()` writable bytes.
            unsafe { block.write_bytes(0, layout.size()) };
        }
        block
    }

    unsafe fn deallocate(&self, block: *mut u8, layout: Layout) {
        // SAFETY: the caller guarantees `block` came from this arena with `layout`.
        unsafe { Arena::deallocate(self, block, layout) }
    }

    unsafe fn reallocate(&self, block: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        // SAFETY: `block` came from this arena with `layout` and `new_size` is non-zero (the
        // caller's contract).
        unsafe { Arena::reallocate(self, block, layout, new_size) }
    }
}

/// The allocator installed in the engine's runtimes.
pub(crate) struct MeteredAllocator<B: Blocks> {
    pub(crate) meter: Rc<HeapMeter>,
    pub(crate) blocks: B,
}

fn layout(size: usize) -> Option<Layout> {
    Layout::from_size_align(size.checked_add(HEADER)?, ALIGN).ok()
}

/// The size recorded in the header of an allocator block.
///
/// # Safety
/// `ptr` is non-null and was returned by a [`MeteredAllocator`] that has not freed it since.
unsafe fn size_of_block(ptr: *mut u8) -> usize {
    // SAFETY: such a block starts `HEADER` bytes before `ptr`, 16-byte aligned, with its size
    // written there as a `usize`.
    unsafe { ptr.sub(HEADER).cast::<usize>().read() }
}

// SAFETY: every block has `HEADER` bytes before the pointer handed out, and both sources align it
// to 16, so the pointer is 16-aligned with at least the requested size after it; `usable_size`
// returns that requested size, read back from the header.
unsafe impl<B: Blocks> Allocator for MeteredAllocator<B> {
    fn alloc(&mut self, size: usize) -> *mut u8 {
        self.allocate(size, false)
    }

    fn calloc(&mut self, count: usize, size: usize) -> *mut u8 {
        match count.checked_mul(size) {
            Some(total) => self.allocate(total, true),
            None => std::ptr::null_mut(),
        }
    }

    unsafe fn dealloc(&mut self, ptr: *mut u8) {
        if ptr.is_null() {
            return;
        }
        // SAFETY: `ptr` is non-null and came from this allocator (the trait's contract), so its
        // header holds the size it was allocated or last resized with, and its block starts
        // `HEADER` bytes before it with `layout(size)`.
        unsafe {
            let size = size_of_block(ptr);
            self.meter.used.set(self.meter.used.get() - size);
            self.blocks.deallocate(ptr.sub(HEADER), layout(size).expect("layout was valid at allocation"));
        }
    }

    unsafe fn realloc(&mut self, ptr: *mut u8, new_size: usize) -> *mut u8 {
        if ptr.is_null() {
            return self.allocate(new_size, false);
        }
        // SAFETY: `ptr` is non-null and came from this allocator (the trait's contract).
        let old_size = unsafe { size_of_block(ptr) };
        if new_size > old_size && !self.meter.admit(new_size - old_size) {
            return std::ptr::null_mut();
        }
        let Some(new_layout) = layout(new_size) else { return std::ptr::null_mut() };
        // SAFETY: the block starts `HEADER` bytes before `ptr` with `layout(old_size)`, and
        // `new_layout` is a valid layout of non-zero size with the same alignment; a non-null
        // result has `new_layout.size()` bytes, room for the header and `new_size` after it.
        unsafe {
            let old_layout = layout(old_size).expect("layout was valid at allocation");
            let base = self.blocks.reallocate(ptr.sub(HEADER), old_layout, new_layout.size());
            if base.is_null() {
                self.meter.exceeded.set(true);
                return std::ptr::null_mut();
            }
            base.cast::<usize>().write(new_size);
            self.meter.used.set(self.meter.used.get() - old_size + new_size);
            base.add(HEADER)
        }
    }

    unsafe fn usable_size(ptr: *mut u8) -> usize {
        // SAFETY: the caller guarantees `ptr` came from this allocator; rquickjs answers a null
        // pointer itself before calling here.
        unsafe { size_of_block(ptr) }
    }
}

impl<B: Blocks> MeteredAllocator<B> {
    fn allocate(&mut self, size: usize, zeroed: bool) -> *mut u8 {
        let Some(layout) = layout(size) else { return std::ptr::null_mut() };
        if !self.meter.admit(size) {
            return std::ptr::null_mut();
        }
        let base = self.blocks.allocate(layout, zeroed);
        if base.is_null() {
            // Out of blocks (the arena's extent is confined to the run's budget too): a
            // limit like the count's, and as uncatchable.
            self.meter.exceeded.set(true);
            return std::ptr::null_mut();
        }
        // SAFETY: `base` is a non-null, 16-aligned block of `size + HEADER` bytes, so the header
        // write and the pointer `HEADER` bytes in stay inside it.
        unsafe {
            base.cast::<usize>().write(size);
            self.meter.used.set(self.meter.used.get() + size);
            base.add(HEADER)
        }
    }
}
