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
//! * [`ZSTD`] (`1`): one Zstandard frame (RFC 8878) that declares its content size. Used for
//!   states of at most [`FRAME_INPUT_BYTES`].
//! * [`ZSTD_FRAMES`] (`2`): the state cut into pieces of [`FRAME_INPUT_BYTES`] (the last one
//!   shorter), each compressed into its own frame that declares its content size, the frames
//!   one after the other. A reader can use the start of a large state while the rest is still
//!   being decompressed ([`FrameDecoder`]); for random data the frames cost about
//!   0.1% of the output, for repetitive data a few bytes each.
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
use std::ops::Range;

use zstd::zstd_safe;

use super::error::{TokenError, TokenRejection};

/// Tag of a state stored as is.
pub const STORED: u8 = 0;

/// Tag of a state compressed into one zstd frame.
pub const ZSTD: u8 = 1;

/// Tag of a state compressed into consecutive zstd frames, one per [`FRAME_INPUT_BYTES`].
pub const ZSTD_FRAMES: u8 = 2;

/// How many bytes of state each frame of a [`ZSTD_FRAMES`] state holds (the last may hold
/// fewer); about 40 µs of decompression.
pub const FRAME_INPUT_BYTES: usize = 64 * 1024;

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
        let pieces = state.chunks(FRAME_INPUT_BYTES);
        let bound = pieces.len().saturating_mul(zstd_safe::compress_bound(FRAME_INPUT_BYTES.min(state.len())));
        let mut out = std::io::Cursor::new(Vec::with_capacity(1 + bound));
        out.get_mut().push(if pieces.len() > 1 { ZSTD_FRAMES } else { ZSTD });
        let mut context = zstd_safe::CCtx::create();
        // Fails only if the output buffer is too small, which `compress_bound` rules out;
        // storing is the safe fallback anyway.
        let compressed = pieces.into_iter().all(|piece| {
            out.set_position(out.get_ref().len() as u64);
            context.compress(&mut out, piece, level).is_ok()
        });
        if compressed && out.get_ref().len() <= state.len() {
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
    let mut decoder = FrameDecoder::new(bytes, max_output)?;
    while decoder.next_frame(bytes)?.is_some() {}
    Ok(decoder.into_output())
}

/// Undoes [`compress`] one frame at a time, for a reader that uses the start of a state while
/// the rest is still compressed (a state that is not in frames is one frame). Every frame's
/// declared size, and their sum against the limit, are checked before anything is decoded.
pub struct FrameDecoder {
    /// Where each frame lies in the input, with its declared size; one "frame" of the whole
    /// payload for a stored state.
    frames: Vec<(Range<usize>, u64)>,
    /// Frames decoded so far.
    decoded: usize,
    stored: bool,
    total: usize,
    out: std::io::Cursor<Vec<u8>>,
    context: Option<zstd_safe::DCtx<'static>>,
}

impl FrameDecoder {
    /// A decoder of `bytes` (the output of [`compress`]) that never produces more than
    /// `max_output` bytes. The same `bytes` must be passed to each
    /// [`next_frame`](Self::next_frame).
    ///
    /// # Errors
    ///
    /// As for [`decompress`], for everything that can be told before decoding.
    pub fn new(bytes: &[u8], max_output: usize) -> Result<Self, DecompressError> {
        let &tag = bytes.first().ok_or(DecompressError::Corrupt)?;
        let payload = 1..bytes.len();
        let frames = match tag {
            STORED => vec![(payload.clone(), payload.len() as u64)],
            ZSTD => vec![declared_frame(bytes, payload)?],
            ZSTD_FRAMES => split_frames(bytes)?,
            _ => return Err(DecompressError::UnknownFormat),
        };
        let total =
            frames.iter().try_fold(0u64, |sum, &(_, size)| sum.checked_add(size)).ok_or(DecompressError::TooLarge)?;
        if total > u64::try_from(max_output).unwrap_or(u64::MAX) {
            return Err(DecompressError::TooLarge);
        }
        let stored = tag == STORED;
        // A frame that declares more than its bytes can decode to is a lie.
        let lies = |(frame, size): &(Range<usize>, u64)| {
            *size > u64::try_from(frame.len()).unwrap_or(u64::MAX).saturating_mul(MAX_EXPANSION)
        };
        if !stored && frames.iter().any(lies) {
            return Err(DecompressError::Corrupt);
        }
        let total = usize::try_from(total).map_err(|_| DecompressError::TooLarge)?;
        let mut out = std::io::Cursor::new(Vec::new());
        out.get_mut().try_reserve_exact(total).map_err(|_| DecompressError::TooLarge)?;
        Ok(FrameDecoder { frames, decoded: 0, stored, total, out, context: None })
    }

