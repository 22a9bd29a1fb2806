//! A tenant's event feed: the events of all its automations and sessions, in the order they
//! committed, from any cursor on, live.

use resumable_workflow::{EngineError, FeedReader, RunId};
use serde::Serialize;
use serde_json::Value;

use super::WORKFLOW;
use crate::session::WORKFLOW as SESSION_WORKFLOW;

/// What wrote an event of the feed.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Source {
    /// An automation (one a session started, too).
    Automation,
    /// A session.
    Session,
}

/// One event of a tenant's feed.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct TenantEvent {
    /// Its number in the feed: read again from `cursor + 1` to continue after it.
    pub cursor: u64,
    /// What wrote it.
    pub kind: Source,
    /// The id of that automation or session.
    pub id: RunId,
    /// Its index in that automation's or session's own event stream.
    pub index: u64,
    /// The event itself, as that stream has it.
    pub event: Value,
}

/// The events of one tenant from a cursor on ([`Automations::feed`](super::Automations::feed)).
#[derive(Debug)]
pub struct TenantFeed {
    reader: FeedReader,
}

impl TenantFeed {
    pub(crate) fn new(reader: FeedReader) -> TenantFeed {
        TenantFeed { reader }
    }

    /// The next event, waiting for it: the feed has no end. After an error, calling again retries.
    pub async fn next(&mut self) -> Result<TenantEvent, EngineError> {
        loop {
            let entry = self.reader.next().await?;
            let kind = match entry.workflow.as_str() {
                WORKFLOW => Source::Automation,
                SESSION_WORKFLOW => Source::Session,
                // The tenant's other runs (webhook deliveries) write nothing for readers.
                _ => continue,
            };
            return Ok(TenantEvent {
                cursor: entry.cursor,
                kind,
                id: entry.run_id,
                index: entry.index,
                event: entry.event,
            });
        }
    }

    /// The cursor of the next event this feed yields.
    pub fn next_cursor(&self) -> u64 {
        self.reader.next_cursor()
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use resumable_workflow::store::{ClaimRequest, NewRun};
    use serde_json::json;

    use crate::db::{AppDb, Backend};
    use crate::testing::TempDb;

    /// The application's migration that puts the runs of an earlier release in their tenants' feeds.
    fn backfill(backend: Backend) -> &'static str {
        match backend {
            Backend::Sqlite => include_str!("../../migrations/app/sqlite/0006_tenant_feeds.sql"),
            _ => include_str!("../../migrations/app/postgres/0006_tenant_feeds.sql"),
        }
    }

    /// Automations and a session of two tenants that an earlier release started (in no feed) and
    /// that wrote events, interleaved; then the migration runs.
    async fn runs_of_an_earlier_release_join_their_tenants_feeds(db: &AppDb) {
        let store = db.store();
        let mut fences = Vec::new();
        for (workflow, tenant) in
            [("resumable.automation", "acme"), ("resumable.session", "acme"), ("resumable.automation", "globex")]
        {
            let new = NewRun {
                workflow: workflow.into(),
                input: json!({ "tenant": tenant }),
                idempotency_key: None,
                parent_run_id: None,
                feed: None,
            };
            store.create_run(new).await.unwrap();
            let claim =
                ClaimRequest { owner: "old".into(), workflows: vec![workflow.into()], lease: Duration::from_secs(60) };
            fences.push(store.claim(&claim).await.unwrap().expect("claimed").fence);
        }
        for (n, fence) in [&fences[0], &fences[2], &fences[1], &fences[0]].into_iter().enumerate() {
            store.append_stream(fence, n as u32 + 1, &json!({ "n": n })).await.unwrap();
            tokio::time::sleep(Duration::from_millis(2)).await;
        }
        // The clock went back a minute before globex's second event.
        store.append_stream(&fences[2], 8, &json!({ "n": 5 })).await.unwrap();
        let step_back = "UPDATE stream_events SET created_at = created_at - 60000 WHERE run_id = $1 AND idx = 1";
        assert_eq!(db.execute(step_back, vec![fences[2].run_id.as_str().into()]).await.unwrap(), 1);
        assert!(store.read_feed("acme", 1, 10).await.unwrap().is_empty(), "in no feed before the migration");

        for statement in backfill(db.backend())
            .split(";\n")
            .filter(|s| s.lines().any(|l| !l.starts_with("--") && !l.trim().is_empty()))
        {
            db.execute(statement, vec![]).await.unwrap();
        }
        let seen = |entries: Vec<resumable_workflow::FeedEntry>| -> Vec<(u64, String, u64)> {
            entries.into_iter().map(|e| (e.cursor, e.run_id.to_string(), e.event["n"].as_u64().unwrap())).collect()
        };
        let (a, s, g) = (fences[0].run_id.to_string(), fences[1].run_id.to_string(), fences[2].run_id.to_string());
        assert_eq!(
            seen(store.read_feed("acme", 1, 10).await.unwrap()),
            [(1, a.clone(), 0), (2, s, 2), (3, a.clone(), 3)]
        );
        let globex = seen(store.read_feed("globex", 0, 10).await.unwrap());
        assert_eq!(globex, [(1, g.clone(), 1), (2, g, 5)], "a run's events in their order, whatever the clock said");
        // They stay in them: the next event continues the numbering.
        store.append_stream(&fences[0], 9, &json!({ "n": 4 })).await.unwrap();
        assert_eq!(seen(store.read_feed("acme", 4, 10).await.unwrap()), [(4, a, 4)]);
    }

    #[tokio::test]
    async fn the_migration_numbers_the_events_of_an_earlier_release_in_their_tenants_feeds() {
        let temp = TempDb::sqlite().await;
        runs_of_an_earlier_release_join_their_tenants_feeds(&temp.open().await).await;
        if let Some(temp) = TempDb::postgres().await {
            runs_of_an_earlier_release_join_their_tenants_feeds(&temp.open().await).await;
        }
    }
}
