//! The engine's store, with its database failures counted ([`crate::metrics::STORE_ERRORS`],
//! layer `engine`): every call goes to the store inside, and an answer that is a database error
//! (not a lost lease or an unknown hook, which are the engine's own business) is counted.

use std::sync::Arc;
use std::time::Duration;

use resumable_workflow::store::{
    BoxFuture, ClaimRequest, ClaimedRun, CreatedRun, FeedEntry, Fence, HookCreation, HookPayload, Millis, NewRun,
    RunOutcome, StepUpdate, WaitResolution,
};
use resumable_workflow::{Event, HookInfo, ResumeReceipt, RunFilter, RunId, RunInfo, RunPage, RunStatus, Store};
use resumable_workflow::{StoreError, WakeHints};
use serde_json::Value;
use tokio::sync::{broadcast, watch};

/// A [`Store`] that counts the database failures of another.
pub(crate) struct CountedStore(Arc<dyn Store>);

impl CountedStore {
    pub(crate) fn new(store: Arc<dyn Store>) -> CountedStore {
        CountedStore(store)
    }
}

/// `call`'s answer, its database failure counted.
fn counted<'a, T: Send + 'a>(call: BoxFuture<'a, Result<T, StoreError>>) -> BoxFuture<'a, Result<T, StoreError>> {
    Box::pin(async move {
        let answer = call.await;
        if let Err(StoreError::Database(_) | StoreError::Corrupt(_)) = &answer {
            crate::metrics::store_error("engine");
        }
        answer
    })
}

impl Store for CountedStore {
    fn wake_signal(&self) -> Option<watch::Receiver<WakeHints>> {
        self.0.wake_signal()
    }

    fn changed_runs(&self) -> Option<broadcast::Receiver<RunId>> {
        self.0.changed_runs()
    }

    fn create_run(&self, run: NewRun) -> BoxFuture<'_, Result<CreatedRun, StoreError>> {
        counted(self.0.create_run(run))
    }

    fn get_run<'a>(&'a self, id: &'a RunId) -> BoxFuture<'a, Result<Option<RunInfo>, StoreError>> {
        counted(self.0.get_run(id))
    }

    fn list_runs<'a>(&'a self, filter: &'a RunFilter) -> BoxFuture<'a, Result<RunPage, StoreError>> {
        counted(self.0.list_runs(filter))
    }

    fn events<'a>(&'a self, id: &'a RunId) -> BoxFuture<'a, Result<Vec<Event>, StoreError>> {
        counted(self.0.events(id))
    }

    fn claim<'a>(&'a self, req: &'a ClaimRequest) -> BoxFuture<'a, Result<Option<ClaimedRun>, StoreError>> {
        counted(self.0.claim(req))
    }

    fn renew_lease<'a>(&'a self, fence: &'a Fence, lease: Duration) -> BoxFuture<'a, Result<(), StoreError>> {
        counted(self.0.renew_lease(fence, lease))
    }

    fn next_wake_at<'a>(&'a self, workflows: &'a [String]) -> BoxFuture<'a, Result<Option<Millis>, StoreError>> {
        counted(self.0.next_wake_at(workflows))
    }

    fn start_step<'a>(
        &'a self,
        fence: &'a Fence,
        position: u32,
        name: &'a str,
    ) -> BoxFuture<'a, Result<u32, StoreError>> {
        counted(self.0.start_step(fence, position, name))
    }

    fn update_step<'a>(
        &'a self,
        fence: &'a Fence,
        position: u32,
        update: StepUpdate,
    ) -> BoxFuture<'a, Result<(), StoreError>> {
        counted(self.0.update_step(fence, position, update))
    }

    fn create_hook<'a>(
        &'a self,
        fence: &'a Fence,
        position: u32,
        token: &'a str,
        metadata: &'a Value,
    ) -> BoxFuture<'a, Result<HookCreation, StoreError>> {
        counted(self.0.create_hook(fence, position, token, metadata))
    }

    fn hook_payload<'a>(
        &'a self,
        run_id: &'a RunId,
        position: u32,
        index: u64,
    ) -> BoxFuture<'a, Result<Option<HookPayload>, StoreError>> {
        counted(self.0.hook_payload(run_id, position, index))
    }

    fn create_wait<'a>(
        &'a self,
        fence: &'a Fence,
        position: u32,
        due_at: Millis,
    ) -> BoxFuture<'a, Result<(), StoreError>> {
        counted(self.0.create_wait(fence, position, due_at))
    }

    fn resolve_wait<'a>(
        &'a self,
        fence: &'a Fence,
        position: u32,
        resolution: WaitResolution,
    ) -> BoxFuture<'a, Result<(), StoreError>> {
        counted(self.0.resolve_wait(fence, position, resolution))
    }

    fn record_step<'a>(
        &'a self,
        fence: &'a Fence,
        position: u32,
        name: &'a str,
        result: &'a Value,
    ) -> BoxFuture<'a, Result<(), StoreError>> {
        counted(self.0.record_step(fence, position, name, result))
    }

    fn suspend_run<'a>(
        &'a self,
        fence: &'a Fence,
        wake_at: Option<Millis>,
    ) -> BoxFuture<'a, Result<RunStatus, StoreError>> {
        counted(self.0.suspend_run(fence, wake_at))
    }

    fn finish_run<'a>(&'a self, fence: &'a Fence, outcome: RunOutcome) -> BoxFuture<'a, Result<(), StoreError>> {
        counted(self.0.finish_run(fence, outcome))
    }

    fn cancel_run<'a>(&'a self, id: &'a RunId, reason: &'a str) -> BoxFuture<'a, Result<RunStatus, StoreError>> {
        counted(self.0.cancel_run(id, reason))
    }

    fn get_hook<'a>(&'a self, token: &'a str) -> BoxFuture<'a, Result<Option<HookInfo>, StoreError>> {
        counted(self.0.get_hook(token))
    }

    fn resume_hook<'a>(&'a self, token: &'a str, payload: Value) -> BoxFuture<'a, Result<ResumeReceipt, StoreError>> {
        counted(self.0.resume_hook(token, payload))
    }

    fn append_stream<'a>(
        &'a self,
        fence: &'a Fence,
        position: u32,
        event: &'a Value,
    ) -> BoxFuture<'a, Result<u64, StoreError>> {
        counted(self.0.append_stream(fence, position, event))
    }

    fn read_stream<'a>(
        &'a self,
        run_id: &'a RunId,
        from: u64,
        limit: u32,
    ) -> BoxFuture<'a, Result<Vec<(u64, Value)>, StoreError>> {
        counted(self.0.read_stream(run_id, from, limit))
    }

    fn feed_head<'a>(&'a self, feed: &'a str) -> BoxFuture<'a, Result<u64, StoreError>> {
        counted(self.0.feed_head(feed))
    }

    fn read_feed<'a>(
        &'a self,
        feed: &'a str,
        from: u64,
        limit: u32,
    ) -> BoxFuture<'a, Result<Vec<FeedEntry>, StoreError>> {
        counted(self.0.read_feed(feed, from, limit))
    }
}
