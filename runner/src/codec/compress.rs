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
//! * [`PACKED_FRAMES`] (`3`): what [`compress`] writes. The state's length, then the
//!   compressed length of each of its frames (unsigned LEB128 integers), then the frames: the
//!   state cut into pieces of [`FRAME_INPUT_BYTES`] (the last one shorter), each hex-packed
//!   (see `hex_runs`: runs of hex digits stored two to a byte) and compressed into its own
//!   zstd frame that declares its content size. A reader can use the start of a large state
//!   while the rest is still being decompressed, or still arriving ([`FrameDecoder`]).
//! * [`ZSTD`] (`1`) and [`ZSTD_FRAMES`] (`2`): one zstd frame, or one per piece, without
//!   hex-packing; written by earlier versions and still read.
//!
//! # Level and packing
//!
//! zstd level 1. Measured in release mode on this project's 2-core machine, for a state made
//! of 200 distinct random 4 KiB lowercase hex strings with small JSON separators
//! (821,490 bytes; best of 30 runs; output sizes include the header; re-run with the
//! ignored test `level_timings`; the first row is from an earlier version, measured in a
//! sitting where the machine ran about 1.3 times faster than for the others):
//!
//! | format                  | output bytes | base64url chars | compress | decompress |
//! |-------------------------|-------------:|----------------:|---------:|-----------:|
//! | zstd level 1, no packing|      417,983 |         557,311 | 0.87 ms  | 0.46 ms    |
//! | packed, zstd level 1    |      412,923 |         550,564 | 0.91 ms  | 0.06 ms    |
//! | packed, zstd level 3    |      412,923 |         550,564 | 1.15 ms  | 0.06 ms    |
//!
//! Without packing, random hex (4 bits of information per byte) only shrinks through zstd's
//! Huffman coding of literals, the slowest stage of its decoder: at negative levels, which
//! skip it, the token would be 1.1 MB. Packed, the hex takes its 4 bits per digit before
//! zstd sees it, and a resume decodes it ten times faster. Higher levels only spend more
//! time hunting for matches that random data does not have.
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
use crate::leb128;

mod hex_runs;

/// Tag of a state stored as is.
pub const STORED: u8 = 0;

/// Tag of a state compressed into one zstd frame.
pub const ZSTD: u8 = 1;

/// Tag of a state compressed into consecutive zstd frames, one per [`FRAME_INPUT_BYTES`].
pub const ZSTD_FRAMES: u8 = 2;

/// Tag of a state whose pieces of [`FRAME_INPUT_BYTES`] are hex-packed, then compressed into
/// one zstd frame each; what [`compress`] writes.
pub const PACKED_FRAMES: u8 = 3;

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
#[non_exhaustive]
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

/// Compresses `state`: a tag byte, then the state either hex-packed and zstd-compressed in
/// frames or stored as is, whichever is smaller (stored without trying below
/// [`MIN_COMPRESS_BYTES`]).
#[must_use]
pub fn compress(state: &[u8]) -> Vec<u8> {
    compress_with_level(state, ZSTD_LEVEL)
}

/// [`compress`] at zstd level `level`.
fn compress_with_level(state: &[u8], level: i32) -> Vec<u8> {
    if state.len() >= MIN_COMPRESS_BYTES {
        let mut frames = std::io::Cursor::new(Vec::with_capacity(state.len() / 2));
        let mut lengths = Vec::new();
        let mut context = zstd_safe::CCtx::create();
        let mut packed = Vec::with_capacity(FRAME_INPUT_BYTES.min(state.len()) * 2);
        // Fails only if the output buffer is too small, which `compress_bound` rules out;
        // storing is the safe fallback anyway.
        let compressed = state.chunks(FRAME_INPUT_BYTES).all(|piece| {
            packed.clear();
            hex_runs::pack(piece, &mut packed);
            frames.get_mut().reserve(zstd_safe::compress_bound(packed.len()));
            frames.set_position(frames.get_ref().len() as u64);
            let written = context.compress(&mut frames, &packed, level);
            written.inspect(|&len| lengths.push(len)).is_ok()
        });
        let frames = frames.into_inner();
        let mut out = Vec::with_capacity(1 + 10 * (1 + lengths.len()) + frames.len());
        out.push(PACKED_FRAMES);
        leb128::push(state.len() as u64, &mut out);
        for &len in &lengths {
            leb128::push(len as u64, &mut out);
        }
        out.extend_from_slice(&frames);
        if compressed && out.len() <= state.len() {
            return out;
        }
    }
    let mut out = Vec::with_capacity(1 + state.len());
    out.push(STORED);
    out.extend_from_slice(state);
    out
}

