//! The worker's end of the pipe from the parent, read by the one thread that runs the scripts:
//! the next run, the prior ledger that follows it (parsed while it arrives), and the settles of
//! the run in progress; and the signal by which the parent aborts a run.

use super::ABORT_SIGNAL;
use super::frame::{MAX_FRAME_BYTES, read_frame};
use super::protocol::ToChild;
use super::spin::Spin;
use crate::error::{ErrorCode, RunError};
use crate::job::{Inbox, WorkerMessage};
use crate::ledger_feed::{FeedItem, FeedSource};
use crate::state::{Parsed, StateParser};
use std::collections::VecDeque;
use std::fs::File;
use std::io::{BufRead, BufReader};
use std::os::fd::AsRawFd;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc::RecvTimeoutError;
use std::sync::{Arc, Mutex, OnceLock};
use std::time::{Duration, Instant};

/// Set by the handler of the abort signal; cleared when a run starts.
static ABORT: OnceLock<Arc<AtomicBool>> = OnceLock::new();

extern "C" fn on_abort(_signal: libc::c_int) {
    // Only an atomic store: safe in a signal handler.
    if let Some(abort) = ABORT.get() {
        abort.store(true, Ordering::SeqCst);
    }
}

/// Blocks the abort signal on this thread and the threads it starts from now on, so that only
/// the thread that runs the scripts takes it (see [`take_abort_signal`]).
pub(super) fn block_abort_signal() {
    // SAFETY: a signal set built by sigemptyset and sigaddset, applied to this thread's mask.
    unsafe {
        let mut set: libc::sigset_t = std::mem::zeroed();
        libc::sigemptyset(&mut set);
        libc::sigaddset(&mut set, ABORT_SIGNAL);
        libc::pthread_sigmask(libc::SIG_BLOCK, &set, std::ptr::null_mut());
    }
}

/// Handles the abort signal on this thread by setting the flag that the runs share, and
/// answers that flag: the engine stops a run once it is set, whether the script computes or
/// waits.
pub(super) fn take_abort_signal() -> Arc<AtomicBool> {
    let abort = ABORT.get_or_init(|| Arc::new(AtomicBool::new(false))).clone();
    // SAFETY: the handler only stores to an atomic that lives as long as the process (it is in a
    // static); the action and the set are built here, and the mask is this thread's.
    unsafe {
        let mut action: libc::sigaction = std::mem::zeroed();
        action.sa_sigaction = on_abort as extern "C" fn(libc::c_int) as libc::sighandler_t;
        libc::sigemptyset(&mut action.sa_mask);
        libc::sigaction(ABORT_SIGNAL, &action, std::ptr::null_mut());
        let mut set: libc::sigset_t = std::mem::zeroed();
        libc::sigemptyset(&mut set);
        libc::sigaddset(&mut set, ABORT_SIGNAL);
        libc::pthread_sigmask(libc::SIG_UNBLOCK, &set, std::ptr::null_mut());
    }
    abort
}

/// The pipe from the parent.
pub(super) struct Input {
    reader: BufReader<File>,
    /// Whether waits poll for a moment first (see [`Spin`]); set for each run.
    pub(super) spin: bool,
    /// The flag the abort signal sets.
    abort: Arc<AtomicBool>,
}

impl Input {
    /// Reads from `pipe`; `abort` is the flag the abort signal sets.
    pub(super) fn new(pipe: File, abort: Arc<AtomicBool>) -> Input {
        Input { reader: BufReader::with_capacity(64 * 1024, pipe), spin: false, abort }
    }

    /// Whether the run in progress was told to abort.
    fn aborted(&self) -> bool {
        self.abort.load(Ordering::SeqCst)
    }

    /// Whether a frame (or the end of the pipe) can be read before `timeout` passes (`None`:
    /// waits as long as it takes). With `abortable`, an abort ends the wait too (`false`).
    fn ready(&self, timeout: Option<Duration>, abortable: bool) -> bool {
        if !self.reader.buffer().is_empty() {
            return true;
        }
        let started = Instant::now();
        let fd = self.reader.get_ref().as_raw_fd();
        let mut polling = Spin::new(self.spin, timeout.unwrap_or(Duration::MAX));
        while polling.again() {
            if abortable && self.aborted() {
                return false;
            }
            if readable(fd, Some(Duration::ZERO)) == Some(true) {
                return true;
            }
        }
        loop {
            if abortable && self.aborted() {
                return false;
            }
            // Interrupted by a signal: look at the abort flag, then wait for what is left.
            if let Some(ready) = readable(fd, timeout.map(|t| t.saturating_sub(started.elapsed()))) {
                return ready;
            }
        }
    }

