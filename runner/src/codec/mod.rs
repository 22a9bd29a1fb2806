//! Continuation codecs.
