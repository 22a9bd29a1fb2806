//! Cutting text at a byte budget without splitting a character.

/// The longest prefix of `text` within `max` bytes.
pub(crate) fn clip(text: &str, max: usize) -> &str {
    let mut end = text.len().min(max);
    while !text.is_char_boundary(end) {
        end -= 1;
    }
    &text[..end]
}

/// `text` cut to `max` bytes, with `…` appended when anything was cut.
pub(crate) fn truncate(mut text: String, max: usize) -> String {
    if text.len() > max {
        let end = clip(&text, max).len();
        text.truncate(end);
        text.push('…');
    }
    text
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn never_splits_a_character() {
        assert_eq!(clip("héllo", 2), "h");
        assert_eq!(clip("abc", 10), "abc");
        assert_eq!(truncate("héllo".into(), 3), "hé…");
        assert_eq!(truncate("abc".into(), 3), "abc");
    }
}
