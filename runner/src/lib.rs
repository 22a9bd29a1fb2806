//! The QuickJS sandbox of Resumable.

pub mod codec;
