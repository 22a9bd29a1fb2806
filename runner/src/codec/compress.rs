//! Compression of continuation state, applied by the runner before a codec encodes it and
//! undone after a codec decoded it.
//!
//! # Format
//!
//! One tag byte, then the payload:
//!
//! * [`STORED`] (`0`): the state itself. Used for states shorter than
//!   [`MIN_COMPRESS_BYTES`] and whenever compression would not make the state smaller
//!   (already compressed or random data).
//! * [`ZSTD`] (`1`): one Zstandard frame (RFC 8878) that declares its content size.
//!
//! # Level
//!
//! zstd level 1. Measured in release mode on this project's 2-core machine, for a state made
//! of 200 distinct random 4 KiB lowercase hex strings with small JSON separators
//! (821,490 bytes; best of 30 runs; output sizes include the tag byte; re-run with the
//! ignored test `level_timings`):
//!
//! | level | output bytes        | base64url chars | compress | decompress |
//! |------:|--------------------:|----------------:|---------:|-----------:|
//! |    -1 | 821,491 (stored)    |       1,095,322 | 0.20 ms  | 0.03 ms    |
//! |     1 | 417,983             |         557,311 | 0.87 ms  | 0.46 ms    |
//! |     2 | 418,021             |         557,362 | 0.92 ms  | 0.47 ms    |
//! |     3 | 426,552             |         568,736 | 5.4 ms   | 0.92 ms    |
//! |     5 | 434,170             |         578,894 | 10.9 ms  | 1.06 ms    |
//!
//! Negative levels turn off the entropy coding of literals, so random hex (4 bits of
//! information per byte) does not shrink at all and the token would be 1.1 MB; from level 1
//! on, literals are Huffman-coded down to about 4 bits each. Level 1 is the fastest level
//! that keeps such a signed token under 600 KB, and higher levels only spend more time
//! hunting for matches that random data does not have.
//!
//! # Decompression limits
//!
//! [`decompress`] never produces more than its `max_output` bytes and never allocates more
//! than that: the frame must declare its content size, a declared size above `max_output` is
//! refused before any allocation, and the decoder writes into a buffer of exactly the
//! declared size, failing if the data would overflow it.

use std::fmt;

use zstd::zstd_safe;

use super::error::{TokenError, TokenRejection};

/// Tag of a state stored as is.
pub const STORED: u8 = 0;

/// Tag of a state compressed into one zstd frame.
pub const ZSTD: u8 = 1;

/// States shorter than this are stored without trying to compress them: a zstd frame has
/// about a dozen bytes of overhead, and tiny states are not worth the time.
pub const MIN_COMPRESS_BYTES: usize = 64;

/// The zstd level used by [`compress`]; see the [module documentation](self).
pub const ZSTD_LEVEL: i32 = 1;

/// The most bytes one byte of zstd frame can decode to: a block decodes to at most
/// 128 KiB and takes at least 4 bytes (an RLE block: 3-byte header and the byte to repeat),
/// and every frame also has a header. A declared content size above
/// `frame length × MAX_EXPANSION` is a lie.
const MAX_EXPANSION: u64 = 128 * 1024 / 4;

/// Why [`decompress`] refused its input.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum DecompressError {
    /// The state would be larger than the allowed maximum.
    TooLarge,
    /// The tag byte is unknown (a newer format).
    UnknownFormat,
    /// The input is empty, or the compressed data is corrupt or does not declare its size.
    Corrupt,
}

impl fmt::Display for DecompressError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            DecompressError::TooLarge => "continuation state is larger than the maximum size",
            DecompressError::UnknownFormat => "continuation state uses an unknown compression format",
            DecompressError::Corrupt => "continuation state is corrupt",
        })
    }
}

impl std::error::Error for DecompressError {}

