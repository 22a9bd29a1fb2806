//! Captured console output, bounded by the console limit.

use crate::outcome::{ConsoleLevel, ConsoleLine};

/// Lines written so far and the bytes they use.
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

    /// Appends a line, or the truncation marker once the limit is reached.
    pub(crate) fn push(&mut self, level: ConsoleLevel, text: String) {
        if self.truncated {
            return;
        }
        if self.bytes + text.len() > self.limit {
            self.truncated = true;
            self.lines.push(ConsoleLine {
                level: ConsoleLevel::Truncated,
                text: format!("console output truncated at {} bytes", self.limit),
            });
            return;
        }
        self.bytes += text.len();
        self.lines.push(ConsoleLine { level, text });
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
}
