//! Length-prefixed frames: a 4-byte little-endian length, then JSON.

use serde::Serialize;
use serde::de::DeserializeOwned;
use std::io::{self, Read, Write};

/// Largest frame either side accepts.
pub(crate) const MAX_FRAME_BYTES: usize = 512 * 1024 * 1024;

/// Writes one frame.
pub(crate) fn write_frame<W: Write, T: Serialize>(out: &mut W, message: &T) -> io::Result<()> {
    let body = serde_json::to_vec(message).map_err(io::Error::other)?;
    if body.len() > MAX_FRAME_BYTES {
        return Err(io::Error::other("frame too large"));
    }
    out.write_all(&(body.len() as u32).to_le_bytes())?;
    out.write_all(&body)?;
    out.flush()
}

/// Reads one frame; `Ok(None)` at a clean end of stream.
pub(crate) fn read_frame<R: Read, T: DeserializeOwned>(input: &mut R) -> io::Result<Option<T>> {
    let mut length = [0u8; 4];
    match input.read_exact(&mut length) {
        Ok(()) => {}
        Err(e) if e.kind() == io::ErrorKind::UnexpectedEof => return Ok(None),
        Err(e) => return Err(e),
    }
    let length = u32::from_le_bytes(length) as usize;
    if length > MAX_FRAME_BYTES {
        return Err(io::Error::other("frame too large"));
    }
    let mut body = vec![0u8; length];
    input.read_exact(&mut body)?;
    serde_json::from_slice(&body).map(Some).map_err(io::Error::other)
}

/// Encodes one frame for an async writer.
pub(crate) fn encode_frame<T: Serialize>(message: &T) -> io::Result<Vec<u8>> {
    let mut out = vec![0; 4];
    serde_json::to_writer(&mut out, message).map_err(io::Error::other)?;
    let length = out.len() - 4;
    if length > MAX_FRAME_BYTES {
        return Err(io::Error::other("frame too large"));
    }
    out[..4].copy_from_slice(&(length as u32).to_le_bytes());
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn frames_round_trip_and_end_cleanly() {
        let mut buffer = Vec::new();
        write_frame(&mut buffer, &vec![1, 2, 3]).unwrap();
        buffer.extend(encode_frame(&"x").unwrap());
        let mut input = buffer.as_slice();
        assert_eq!(read_frame::<_, Vec<u8>>(&mut input).unwrap(), Some(vec![1, 2, 3]));
        assert_eq!(read_frame::<_, String>(&mut input).unwrap(), Some("x".to_string()));
        assert_eq!(read_frame::<_, String>(&mut input).unwrap(), None);
        let mut huge = (u32::MAX).to_le_bytes().as_slice().to_vec();
        assert!(read_frame::<_, String>(&mut huge.as_slice()).is_err());
        huge.clear();
    }
}
