//! Accepting HTTP connections with limits: at most so many at once, and a connection whose
//! request headers do not arrive in time is closed (a client that opens connections and sends
//! nothing, or its headers a byte a minute, cannot hold the server's connections).
//!
//! Each connection is served with hyper's HTTP/1.1 server, with keep-alive; on shutdown the
//! server stops accepting, and each connection finishes its request in flight and closes.

use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use axum::Router;
use axum::extract::ConnectInfo;
use hyper::body::Incoming;
use hyper_util::rt::{TokioIo, TokioTimer};
use hyper_util::server::graceful::GracefulShutdown;
use hyper_util::service::TowerToHyperService;
use tokio::net::TcpListener;
use tokio::sync::Semaphore;
use tower::ServiceExt as _;

/// What a server accepts.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ConnectionLimits {
    /// Connections open at once; past it, new ones wait to be accepted.
    pub max_connections: usize,
    /// How long a connection may take to send a request's headers (the first one's from when it
    /// opened, a later one's from when the one before was answered). A request's body may take
    /// three times as long ([`ConnectionLimits::body_timeout`]).
    pub header_read_timeout: Duration,
}

impl ConnectionLimits {
    /// How long a request's body may take to arrive whole after its headers: then the request
    /// ends (408 `REQUEST_TIMEOUT`), so a client that sends a body a byte at a time cannot hold a
    /// connection. A handler is never cut short once its body is read.
    pub fn body_timeout(&self) -> Duration {
        self.header_read_timeout.saturating_mul(3)
    }
}

impl Default for ConnectionLimits {
    fn default() -> ConnectionLimits {
        ConnectionLimits { max_connections: 1024, header_read_timeout: Duration::from_secs(10) }
    }
}

/// Serves `app` on `listener` within `limits` until `shutdown` completes, then waits for the
/// connections to finish.
pub(super) async fn serve(
    listener: TcpListener,
    app: Router,
    limits: ConnectionLimits,
    shutdown: impl Future<Output = ()>,
) -> std::io::Result<()> {
    let permits = Arc::new(Semaphore::new(limits.max_connections.max(1)));
    let graceful = GracefulShutdown::new();
    let mut shutdown = std::pin::pin!(shutdown);
    loop {
        let permit = tokio::select! {
            permit = Arc::clone(&permits).acquire_owned() => match permit {
                Ok(permit) => permit,
                Err(_) => break,
            },
            () = &mut shutdown => break,
        };
        let (stream, remote) = tokio::select! {
            accepted = listener.accept() => match accepted {
                Ok(accepted) => accepted,
                // Out of file descriptors, say: wait a moment rather than spin.
                Err(e) => {
                    tracing::warn!(error = %e, "cannot accept a connection");
                    tokio::time::sleep(Duration::from_secs(1)).await;
                    continue;
                }
            },
            () = &mut shutdown => break,
        };
        let _ = stream.set_nodelay(true);
        let service = app.clone().map_request(move |mut request: hyper::Request<Incoming>| {
            request.extensions_mut().insert(ConnectInfo(remote));
            let deadline = tokio::time::Instant::now() + limits.body_timeout();
            request.extensions_mut().insert(super::body::BodyDeadline(deadline));
            request.map(axum::body::Body::new)
        });
        let mut builder = hyper::server::conn::http1::Builder::new();
        builder.timer(TokioTimer::new()).header_read_timeout(limits.header_read_timeout).keep_alive(true);
        let connection = builder.serve_connection(TokioIo::new(stream), TowerToHyperService::new(service));
        let connection = graceful.watch(connection);
        tokio::spawn(async move {
            if let Err(e) = connection.await {
                tracing::debug!(error = %e, remote = %remote, "a connection ended with an error");
            }
            drop(permit);
        });
    }
    drop(listener);
    graceful.shutdown().await;
    Ok(())
}
