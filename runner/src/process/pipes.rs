//! The parent's ends of the pipes to one worker process.
//!
//! The run that uses a worker reads and writes its pipes itself, with no task in between: a
//! read or write is tried at once, and only when the pipe is not ready does the run wait for it
//! on the runtime. While a core is free the run may poll for a moment first (see
//! [`Spin`](super::spin::Spin)). A frame's length is checked against the run's limit before
//! anything is kept for it, and while this side waits to write it keeps reading what the worker
//! sends (up to a cap), so neither side can hold the other by filling a pipe.

use super::protocol::ToParent;
use super::spin::{SPIN, Spin};
use std::fs::File;
use std::io::{self, IoSlice, Read, Write};
use std::os::fd::{AsRawFd, OwnedFd};
use tokio::io::Interest;
use tokio::io::unix::AsyncFd;
use tokio::process::{ChildStdin, ChildStdout};

/// Bytes read from a worker at a time.
const CHUNK: usize = 64 * 1024;

/// The capacity asked for each pipe: room for most ledgers and answers in one write, where the
/// kernel allows it (it may refuse past a per-user total; the default then stays).
const PIPE_BYTES: libc::c_int = 1024 * 1024;

/// The pipes to and from one worker, and what was read of frames not taken yet.
pub(super) struct Pipes {
    to_worker: AsyncFd<File>,
    from_worker: AsyncFd<File>,
    /// Bytes read; those before `start` were taken as frames already.
    pending: Vec<u8>,
    start: usize,
    chunk: Box<[u8]>,
}

/// Why a worker's pipes could not be used: it closed them, or broke the protocol.
#[derive(Debug)]
pub(super) struct PipeError(String);

impl std::fmt::Display for PipeError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for PipeError {}

impl Pipes {
    /// The parent's ends of a new worker's stdin and stdout, made non-blocking and enlarged.
    pub(super) fn new(stdin: ChildStdin, stdout: ChildStdout) -> io::Result<Pipes> {
        let open = |fd: OwnedFd, interest: Interest| -> io::Result<AsyncFd<File>> {
            set_nonblocking(&fd)?;
            // SAFETY: fcntl on a descriptor this side owns, changing only its pipe's capacity
            // (a refusal leaves the pipe as it was).
            unsafe { libc::fcntl(fd.as_raw_fd(), libc::F_SETPIPE_SZ, PIPE_BYTES) };
            // SAFETY: the file owns its descriptor, and the `AsyncFd` owns the file: the
            // descriptor stays open, and the file's `as_raw_fd` answers it, as long as both live.
            unsafe { AsyncFd::register_with_interest(File::from(fd), interest) }.map_err(|e| e.into_parts().1)
        };
        Ok(Pipes {
            to_worker: open(stdin.into_owned_fd()?, Interest::WRITABLE)?,
            from_worker: open(stdout.into_owned_fd()?, Interest::READABLE)?,
            pending: Vec::new(),
            start: 0,
            chunk: vec![0; CHUNK].into_boxed_slice(),
        })
    }

    /// Writes all of `parts`, in one system call when the pipe has room for them (a reader
    /// woken by a first part would otherwise sleep again before the next). While there is no
    /// room it reads what the worker sends, up to `read_cap` bytes not taken as frames yet, so a
    /// worker blocked on its own writes can go on to read. With `spin`, it polls for room for a
    /// moment (see [`Spin`]) before it waits. Not cancel-safe: a write cut short leaves a
    /// partial frame, after which the worker is never used again.
    pub(super) async fn write_all(&mut self, parts: &[&[u8]], spin: bool, read_cap: usize) -> Result<(), PipeError> {
        let mut slices: Vec<IoSlice<'_>> = parts.iter().map(|part| IoSlice::new(part)).collect();
        let mut rest = &mut slices[..];
        IoSlice::advance_slices(&mut rest, 0);
        let mut polling = Spin::new(spin, SPIN);
        while !rest.is_empty() {
            match self.to_worker.get_ref().write_vectored(rest) {
                Ok(0) => return Err(PipeError("the worker's pipe is closed".into())),
                Ok(n) => IoSlice::advance_slices(&mut rest, n),
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => {
                    if polling.again() {
                        continue;
                    }
                    tokio::select! {
                        writable = self.to_worker.writable() => {
                            writable.map_err(|e| PipeError(format!("cannot write to the worker: {e}")))?.clear_ready();
                        }
                        readable = self.from_worker.readable() => {
                            readable.map_err(|e| PipeError(format!("cannot read from the worker: {e}")))?.clear_ready();
                            if self.read_now()? == Some(0) {
                                return Err(PipeError("the worker closed its pipe".into()));
                            }
                            if self.pending.len() - self.start > read_cap {
                                return Err(PipeError(format!("the worker sent more than {read_cap} bytes without reading")));
                            }
                        }
                    }
                }
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(e) => return Err(PipeError(format!("cannot write to the worker: {e}"))),
            }
        }
        Ok(())
    }

