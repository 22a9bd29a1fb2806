//! Unsigned LEB128 integers: the lengths and counts of the runner's binary formats (the
//! continuation state and its compressed form). Seven bits a byte, low bits first, the high
//! bit set on every byte but the last; only the shortest form of a number is read.

/// Why bytes do not start with an integer.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Leb128Error {
    /// The bytes end inside the integer.
    Truncated,
    /// The integer does not fit in 64 bits.
    Overflow,
    /// A longer form of a number than its shortest.
    NonCanonical,
}

/// Appends `value` in its shortest form.
pub(crate) fn push(mut value: u64, out: &mut Vec<u8>) {
    while value >= 0x80 {
        out.push(value as u8 | 0x80);
        value >>= 7;
    }
    out.push(value as u8);
}

/// Reads the integer at the start of `bytes` and moves `bytes` past it.
///
/// # Errors
///
/// A [`Leb128Error`]; `bytes` is then left anywhere.
pub(crate) fn read(bytes: &mut &[u8]) -> Result<u64, Leb128Error> {
    let mut value = 0u64;
    for shift in (0..64).step_by(7) {
        let (&byte, rest) = bytes.split_first().ok_or(Leb128Error::Truncated)?;
        *bytes = rest;
        let bits = u64::from(byte & 0x7F);
        if shift == 63 && bits > 1 {
            return Err(Leb128Error::Overflow);
        }
        value |= bits << shift;
        if byte & 0x80 == 0 {
            // A last byte of 0 after others would make a longer form of the same number.
            return if byte == 0 && shift > 0 { Err(Leb128Error::NonCanonical) } else { Ok(value) };
        }
    }
    Err(Leb128Error::Overflow)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn integers_have_one_form() {
        for (bytes, expected) in [
            (&[0u8][..], Some(0)),
            (&[0x7F], Some(127)),
            (&[0x80, 0x01], Some(128)),
            (&[0x80, 0x00], None),
            (&[0x80], None),
            (&[0xFF, 0xFF, 0xFF, 0xFF, 0xFF, 0xFF, 0xFF, 0xFF, 0xFF, 0x01], Some(u64::MAX)),
            (&[0xFF, 0xFF, 0xFF, 0xFF, 0xFF, 0xFF, 0xFF, 0xFF, 0xFF, 0x02], None),
            (&[0xFF, 0xFF, 0xFF, 0xFF, 0xFF, 0xFF, 0xFF, 0xFF, 0xFF, 0x81, 0x00], None),
        ] {
            let mut rest = bytes;
            assert_eq!(read(&mut rest).ok(), expected, "{bytes:?}");
            if let Some(value) = expected {
                let mut written = Vec::new();
                push(value, &mut written);
                assert_eq!(written, bytes);
            }
        }
    }
}
