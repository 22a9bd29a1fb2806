//! The QuickJS side of a run: one [`Engine`] per worker thread.

mod alloc;
mod arena;
mod bytecode;
mod console;
mod engine;
mod execution;
mod interrupt;
mod js;
mod serialize;
mod stack_guard;

pub(crate) use engine::Engine;
pub(crate) use serialize::MAX_DEPTH;