    /// Writes what of `bytes` the pipe has room for now, without waiting.
    pub(super) fn try_write(&self, bytes: &[u8]) -> io::Result<usize> {
        match self.to_worker.get_ref().write(bytes) {
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => Ok(0),
            result => result,
        }
    }

    /// Reads what the worker sent, if anything: `Some(0)` at the end of the pipe, `None` when
    /// nothing is there now.
    fn read_now(&mut self) -> Result<Option<usize>, PipeError> {
        loop {
            match self.from_worker.get_ref().read(&mut self.chunk) {
                Ok(n) => {
                    self.pending.extend_from_slice(&self.chunk[..n]);
                    return Ok(Some(n));
                }
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => return Ok(None),
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(e) => return Err(PipeError(format!("cannot read from the worker: {e}"))),
            }
        }
    }

    /// The next frame, of at most `limit` bytes; `Ok(None)` when the worker closed its end
    /// between frames. With `spin`, it polls for a moment (see [`Spin`]) before it waits.
    /// Cancel-safe: what was read stays here for the next call.
    pub(super) async fn frame(&mut self, limit: usize, spin: bool) -> Result<Option<ToParent>, PipeError> {
        let mut polling = Spin::new(spin, SPIN);
        loop {
            if let Some(frame) = self.take_frame(limit)? {
                return Ok(Some(frame));
            }
            match self.read_now()? {
                Some(0) if self.start == self.pending.len() => return Ok(None),
                Some(0) => return Err(PipeError("the worker closed its pipe in the middle of a frame".into())),
                Some(_) => {}
                None if polling.again() => {}
                None => {
                    let ready = self.from_worker.readable().await;
                    ready.map_err(|e| PipeError(format!("cannot read from the worker: {e}")))?.clear_ready();
                }
            }
        }
    }

    /// A whole frame from what was read, if there is one. The length a worker announces is
    /// checked before anything more is read for it.
    fn take_frame(&mut self, limit: usize) -> Result<Option<ToParent>, PipeError> {
        let unread = &self.pending[self.start..];
        let Some(header) = unread.first_chunk::<4>() else {
            self.compact();
            return Ok(None);
        };
        let length = u32::from_le_bytes(*header) as usize;
        if length > limit {
            return Err(PipeError(format!(
                "the worker announced a frame of {length} bytes, over the run's limit of {limit}"
            )));
        }
        let Some(body) = unread.get(4..4 + length) else {
            self.compact();
            return Ok(None);
        };
        let frame = serde_json::from_slice(body).map_err(|e| PipeError(format!("an unreadable frame: {e}")));
        self.start += 4 + length;
        frame.map(Some)
    }

    /// Drops the bytes taken as frames, once per read rather than once per frame.
    fn compact(&mut self) {
        self.pending.drain(..self.start);
        self.start = 0;
    }

    /// Whether the worker has sent nothing since its last frame and is still there (an idle
    /// worker sends nothing; one that did, or died, is not trusted with a run). Lets go of the
    /// memory a large frame left behind.
    pub(super) fn quiet(&mut self) -> bool {
        self.compact();
        self.pending.shrink_to(CHUNK);
        let mut poll = libc::pollfd { fd: self.from_worker.get_ref().as_raw_fd(), events: libc::POLLIN, revents: 0 };
        // SAFETY: one valid pollfd, and no waiting.
        self.pending.is_empty() && unsafe { libc::poll(&mut poll, 1, 0) } == 0
    }
}

/// Makes `fd` non-blocking.
fn set_nonblocking(fd: &OwnedFd) -> io::Result<()> {
    let fd = fd.as_raw_fd();
    // SAFETY: fcntl on a descriptor this side owns, reading only its status flags.
    let flags = unsafe { libc::fcntl(fd, libc::F_GETFL) };
    // SAFETY: as above, changing only its status flags.
    if flags < 0 || unsafe { libc::fcntl(fd, libc::F_SETFL, flags | libc::O_NONBLOCK) } < 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}