    /// The next frame, waiting as long as it takes. At the end of the pipe the runner has closed
    /// it or died: nobody can use what this process computes, so it ends now, even in the middle
    /// of a run (a worker never outlives its runner). An unreadable frame ends it too.
    pub(super) fn frame(&mut self) -> ToChild {
        self.ready(None, false);
        match read_frame::<_, ToChild>(&mut self.reader) {
            Ok(Some(frame)) => frame,
            Ok(None) => exit_now(0),
            Err(error) => {
                eprintln!("an unreadable frame from the runner: {error}");
                exit_now(70)
            }
        }
    }

    /// Appends to `out` up to `wanted` bytes that have arrived (at least one), waiting until
    /// `deadline` at most (`None`: as long as it takes, even past an abort); `false` past the
    /// deadline or at an abort.
    fn take(&mut self, wanted: usize, deadline: Option<Instant>, out: &mut Vec<u8>) -> bool {
        let timeout = deadline.map(|d| d.saturating_duration_since(Instant::now()));
        if !self.ready(timeout, deadline.is_some()) {
            return false;
        }
        let available = match self.reader.fill_buf() {
            Ok([]) => exit_now(0),
            Ok(bytes) => bytes,
            Err(error) => {
                eprintln!("cannot read from the runner: {error}");
                exit_now(70)
            }
        };
        let taken = available.len().min(wanted);
        out.extend_from_slice(&available[..taken]);
        self.reader.consume(taken);
        true
    }
}

/// Ends the process at once.
pub(super) fn exit_now(status: i32) -> ! {
    // SAFETY: _exit ends the process at once, without running atexit handlers or destructors;
    // it touches no memory of this process.
    unsafe { libc::_exit(status) }
}

/// Whether `fd` has input (or has ended) within `timeout` (`None` waits without end); `None`
/// when a signal interrupted the wait.
fn readable(fd: i32, timeout: Option<Duration>) -> Option<bool> {
    let mut poll = libc::pollfd { fd, events: libc::POLLIN, revents: 0 };
    let timeout = timeout.map(|t| libc::timespec {
        tv_sec: t.as_secs().min(i32::MAX as u64) as libc::time_t,
        tv_nsec: t.subsec_nanos() as libc::c_long,
    });
    let timeout_ptr = timeout.as_ref().map_or(std::ptr::null(), |t| t as *const libc::timespec);
    // SAFETY: one valid pollfd, a valid (or null) timespec, and no signal mask.
    let ready = unsafe { libc::ppoll(&mut poll, 1, timeout_ptr, std::ptr::null()) };
    if ready >= 0 {
        Some(ready > 0)
    } else if std::io::Error::last_os_error().kind() == std::io::ErrorKind::Interrupted {
        None
    } else {
        // Not a wait that can fail for this descriptor; the read that follows says what is wrong.
        Some(true)
    }
}

/// Settles of the run in progress, and its abort.
pub(super) struct PipeInbox {
    pub(super) input: Arc<Mutex<Input>>,
    /// The run's prior ledger, which comes before anything else.
    pub(super) state: Arc<Mutex<PipedState>>,
}

impl Inbox for PipeInbox {
    fn next(&self, timeout: Duration) -> Result<WorkerMessage, RecvTimeoutError> {
        // What is left of the ledger (its checksum, say, for a run that needed none of it) is
        // read before the frames that follow it.
        self.state.lock().unwrap_or_else(|p| p.into_inner()).finish_reading();
        let mut input = self.input.lock().unwrap_or_else(|p| p.into_inner());
        if !input.ready(Some(timeout), true) {
            return if input.aborted() { Ok(WorkerMessage::Abort) } else { Err(RecvTimeoutError::Timeout) };
        }
        match input.frame() {
            ToChild::Settled { index, outcome, clock } => {
                Ok(WorkerMessage::Settled { index, result: outcome.into(), clock: Some(clock) })
            }
            // The runner sends a run only between runs.
            ToChild::Run(_) => Err(RecvTimeoutError::Disconnected),
        }
    }
}