/// The most bytes the header of a [`PACKED_FRAMES`] state of at most `max_output` bytes can
/// take (tag, length and frame lengths): what [`FrameDecoder::new`] needs of such an input.
#[must_use]
pub fn header_len_bound(max_output: usize) -> usize {
    const LEB128_U64: usize = 10;
    let frames = max_output.div_ceil(FRAME_INPUT_BYTES);
    frames.saturating_add(1).saturating_mul(LEB128_U64).saturating_add(1)
}

/// Undoes [`compress`], refusing to produce more than `max_output` bytes.
///
/// Never panics, whatever `bytes` holds, and never allocates more than `max_output` bytes
/// (plus the decoder's fixed-size context and one packed frame).
///
/// # Errors
///
/// [`DecompressError::TooLarge`] if the state would exceed `max_output` bytes,
/// [`DecompressError::UnknownFormat`] for an unknown tag byte, [`DecompressError::Corrupt`]
/// for anything else that is not the output of [`compress`].
pub fn decompress(bytes: &[u8], max_output: usize) -> Result<Vec<u8>, DecompressError> {
    let mut decoder = FrameDecoder::new(bytes, bytes.len(), max_output)?;
    while decoder.next_frame(bytes)?.is_some() {}
    Ok(decoder.into_output())
}

/// One frame of a compressed state.
#[derive(Debug, Clone)]
struct Frame {
    /// Where it lies in the input.
    range: Range<usize>,
    /// The content size it declares (its whole length for a stored state); `None` for a
    /// hex-packed frame, whose declared size is read when it is decoded.
    declared: Option<u64>,
    /// How many bytes of state it holds: `declared`, unless its content is hex-packed.
    length: u64,
}

/// Undoes [`compress`] one frame at a time, for a reader that uses the start of a state while
/// the rest is still compressed, or even still arriving (a state that is not in frames is one
/// frame). The state's length is checked against the limit before anything is decoded, and
/// so is every frame's declared size, except for hex-packed frames, which each declare at most
/// twice their piece.
pub struct FrameDecoder {
    frames: Vec<Frame>,
    /// Frames decoded so far.
    decoded: usize,
    tag: u8,
    total: usize,
    out: std::io::Cursor<Vec<u8>>,
    context: Option<zstd_safe::DCtx<'static>>,
    /// The decompressed content of the current frame of a [`PACKED_FRAMES`] state.
    packed: std::io::Cursor<Vec<u8>>,
}

