//! Worker processes are started from one thread that lives as long as the process.
//!
//! A worker asks the kernel to kill it when its parent dies (`PR_SET_PDEATHSIG`), and the kernel
//! counts the *thread* that forked it as the parent. Tokio's worker and blocking threads come and
//! go, so workers are forked from a dedicated thread that never exits.

use std::sync::mpsc;
use std::sync::{Mutex, OnceLock};

use tokio::process::{Child, Command};

/// What the spawning thread answers: the child, or why it could not start.
pub(crate) enum Spawned {
    /// The child runs.
    Started(Child),
    /// `spawn` failed.
    Failed(std::io::Error),
    /// The runtime cannot drive child processes (it was built without the I/O driver).
    NoRuntimeSupport,
}

struct Request {
    command: Command,
    runtime: tokio::runtime::Handle,
    reply: tokio::sync::oneshot::Sender<Spawned>,
}

/// Starts `command` from the spawning thread, registered with the caller's runtime; the caller
/// awaits the answer without blocking its runtime.
pub(crate) async fn spawn(command: Command) -> Spawned {
    static REQUESTS: OnceLock<Mutex<mpsc::Sender<Request>>> = OnceLock::new();
    let runtime = match tokio::runtime::Handle::try_current() {
        Ok(runtime) => runtime,
        Err(_) => return Spawned::NoRuntimeSupport,
    };
    let requests = REQUESTS.get_or_init(|| {
        let (sender, receiver) = mpsc::channel::<Request>();
        // Should the thread not start, the receiver goes with it and every spawn reports that.
        let _ = std::thread::Builder::new().name("resumable-spawner".into()).spawn(move || {
            for Request { mut command, runtime, reply } in receiver {
                let _entered = runtime.enter();
                let spawned = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| command.spawn()));
                let _ = reply.send(match spawned {
                    Ok(Ok(child)) => Spawned::Started(child),
                    Ok(Err(e)) => Spawned::Failed(e),
                    Err(_) => Spawned::NoRuntimeSupport,
                });
            }
        });
        Mutex::new(sender)
    });
    let (reply, answer) = tokio::sync::oneshot::channel();
    let sent = requests.lock().unwrap_or_else(|p| p.into_inner()).send(Request { command, runtime, reply });
    let gone = || Spawned::Failed(std::io::Error::other("the thread that starts worker processes is gone"));
    if sent.is_err() {
        return gone();
    }
    answer.await.unwrap_or_else(|_| gone())
}
