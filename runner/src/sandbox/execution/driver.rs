//! The loop that drives one run: jobs, replayed settles, host calls started and settled, until
//! the script's promise settles or a limit stops it.

use super::*;

/// Drives one run to its outcome.
pub(super) struct Driver<'a, 'js> {
    pub(super) ctx: Ctx<'js>,
    pub(super) env: Rc<RunEnv<'js>>,
    pub(super) job: &'a Job,
}

/// What the loop does next.
enum Step {
    Continue,
    Done(Result<RawOutcome, RunError>),
}

impl<'js> Driver<'_, 'js> {
    /// Runs the script's bytecode `code` until it ends, fails or passes `deadline`.
    pub(super) fn run(&self, code: &Bytecode, deadline: Instant) -> Result<RawOutcome, RunError> {
        let main = match js::load(&self.ctx, code) {
            Ok(main) => main,
            Err(thrown) => return Err(self.failure(thrown)),
        };
        let Some(main) = main.as_function().cloned() else {
            return Err(RunError::new(ErrorCode::Error, "the source must be a function body"));
        };
        let promise = match main.call::<_, Value>(()) {
            Ok(value) => value,
            Err(_) => {
                let thrown = self.ctx.catch();
                return Err(self.failure(thrown));
            }
        };
        let Some(promise) = promise.into_promise() else {
            return Err(RunError::internal("the script wrapper did not return a promise"));
        };
        loop {
            self.run_jobs();
            if self.env.guard.should_stop() {
                let error = self.env.guard.check().unwrap_or_else(|| RunError::internal("the run stopped"));
                return Err(self.with_console(error));
            }
            match self.step(&promise, deadline) {
                Step::Continue => {}
                Step::Done(result) => return result.map_err(|e| self.with_console(e)),
            }
        }
    }

    fn run_jobs(&self) {
        // SAFETY: `self.ctx` is a live context; this only reads its runtime pointer.
        let runtime = unsafe { qjs::JS_GetRuntime(self.ctx.as_raw().as_ptr()) };
        loop {
            // SAFETY: `runtime` is the live runtime of `self.ctx`, whose lock `Context::with` holds.
            if self.env.guard.should_stop() || !unsafe { qjs::JS_IsJobPending(runtime) } {
                return;
            }
            let mut job_ctx: *mut qjs::JSContext = std::ptr::null_mut();
            // SAFETY: as above; `job_ctx` is a valid place for the engine to name the job's context.
            if unsafe { qjs::JS_ExecutePendingJob(runtime, &mut job_ctx) } < 0 && !job_ctx.is_null() {
                // SAFETY: every job of this runtime comes from its one realm, so `job_ctx` is that
                // realm's context, kept alive by `self.ctx`; the failed job left its exception
                // pending there, and `JS_GetException` hands us that reference to free.
                unsafe { qjs::JS_FreeValue(job_ctx, qjs::JS_GetException(job_ctx)) };
            }
        }
    }

    fn step(&self, promise: &Promise<'js>, deadline: Instant) -> Step {
        let env = &*self.env;
        if let Some(step) = self.replay_step() {
            return step;
        }
        match promise.state() {
            PromiseState::Rejected => {
                // SAFETY: `promise` is a live promise of `self.ctx`; `JS_PromiseResult` returns a
                // new reference to its result, which the `Value` takes over.
                let thrown = unsafe {
                    Value::from_raw(
                        self.ctx.clone(),
                        qjs::JS_PromiseResult(self.ctx.as_raw().as_ptr(), promise.as_raw()),
                    )
                };
                return Step::Done(Err(self.failure(thrown)));
            }
            PromiseState::Resolved => {
                let bridge = env.bridge.borrow();
                if bridge.replaying {
                    return Step::Done(Err(RunError::protocol(format!(
                        "the script returned before replaying its continuation ({} of {} recorded host calls made)",
                        bridge.calls_made, bridge.recorded
                    ))));
                }
                if !bridge.requested.is_empty() {
                    return Step::Done(Err(RunError::new(
                        ErrorCode::DetachedBridgeRequest,
                        format!(
                            "the script returned without awaiting {} host call(s), which were not started; await \
                             every call",
                            bridge.requested.len()
                        ),
                    )));
                }
                if bridge.interrupted.is_empty() {
                    if bridge.in_flight > 0 {
                        return Step::Done(Err(RunError::new(
                            ErrorCode::DetachedBridgeRequest,
                            format!(
                                "the script returned while {} host call(s) it started were still running; await every call",
                                bridge.in_flight
                            ),
                        )));
                    }
                    drop(bridge);
                    return Step::Done(self.completed(promise));
                }
            }
            PromiseState::Pending => {
                // The script's jobs have all run and it still waits: the calls it made start now.
                let requested = std::mem::take(&mut env.bridge.borrow_mut().requested);
                if !requested.is_empty() {
                    // A run that tripped a limit meanwhile starts nothing: the loop ends it.
                    if env.guard.should_stop_checking_stack() {
                        return Step::Continue;
                    }
                    for index in requested {
                        env.start_host(index, None);
                    }
                }
            }
        }

        let mut bridge = env.bridge.borrow_mut();
        if let Some((index, result, clock)) = bridge.ready.pop_front() {
            drop(bridge);
            return self.settle_live(index, result, clock);
        }
        if bridge.in_flight > 0 {
            drop(bridge);
            return self.wait(deadline);
        }
        if !bridge.interrupted.is_empty() {
            drop(bridge);
            return Step::Done(self.interrupted());
        }
        Step::Done(Err(RunError::new(
            ErrorCode::Error,
            "the script is waiting on a promise that nothing can settle (no host call is running)",
        )))
    }

    /// While replaying: applies the next recorded settle, or ends the replay
    /// (checking every recorded call was made) and starts resumed calls.
    fn replay_step(&self) -> Option<Step> {
        let env = &*self.env;
        let mut bridge = env.bridge.borrow_mut();
        if !bridge.replaying {
            return None;
        }
        let next = bridge.next_settle as usize;
        let arrived = bridge.pull(env.deadline, |b| b.recorded_settle(next).is_some());
        if let Err(error) = arrived {
            return Some(Step::Done(Err(error)));
        }
        if let Some(index) = bridge.recorded_settle(next) {
            if !bridge.promises.contains_key(&index) {
                let message = format!("the script did not make host call {index}, which its continuation records");
                return Some(Step::Done(Err(RunError::protocol(message))));
            }
            bridge.next_settle += 1;
            drop(bridge);
            return Some(self.settle_recorded(index));
        }
        if (bridge.calls_made as usize) < bridge.recorded {
            let message = format!(
                "the script made {} of the {} host calls its continuation records",
                bridge.calls_made, bridge.recorded
            );
            return Some(Step::Done(Err(RunError::protocol(message))));
        }
        // Now that every recorded call has arrived: each resolution must answer one of them
        // that was interrupted.
        if let Some(index) = bridge.resolutions.keys().filter(|index| !bridge.interrupted.contains(index)).min() {
            return Some(Step::Done(Err(unknown_interruption(&format!("interrupt-{index}")))));
        }
        // The replay matched: from here on host functions run, so a stored
        // continuation is used up now (or the resume stops, having done nothing).
        drop(bridge);
        if let Err(error) = env.link.consume() {
            return Some(Step::Done(Err(error)));
        }
        bridge = env.bridge.borrow_mut();
        bridge.replaying = false;
        let mut held = std::mem::take(&mut bridge.held);
        held.sort_unstable();
        let mut starts = Vec::with_capacity(held.len());
        for index in held {
            bridge.interrupted.remove(&index);
            let resolution = bridge.resolutions.get(&index).cloned().unwrap_or(Json::Null);
            let Some(resume) = bridge.ledger[index as usize - 1].resume_with(index, resolution) else { continue };
            starts.push((index, resume));
        }
        drop(bridge);
        // A limit hit during the replay (a caught stack overflow, say) ends the run here,
        // before any host function runs; the loop reports it.
        if !env.guard.should_stop_checking_stack() {
            for (index, resume) in starts {
                env.start_host(index, Some(resume));
            }
        }
        Some(Step::Continue)
    }

    fn wait(&self, deadline: Instant) -> Step {
        let remaining = deadline.saturating_duration_since(Instant::now());
        match self.job.inbox.next(remaining.max(Duration::from_micros(1))) {
            Ok(WorkerMessage::Settled { index, result, clock }) => {
                self.env.bridge.borrow_mut().ready.push_back((index, result, clock));
            }
            Ok(WorkerMessage::Abort) => {
                self.env.guard.latch(RunError::new(ErrorCode::Aborted, "the run was cancelled by its caller"));
            }
            Err(RecvTimeoutError::Timeout) => {
                self.env.guard.latch(RunError::new(
                    ErrorCode::Timeout,
                    "the run reached its time limit while waiting on host calls",
                ));
            }
            Err(RecvTimeoutError::Disconnected) => {
                self.env.guard.latch(RunError::internal("the run's message channel closed"));
            }
        }
        Step::Continue
    }

    /// Settles a call from the ledger (no host function runs).
    fn settle_recorded(&self, index: u32) -> Step {
        let (outcome, clock, settlers) = {
            let mut bridge = self.env.bridge.borrow_mut();
            let entry = &bridge.ledger[index as usize - 1];
            let found = (entry.outcome.clone(), entry.clock);
            (found.0, found.1, bridge.promises.remove(&index))
        };
        let Some((resolve, reject)) = settlers else { return Step::Continue };
        self.env.shared.clock.set(clock);
        self.deliver(outcome, resolve, reject)
    }

    /// Records a live result in the ledger and settles its promise.
    /// `clock` is the settle's time when the parent chose it (process mode).
    fn settle_live(&self, index: u32, result: HostResult, clock: Option<f64>) -> Step {
        let env = &*self.env;
        let clock = clock.unwrap_or_else(wall_clock_ms).max(env.shared.clock.get());
        let outcome = CallOutcome::recorded(&result);
        let function = env.bridge.borrow().ledger[index as usize - 1].function.clone();
        if outcome.size() > env.output_bytes {
            return Step::Done(Err(output_too_large(&function, env.output_bytes)));
        }
        if matches!(outcome, CallOutcome::Interrupted(_)) && !env.can_interrupt {
            return Step::Done(Err(RunError::new(
                ErrorCode::ConfigurationError,
                format!(
                    "{function} interrupted the run, but the runner has no continuation secret to sign a continuation with"
                ),
            )));
        }
        env.emit(|| RunEvent::CallCompleted {
            index,
            name: function.clone(),
            outcome: CallSettlement::of(index, &outcome),
        });
        let mut bridge = env.bridge.borrow_mut();
        bridge.in_flight -= 1;
        let settle_order = (!matches!(outcome, CallOutcome::Interrupted(_))).then(|| {
            let order = bridge.next_settle;
            bridge.next_settle += 1;
            order
        });
        let entry = &mut bridge.ledger[index as usize - 1];
        entry.outcome = outcome.clone();
        entry.settle_order = settle_order;
        entry.clock = clock;
        if settle_order.is_none() {
            bridge.interrupted.insert(index);
            return Step::Continue;
        }
        let settlers = bridge.promises.remove(&index);
        drop(bridge);
        env.shared.clock.set(clock);
        match settlers {
            Some((resolve, reject)) => self.deliver(outcome, resolve, reject),
            None => Step::Continue,
        }
    }

    /// Resolves or rejects a call's promise with a recorded outcome.
    fn deliver(&self, outcome: CallOutcome, resolve: Function<'js>, reject: Function<'js>) -> Step {
        let ctx = &self.ctx;
        let delivered = match outcome {
            CallOutcome::Fulfilled(text) => match js::parse_json(ctx, &text) {
                Some(value) => resolve.call::<_, ()>((value,)),
                None => self
                    .env
                    .our_error(
                        ctx,
                        ErrorCode::SerializationError,
                        "a host result could not be read (nested too deeply)".into(),
                        None,
                    )
                    .and_then(|error| reject.call::<_, ()>((error,))),
            },
            CallOutcome::Rejected { message, details } => self
                .env
                .our_error(ctx, ErrorCode::HostFunctionError, message, details.as_deref())
                .and_then(|error| reject.call::<_, ()>((error,))),
            CallOutcome::Interrupted(_) => Ok(()),
        };
        if delivered.is_err() {
            let _ = ctx.catch();
        }
        Step::Continue
    }

    fn completed(&self, promise: &Promise<'js>) -> Result<RawOutcome, RunError> {
        if let Some(error) = self.env.guard.check() {
            return Err(error);
        }
        // SAFETY: `promise` is a live promise of `self.ctx`; `JS_PromiseResult` returns a new
        // reference to its result, which the `Value` takes over.
        let value = unsafe {
            Value::from_raw(self.ctx.clone(), qjs::JS_PromiseResult(self.ctx.as_raw().as_ptr(), promise.as_raw()))
        };
        let limit = self.job.run.limits.usize(Limit::Result);
        let text = self.env.to_json(&self.ctx, &value, "result", Mode::Strict, limit).map_err(|e| {
            if matches!(e, SerializeError::Engine) {
                if let Some(error) = self.env.guard.check() {
                    return error;
                }
            }
            RunError::new(ErrorCode::SerializationError, e.message("the result"))
        })?;
        let value = serde_json::from_str(&text).map_err(|e| RunError::internal(format!("result text: {e}")))?;
        let console = self.env.bridge.borrow_mut().console.take();
        Ok(RawOutcome::Completed { value, console })
    }

    fn interrupted(&self) -> Result<RawOutcome, RunError> {
        if let Some(error) = self.env.guard.check() {
            return Err(error);
        }
        let mut bridge = self.env.bridge.borrow_mut();
        let interruptions = crate::state::pending_interruptions(&bridge.ledger).map_err(RunError::internal)?;
        let console = bridge.console.take();
        Ok(RawOutcome::Interrupted { ledger: std::mem::take(&mut bridge.ledger), interruptions, console })
    }

    /// Turns an uncaught value into the run's error; reserved codes only for our own errors.
    fn failure(&self, thrown: Value<'js>) -> RunError {
        if let Some(error) = self.env.guard.check() {
            return error;
        }
        if thrown.is_object() {
            // SAFETY: `thrown` is an object, so its value holds the object's pointer; it is only
            // compared, never dereferenced.
            let ptr: *mut c_void = unsafe { qjs::JS_VALUE_GET_PTR(thrown.as_raw()) };
            let bridge = self.env.bridge.borrow();
            if let Some(ours) =
                // SAFETY: `e.object` is a live error object made by `js::new_error`; its pointer is
                // only compared.
                bridge.our_errors.iter().find(|e| unsafe { qjs::JS_VALUE_GET_PTR(e.object.as_raw()) } == ptr)
            {
                return RunError::new(ours.code, ours.message.clone());
            }
        }
        let fallback = |value: &Value<'js>| {
            if value.is_undefined() {
                return "undefined".to_string();
            }
            self.env.to_json(&self.ctx, value, "thrown", Mode::Lenient, 1024).unwrap_or_else(|_| "a value".into())
        };
        let stack = self.env.realm_functions().and_then(|f| f.error_stack);
        let message = js::describe_error(&self.ctx, &thrown, stack.as_ref(), 1, &fallback);
        RunError::new(ErrorCode::Error, message)
    }

    fn with_console(&self, mut error: RunError) -> RunError {
        error.console = self.env.bridge.borrow_mut().console.take();
        error
    }
}