impl FrameDecoder {
    /// A decoder of an input of `input_len` bytes (the output of [`compress`]) that never
    /// produces more than `max_output` bytes, given the input's first bytes, `available`. For
    /// a [`PACKED_FRAMES`] input these need only hold its header (the start of its first
    /// frame is enough); other formats need the whole input at once. Each
    /// [`next_frame`](Self::next_frame) is given (a longer start of) the same input.
    ///
    /// # Errors
    ///
    /// As for [`decompress`], for everything that can be told before decoding; `Corrupt` for a
    /// format other than [`PACKED_FRAMES`] given only part of its input.
    pub fn new(available: &[u8], input_len: usize, max_output: usize) -> Result<Self, DecompressError> {
        let &tag = available.first().ok_or(DecompressError::Corrupt)?;
        if tag != PACKED_FRAMES && available.len() != input_len {
            return Err(DecompressError::Corrupt);
        }
        let frames = match tag {
            STORED => {
                let length = available.len() as u64 - 1;
                vec![Frame { range: 1..available.len(), declared: Some(length), length }]
            }
            ZSTD => vec![declared_frame(available, 1..available.len())?],
            ZSTD_FRAMES => {
                split_frames(available, 1).filter(|frames| frames.len() >= 2).ok_or(DecompressError::Corrupt)?
            }
            PACKED_FRAMES => packed_frames(available, input_len, max_output)?,
            _ => return Err(DecompressError::UnknownFormat),
        };
        let total = frames
            .iter()
            .try_fold(0u64, |sum, frame| sum.checked_add(frame.length))
            .ok_or(DecompressError::TooLarge)?;
        if total > u64::try_from(max_output).unwrap_or(u64::MAX) {
            return Err(DecompressError::TooLarge);
        }
        let lies =
            |frame: &Frame| frame.declared.is_some_and(|declared| exceeds_expansion(declared, frame.range.len()));
        if tag != STORED && frames.iter().any(lies) {
            return Err(DecompressError::Corrupt);
        }
        let total = usize::try_from(total).map_err(|_| DecompressError::TooLarge)?;
        let mut out = std::io::Cursor::new(Vec::new());
        out.get_mut().try_reserve_exact(total).map_err(|_| DecompressError::TooLarge)?;
        let packed = std::io::Cursor::new(Vec::new());
        Ok(FrameDecoder { frames, decoded: 0, tag, total, out, context: None, packed })
    }

    /// The length of the whole state.
    #[must_use]
    pub fn total(&self) -> usize {
        self.total
    }

    /// Where the next frame to decode ends in the input; `None` once every frame is decoded.
    #[must_use]
    pub fn next_frame_end(&self) -> Option<usize> {
        self.frames.get(self.decoded).map(|frame| frame.range.end)
    }