    /// The length of the whole state.
    #[must_use]
    pub fn total(&self) -> usize {
        self.total
    }

    /// Decodes the next frame of `bytes` and returns all the state decoded so far; `None` once
    /// every frame is decoded.
    ///
    /// # Errors
    ///
    /// [`DecompressError::Corrupt`] if the frame does not decode to the size it declared.
    pub fn next_frame(&mut self, bytes: &[u8]) -> Result<Option<&[u8]>, DecompressError> {
        let Some((range, size)) = self.frames.get(self.decoded).cloned() else { return Ok(None) };
        let frame = bytes.get(range).ok_or(DecompressError::Corrupt)?;
        self.decoded += 1;
        if self.stored {
            self.out.get_mut().extend_from_slice(frame);
            return Ok(Some(self.out.get_ref()));
        }
        let start = self.out.get_ref().len();
        self.out.set_position(start as u64);
        let context = self.context.get_or_insert_with(zstd_safe::DCtx::create);
        // Single-pass decoding straight into `out`: no window buffer, and an error (not a
        // reallocation) if the frame decodes to more than it declared.
        match context.decompress(&mut self.out, frame) {
            Ok(len) if len as u64 == size && self.out.get_ref().len() == start + len => Ok(Some(self.out.get_ref())),
            Ok(_) | Err(_) => Err(DecompressError::Corrupt),
        }
    }

    /// The state decoded so far.
    #[must_use]
    pub fn into_output(self) -> Vec<u8> {
        self.out.into_inner()
    }
}

impl fmt::Debug for FrameDecoder {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("FrameDecoder")
            .field("frames", &self.frames.len())
            .field("decoded", &self.decoded)
            .field("total", &self.total)
            .finish_non_exhaustive()
    }
}

/// The zstd frame at `frame` in `bytes`, with the content size it declares.
fn declared_frame(bytes: &[u8], frame: Range<usize>) -> Result<(Range<usize>, u64), DecompressError> {
    match zstd_safe::get_frame_content_size(&bytes[frame.clone()]) {
        Ok(Some(size)) => Ok((frame, size)),
        Ok(None) | Err(_) => Err(DecompressError::Corrupt),
    }
}

/// The consecutive frames (at least two) after the tag byte of a [`ZSTD_FRAMES`] state, with
/// their sizes.
fn split_frames(bytes: &[u8]) -> Result<Vec<(Range<usize>, u64)>, DecompressError> {
    let mut frames = Vec::new();
    let mut start = 1;
    while start < bytes.len() {
        let len = zstd_safe::find_frame_compressed_size(&bytes[start..]).map_err(|_| DecompressError::Corrupt)?;
        let end =
            start.checked_add(len).filter(|&end| end > start && end <= bytes.len()).ok_or(DecompressError::Corrupt)?;
        frames.push(declared_frame(bytes, start..end)?);
        start = end;
    }
    if frames.len() < 2 {
        return Err(DecompressError::Corrupt);
    }
    Ok(frames)
}

#[cfg(test)]
mod tests;