impl From<DecompressError> for TokenRejection {
    /// [`TooLarge`](TokenRejection::TooLarge), [`UnsupportedFormat`](TokenRejection::UnsupportedFormat)
    /// and [`Malformed`](TokenRejection::Malformed) respectively.
    fn from(err: DecompressError) -> Self {
        match err {
            DecompressError::TooLarge => TokenRejection::TooLarge,
            DecompressError::UnknownFormat => TokenRejection::UnsupportedFormat,
            DecompressError::Corrupt => TokenRejection::Malformed,
        }
    }
}

impl From<DecompressError> for TokenError {
    fn from(err: DecompressError) -> Self {
        TokenError::new(err.into())
    }
}

/// Compresses `state`: a tag byte, then the state either zstd-compressed or stored as is,
/// whichever is smaller (stored without trying below [`MIN_COMPRESS_BYTES`]).
#[must_use]
pub fn compress(state: &[u8]) -> Vec<u8> {
    compress_with_level(state, ZSTD_LEVEL)
}

/// [`compress`] at zstd level `level`.
fn compress_with_level(state: &[u8], level: i32) -> Vec<u8> {
    if state.len() >= MIN_COMPRESS_BYTES {
        let mut out = std::io::Cursor::new(Vec::with_capacity(1 + zstd_safe::compress_bound(state.len())));
        out.get_mut().push(ZSTD);
        out.set_position(1);
        // Fails only if the output buffer is too small, which `compress_bound` rules out;
        // storing is the safe fallback anyway.
        if zstd_safe::compress(&mut out, state, level).is_ok_and(|len| len < state.len()) {
            return out.into_inner();
        }
    }
    let mut out = Vec::with_capacity(1 + state.len());
    out.push(STORED);
    out.extend_from_slice(state);
    out
}

/// Undoes [`compress`], refusing to produce more than `max_output` bytes.
///
/// Never panics, whatever `bytes` holds, and never allocates more than `max_output` bytes
/// (plus the decoder's fixed-size context).
///
/// # Errors
///
/// [`DecompressError::TooLarge`] if the state would exceed `max_output` bytes,
/// [`DecompressError::UnknownFormat`] for an unknown tag byte, [`DecompressError::Corrupt`]
/// for anything else that is not the output of [`compress`].
pub fn decompress(bytes: &[u8], max_output: usize) -> Result<Vec<u8>, DecompressError> {
    let (&tag, payload) = bytes.split_first().ok_or(DecompressError::Corrupt)?;
    match tag {
        STORED if payload.len() > max_output => Err(DecompressError::TooLarge),
        STORED => Ok(payload.to_vec()),
        ZSTD => decompress_zstd(payload, max_output),
        _ => Err(DecompressError::UnknownFormat),
    }
}

/// Decodes `frame` into a buffer of exactly its declared content size.
fn decompress_zstd(frame: &[u8], max_output: usize) -> Result<Vec<u8>, DecompressError> {
    let declared = match zstd_safe::get_frame_content_size(frame) {
        Ok(Some(size)) => size,
        Ok(None) | Err(_) => return Err(DecompressError::Corrupt),
    };
    if declared > u64::try_from(max_output).unwrap_or(u64::MAX) {
        return Err(DecompressError::TooLarge);
    }
    let frame_len = u64::try_from(frame.len()).unwrap_or(u64::MAX);
    if declared > frame_len.saturating_mul(MAX_EXPANSION) {
        return Err(DecompressError::Corrupt);
    }
    let declared = usize::try_from(declared).map_err(|_| DecompressError::Corrupt)?;
    let mut out = Vec::new();
    out.try_reserve_exact(declared).map_err(|_| DecompressError::TooLarge)?;
    // Single-pass decoding straight into `out`: no window buffer, and an error (not a
    // reallocation) if the frame decodes to more than its capacity.
    match zstd_safe::decompress(&mut out, frame) {
        Ok(len) if len == declared && out.len() == declared => Ok(out),
        Ok(_) | Err(_) => Err(DecompressError::Corrupt),
    }
}

#[cfg(test)]
mod tests;
