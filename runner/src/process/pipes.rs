//! The parent's ends of the pipes to one worker process.
//!
//! The run that uses a worker reads and writes its pipes itself, with no task in between: a
//! read or write is tried at once, and only when the pipe is not ready does the run wait for it
//! on the runtime. While a core is free the run may poll for a moment first (see
//! [`Spin`](super::spin::Spin)). A frame's length is checked against the
//! run's limit before anything is kept for it, so a worker cannot make this side hold more.

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

/// The capacity asked for the pipe to a worker.
const PIPE_BYTES: libc::c_int = 1024 * 1024;

/// The pipes to and from one worker, and what was read of a frame not complete yet.
pub(super) struct Pipes {
    to_worker: AsyncFd<File>,
    from_worker: AsyncFd<File>,
    /// Bytes read and not yet taken as a frame.
    pending: Vec<u8>,
    chunk: Box<[u8]>,
}

impl Pipes {
    pub(super) fn new(stdin: ChildStdin, stdout: ChildStdout) -> io::Result<Pipes> {
        let open = |fd: OwnedFd, interest: Interest| -> io::Result<AsyncFd<File>> {
            set_nonblocking(&fd)?;
            // SAFETY: the file owns its descriptor, and the `AsyncFd` owns the file: the
            // descriptor stays open, and the file's `as_raw_fd` answers it, as long as both live.
            unsafe { AsyncFd::register_with_interest(File::from(fd), interest) }.map_err(|e| e.into_parts().1)
        };
        let stdin = stdin.into_owned_fd()?;
        // A resume's frame holds its whole ledger: room for most in one write, where the kernel
        // allows it (it may refuse past a per-user total; the default then stays).
        // SAFETY: fcntl on a descriptor this side owns, changing only its pipe's capacity.
        unsafe { libc::fcntl(stdin.as_raw_fd(), libc::F_SETPIPE_SZ, PIPE_BYTES) };
        Ok(Pipes {
            to_worker: open(stdin, Interest::WRITABLE)?,
            from_worker: open(stdout.into_owned_fd()?, Interest::READABLE)?,
            pending: Vec::new(),
            chunk: vec![0; CHUNK].into_boxed_slice(),
        })
    }

    /// Writes all of `parts`, in one system call when the pipe has room for them (a reader
    /// woken by a first part would otherwise sleep again before the next), waiting for room as
    /// needed; with `spin`, it polls for room for up to [`SPIN`] at a time before it waits. Not
    /// cancel-safe: a write cut short leaves a partial frame, after which the worker is never used
    /// again.
    pub(super) async fn write_all(&self, parts: &[&[u8]], spin: bool) -> io::Result<()> {
        let mut slices: Vec<IoSlice<'_>> = parts.iter().map(|part| IoSlice::new(part)).collect();
        let mut rest = &mut slices[..];
        IoSlice::advance_slices(&mut rest, 0);
        let mut polling = Spin::new(spin, SPIN);
        while !rest.is_empty() {
            match self.to_worker.get_ref().write_vectored(rest) {
                Ok(0) => return Err(io::ErrorKind::WriteZero.into()),
                Ok(n) => {
                    IoSlice::advance_slices(&mut rest, n);
                    polling.restart();
                }
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => {
                    if !polling.again() {
                        self.to_worker.writable().await?.clear_ready();
                    }
                }
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(e) => return Err(e),
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

    /// The next frame, of at most `limit` bytes; `Ok(None)` when the worker closed its end
    /// between frames. With `spin`, it polls for a moment (see [`Spin`]) before it waits. Cancel-safe: what was read stays here for the next call.
    pub(super) async fn frame(&mut self, limit: usize, spin: bool) -> Result<Option<ToParent>, String> {
        let mut polling = Spin::new(spin, SPIN);
        loop {
            if let Some(frame) = self.take_frame(limit)? {
                return Ok(Some(frame));
            }
            match self.from_worker.get_ref().read(&mut self.chunk) {
                Ok(0) if self.pending.is_empty() => return Ok(None),
                Ok(0) => return Err("the worker closed its pipe in the middle of a frame".into()),
                Ok(n) => self.pending.extend_from_slice(&self.chunk[..n]),
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => {
                    if !polling.again() {
                        let ready = self.from_worker.readable().await;
                        ready.map_err(|e| format!("cannot read from the worker: {e}"))?.clear_ready();
                    }
                }
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(e) => return Err(format!("cannot read from the worker: {e}")),
            }
        }
    }

    /// A whole frame from what was read, if there is one. The length a worker announces is
    /// checked before anything more is read for it.
    fn take_frame(&mut self, limit: usize) -> Result<Option<ToParent>, String> {
        let Some(header) = self.pending.first_chunk::<4>() else { return Ok(None) };
        let length = u32::from_le_bytes(*header) as usize;
        if length > limit {
            return Err(format!("the worker announced a frame of {length} bytes, over the run's limit of {limit}"));
        }
        let Some(body) = self.pending.get(4..4 + length) else { return Ok(None) };
        let frame = serde_json::from_slice(body).map_err(|e| format!("an unreadable frame: {e}"));
        self.pending.drain(..4 + length);
        frame.map(Some)
    }

    /// Whether the worker has sent nothing since its last frame and is still there (an idle
    /// worker sends nothing; one that did, or died, is not trusted with a run).
    pub(super) fn quiet(&self) -> bool {
        let mut poll = libc::pollfd { fd: self.from_worker.get_ref().as_raw_fd(), events: libc::POLLIN, revents: 0 };
        // SAFETY: one valid pollfd, and no waiting.
        self.pending.is_empty() && unsafe { libc::poll(&mut poll, 1, 0) } == 0
    }
}

fn set_nonblocking(fd: &OwnedFd) -> io::Result<()> {
    let fd = fd.as_raw_fd();
    // SAFETY: fcntl on a descriptor this side owns, changing only its status flags.
    let flags = unsafe { libc::fcntl(fd, libc::F_GETFL) };
    // SAFETY: as above.
    if flags < 0 || unsafe { libc::fcntl(fd, libc::F_SETFL, flags | libc::O_NONBLOCK) } < 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}