/// The prior ledger of a run, read as it arrives after the run's frame (the state's length,
/// then the state in its encoding, which the parent may still be decoding) and parsed here, so
/// that the replay starts with the first entries.
pub(super) struct PipedState {
    input: Arc<Mutex<Input>>,
    /// The state's length, once its four bytes have arrived.
    total: Option<usize>,
    /// What arrived of the length, then of the state.
    bytes: Vec<u8>,
    parser: Option<StateParser>,
    /// Parts parsed and not handed out yet.
    parsed: VecDeque<FeedItem>,
    /// Whether the verdict on the state was made.
    judged: bool,
}

impl PipedState {
    /// The state that `input` delivers next.
    pub(super) fn new(input: Arc<Mutex<Input>>) -> PipedState {
        PipedState { input, total: None, bytes: Vec::new(), parser: None, parsed: VecDeque::new(), judged: false }
    }

    /// Whether all of the state has arrived.
    fn arrived(&self) -> bool {
        self.total.is_some_and(|total| self.bytes.len() >= total)
    }

    /// Reads what arrives next, up to the end of the state; `false` past `deadline`.
    fn read_more(&mut self, deadline: Option<Instant>) -> bool {
        let mut input = self.input.lock().unwrap_or_else(|p| p.into_inner());
        let wanted = match self.total {
            None => 4 - self.bytes.len(),
            Some(total) => total - self.bytes.len(),
        };
        if !input.take(wanted, deadline, &mut self.bytes) {
            return false;
        }
        drop(input);
        if self.total.is_none()
            && let Some(length) = self.bytes.first_chunk::<4>()
        {
            let total = u32::from_le_bytes(*length) as usize;
            if total > MAX_FRAME_BYTES {
                eprintln!("the runner announced a ledger of {total} bytes");
                exit_now(70);
            }
            self.total = Some(total);
            self.parser = Some(StateParser::new(total));
            self.bytes.clear();
            self.bytes.reserve_exact(total);
        }
        true
    }

    /// Parses what arrived, queueing the parts it completes and, once the whole state is in, the
    /// verdict.
    fn parse(&mut self) {
        let Some(parser) = self.parser.as_mut() else { return };
        if self.judged {
            return;
        }
        let mut entries = Vec::new();
        let parsed = &mut self.parsed;
        let advanced = parser.advance(&self.bytes, |part| match part {
            Parsed::Head(head) => parsed.push_back(FeedItem::Head(head)),
            Parsed::Entry(entry) => entries.push(entry),
        });
        if !entries.is_empty() {
            self.parsed.push_back(FeedItem::Entries(entries));
        }
        let verdict = match advanced {
            Err(error) => Err(error),
            Ok(()) if self.arrived() => self.parser.take().map_or(Ok(()), |parser| parser.finish(&self.bytes)),
            Ok(()) => return,
        };
        self.judged = true;
        self.parsed.push_back(FeedItem::End(verdict.map_err(RunError::protocol)));
    }

    /// Reads the rest of the state, so that the next frame is read from its start (a run may
    /// end before its replay used the whole ledger).
    pub(super) fn finish_reading(&mut self) {
        while !self.arrived() {
            self.read_more(None);
        }
    }
}

/// A [`PipedState`] that the feed of one run and the worker's loop share.
pub(super) struct SharedState(pub(super) Arc<Mutex<PipedState>>);

impl FeedSource for SharedState {
    fn next_item(&mut self, deadline: Instant) -> Result<FeedItem, RunError> {
        let mut state = self.0.lock().unwrap_or_else(|p| p.into_inner());
        loop {
            if let Some(item) = state.parsed.pop_front() {
                return Ok(item);
            }
            if state.judged {
                return Err(RunError::internal("the ledger was read past its end"));
            }
            if !state.arrived() && !state.read_more(Some(deadline)) {
                if state.input.lock().unwrap_or_else(|p| p.into_inner()).aborted() {
                    return Err(RunError::new(ErrorCode::Aborted, "the run was cancelled by its caller"));
                }
                return Err(RunError::new(ErrorCode::Timeout, "the continuation was still arriving at the time limit"));
            }
            state.parse();
        }
    }
}