    /// Decodes the next frame of the input, of which `bytes` must hold the start up to
    /// [`next_frame_end`](Self::next_frame_end) at least, and returns all the state decoded so
    /// far; `None` once every frame is decoded.
    ///
    /// # Errors
    ///
    /// [`DecompressError::Corrupt`] if the frame does not decode to the size it declared (or
    /// is not all in `bytes`).
    pub fn next_frame(&mut self, bytes: &[u8]) -> Result<Option<&[u8]>, DecompressError> {
        let Some(Frame { range, declared, length }) = self.frames.get(self.decoded).cloned() else { return Ok(None) };
        let frame = bytes.get(range).ok_or(DecompressError::Corrupt)?;
        self.decoded += 1;
        if self.tag == STORED {
            self.out.get_mut().extend_from_slice(frame);
            return Ok(Some(self.out.get_ref()));
        }
        let context = self.context.get_or_insert_with(zstd_safe::DCtx::create);
        if let Some(declared) = declared {
            decompress_frame(context, frame, declared, &mut self.out)?;
            return Ok(Some(self.out.get_ref()));
        }
        // A packed piece is at most twice as long as the piece, and a frame cannot decode to
        // more than its bytes allow.
        let declared = match zstd_safe::get_frame_content_size(frame) {
            Ok(Some(size)) if size <= 2 * length && !exceeds_expansion(size, frame.len()) => size,
            _ => return Err(DecompressError::Corrupt),
        };
        self.packed.get_mut().clear();
        self.packed.get_mut().reserve(declared as usize);
        decompress_frame(context, frame, declared, &mut self.packed)?;
        hex_runs::unpack(self.packed.get_ref(), length as usize, self.out.get_mut())?;
        Ok(Some(self.out.get_ref()))
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

/// Whether a frame of `frame_len` bytes that declares `declared` bytes of content lies: it
/// declares more than its bytes can decode to.
fn exceeds_expansion(declared: u64, frame_len: usize) -> bool {
    declared > u64::try_from(frame_len).unwrap_or(u64::MAX).saturating_mul(MAX_EXPANSION)
}

/// Decompresses one zstd `frame` that declared `declared` bytes, appending them to `out`.
fn decompress_frame(
    context: &mut zstd_safe::DCtx<'static>,
    frame: &[u8],
    declared: u64,
    out: &mut std::io::Cursor<Vec<u8>>,
) -> Result<(), DecompressError> {
    let start = out.get_ref().len();
    out.set_position(start as u64);
    // Single-pass decoding straight into `out`: no window buffer, and an error (not a
    // reallocation) if the frame decodes to more than it declared.
    match context.decompress(out, frame) {
        Ok(len) if len as u64 == declared && out.get_ref().len() == start + len => Ok(()),
        Ok(_) | Err(_) => Err(DecompressError::Corrupt),
    }
}

/// The frames of a [`PACKED_FRAMES`] input of `input_len` bytes, from its header at the start
/// of `bytes`: the state's length, then the compressed length of each frame, one per
/// [`FRAME_INPUT_BYTES`] of state. The frames must fill the rest of the input exactly.
fn packed_frames(bytes: &[u8], input_len: usize, max_output: usize) -> Result<Vec<Frame>, DecompressError> {
    let mut rest = &bytes[1..];
    let total = leb128::read(&mut rest).map_err(|_| DecompressError::Corrupt)?;
    if total > u64::try_from(max_output).unwrap_or(u64::MAX) {
        return Err(DecompressError::TooLarge);
    }
    let piece = FRAME_INPUT_BYTES as u64;
    let count = usize::try_from(total.div_ceil(piece)).map_err(|_| DecompressError::TooLarge)?;
    if count == 0 {
        return Err(DecompressError::Corrupt);
    }
    let mut lengths = Vec::with_capacity(count.min(rest.len()));
    for _ in 0..count {
        let len = leb128::read(&mut rest).ok().and_then(|len| usize::try_from(len).ok());
        lengths.push(len.filter(|&len| len > 0).ok_or(DecompressError::Corrupt)?);
    }
    let mut start = bytes.len() - rest.len();
    let mut frames = Vec::with_capacity(count);
    for (i, len) in lengths.into_iter().enumerate() {
        let end = start.checked_add(len).filter(|&end| end <= input_len).ok_or(DecompressError::Corrupt)?;
        let length = piece.min(total - i as u64 * piece);
        frames.push(Frame { range: start..end, declared: None, length });
        start = end;
    }
    if start != input_len {
        return Err(DecompressError::Corrupt);
    }
    Ok(frames)
}

/// The zstd frame at `frame` in `bytes`, with the content size it declares.
fn declared_frame(bytes: &[u8], frame: Range<usize>) -> Result<Frame, DecompressError> {
    match zstd_safe::get_frame_content_size(&bytes[frame.clone()]) {
        Ok(Some(size)) => Ok(Frame { range: frame, declared: Some(size), length: size }),
        Ok(None) | Err(_) => Err(DecompressError::Corrupt),
    }
}

/// The consecutive frames of `bytes` from `start` on, with their sizes; `None` if they are not
/// all well-formed frames that declare their size.
fn split_frames(bytes: &[u8], mut start: usize) -> Option<Vec<Frame>> {
    let mut frames = Vec::new();
    while start < bytes.len() {
        let len = zstd_safe::find_frame_compressed_size(&bytes[start..]).ok()?;
        let end = start.checked_add(len).filter(|&end| end > start && end <= bytes.len())?;
        frames.push(declared_frame(bytes, start..end).ok()?);
        start = end;
    }
    Some(frames)
}

#[cfg(test)]
mod tests;
