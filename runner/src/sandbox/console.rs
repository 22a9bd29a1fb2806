//! Captured console output, bounded by the console limit.

use crate::outcome::{ConsoleLevel, ConsoleLine};

/// Lines written so far and the bytes they use. Each line counts its text
/// and one byte for its line break, so empty lines are bounded too.
pub(crate) struct ConsoleBuffer {
    lines: Vec<ConsoleLine>,
    bytes: usize,
    limit: usize,
    truncated: bool,
}

impl ConsoleBuffer {
    pub(crate) fn new(limit: usize) -> Self {
        ConsoleBuffer { lines: Vec::new(), bytes: 0, limit, truncated: false }
    }

    /// Whether more output would be kept.
    pub(crate) fn accepting(&self) -> bool {
        !self.truncated
    }

    /// Appends a line, or the truncation marker once the limit is reached;
    /// returns what was appended.
    pub(crate) fn push(&mut self, level: ConsoleLevel, text: String) -> Option<&ConsoleLine> {
        if self.truncated {
            return None;
        }
        let cost = text.len() + 1;
        let line = if self.bytes + cost > self.limit {
            self.truncated = true;
            ConsoleLine {
                level: ConsoleLevel::Truncated,
                text: format!("console output truncated at {} bytes", self.limit),
            }
        } else {
            self.bytes += cost;
            ConsoleLine { level, text }
        };
        self.lines.push(line);
        self.lines.last()
    }

    pub(crate) fn take(&mut self) -> Vec<ConsoleLine> {
        std::mem::take(&mut self.lines)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn truncates_once_with_a_marker() {
        let mut buffer = ConsoleBuffer::new(10);
        buffer.push(ConsoleLevel::Log, "12345".into());
        buffer.push(ConsoleLevel::Log, "123456".into());
        buffer.push(ConsoleLevel::Log, "1".into());
        let lines = buffer.take();
        assert_eq!(lines.len(), 2);
        assert_eq!(lines[1].level, ConsoleLevel::Truncated);
    }

    #[test]
    fn empty_lines_count_against_the_limit() {
        let mut buffer = ConsoleBuffer::new(100);
        let kept = (0..1000).filter(|_| buffer.push(ConsoleLevel::Log, String::new()).is_some()).count();
        assert_eq!(kept, 101, "100 one-byte lines and the marker");
    }
}
