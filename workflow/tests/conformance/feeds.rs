//! Feeds: the stream events of every run in a feed, numbered in commit order, read from any
//! cursor and live.

use std::collections::{BTreeMap, HashSet};
use std::time::Duration;

use resumable_workflow::{Engine, FeedEntry, FeedReader, RunFilter, RunId, StartOptions, WorkflowContext};
use serde_json::{Value, json};

use super::{Backend, WAIT, emit_range, finished, join_all, waiting};

/// A run that emits `{"run", "turn"}` for each of its `turns`, waiting between two turns on the
/// hook `<run>-<turn>`.
async fn turns(ctx: WorkflowContext, input: Value) -> Result<Value, resumable_workflow::WorkflowError> {
    let name = input["run"].as_str().unwrap_or_default().to_owned();
    let turns = input["turns"].as_u64().unwrap_or_default();
    for turn in 0..turns {
        ctx.emit(&json!({ "run": name, "turn": turn })).await?;
        if turn + 1 < turns {
            ctx.hook(&format!("{name}-{turn}"), json!(null)).await?.next().await?;
        }
    }
    Ok(json!(null))
}

/// A run that starts a child run of one turn, waits for it, and emits once itself.
async fn parent(ctx: WorkflowContext, _input: Value) -> Result<Value, resumable_workflow::WorkflowError> {
    let child = ctx.start_child("turns", json!({ "run": "child", "turns": 1 })).await?;
    child.result().await?;
    ctx.emit(&json!({ "run": "parent", "turn": 0 })).await?;
    Ok(json!(null))
}

async fn next(reader: &mut FeedReader) -> FeedEntry {
    tokio::time::timeout(WAIT, reader.next()).await.expect("the feed has the next entry").expect("read")
}

async fn take(reader: &mut FeedReader, n: usize) -> Vec<FeedEntry> {
    let mut entries = Vec::with_capacity(n);
    for _ in 0..n {
        entries.push(next(reader).await);
    }
    entries
}

/// Waits until nothing more arrives for a while.
async fn assert_quiet(reader: &mut FeedReader) {
    let more = tokio::time::timeout(Duration::from_millis(150), reader.next()).await;
    assert!(more.is_err(), "nothing more is in the feed, got {more:?}");
}

fn turn_of(entry: &FeedEntry) -> (String, u64) {
    (entry.event["run"].as_str().unwrap().to_owned(), entry.event["turn"].as_u64().unwrap())
}

pub async fn feed_interleaves_its_runs_from_any_cursor_and_follows_live(backend: &impl Backend) {
    let engine = Engine::builder(backend.open("db").await).register("turns", turns).register("parent", parent).build();
    let start = |run: &str, turns: u64, feed: Option<&str>| {
        let options = StartOptions { feed: feed.map(str::to_owned), ..StartOptions::default() };
        engine.start("turns", json!({ "run": run, "turns": turns }), options)
    };
    let a = start("a", 3, Some("t1")).await.unwrap();
    let b = start("b", 3, Some("t1")).await.unwrap();
    let other = start("x", 2, Some("t2")).await.unwrap();
    let outside = start("n", 1, None).await.unwrap();
    for id in [&a, &b, &other] {
        waiting(&engine, id).await;
    }
    finished(&engine, &outside).await;

    // Follow t1 live while a and b take turns.
    let mut live = engine.read_feed("t1", 0);
    assert_eq!((live.feed(), live.next_cursor()), ("t1", 1));
    let mut seen = take(&mut live, 2).await;
    let mut firsts: Vec<_> = seen.iter().map(turn_of).collect();
    firsts.sort();
    assert_eq!(firsts, [("a".to_owned(), 0), ("b".to_owned(), 0)]);
    for (run, turn) in [("a", 0), ("b", 0), ("a", 1), ("b", 1)] {
        let token = format!("{run}-{turn}");
        tokio::time::timeout(WAIT, async {
            while engine.get_hook(&token).await.unwrap().is_none() {
                tokio::time::sleep(Duration::from_millis(5)).await;
            }
        })
        .await
        .expect("the run waits on its hook");
        engine.resume_hook(&token, json!(null)).await.unwrap();
        let entry = next(&mut live).await;
        assert_eq!(turn_of(&entry), (run.to_owned(), turn + 1), "the feed follows live, in commit order");
        seen.push(entry);
    }
    finished(&engine, &a).await;
    finished(&engine, &b).await;
    assert_quiet(&mut live).await;

    let cursors: Vec<u64> = seen.iter().map(|e| e.cursor).collect();
    assert_eq!(cursors, (1..=6).collect::<Vec<_>>(), "numbered 1, 2, 3, ... without gaps");
    for entry in &seen {
        let (run, turn) = turn_of(entry);
        assert_eq!(entry.run_id, if run == "a" { a.clone() } else { b.clone() });
        assert_eq!((entry.workflow.as_str(), entry.index), ("turns", turn), "its run and its index in that run");
    }

    // Read again from the start and from the middle: the same entries, once each.
    let mut from_start = engine.read_feed("t1", 1);
    assert_eq!(take(&mut from_start, 6).await, seen);
    assert_quiet(&mut from_start).await;
    let mut from_middle = engine.read_feed("t1", 4);
    assert_eq!(take(&mut from_middle, 3).await, seen[3..]);
    assert_eq!(from_middle.next_cursor(), 7);

    // A child run is in its parent's feed; the readers at the end see both, live.
    let family = engine.start("parent", json!({}), StartOptions::default().in_feed("t1")).await.unwrap();
    let child_entry = next(&mut from_middle).await;
    let parent_entry = next(&mut from_middle).await;
    assert_eq!((child_entry.cursor, turn_of(&child_entry)), (7, ("child".to_owned(), 0)));
    assert_ne!(child_entry.run_id, family);
    assert_eq!((parent_entry.cursor, &parent_entry.run_id, parent_entry.workflow.as_str()), (8, &family, "parent"));
    assert_eq!(take(&mut live, 2).await, [child_entry.clone(), parent_entry]);
    finished(&engine, &family).await;

    // The other feed has only its own run; a feed nobody wrote to is empty.
    let mut t2 = engine.read_feed("t2", 1);
    let entry = next(&mut t2).await;
    assert_eq!((entry.cursor, &entry.run_id, turn_of(&entry)), (1, &other, ("x".to_owned(), 0)));
    assert_quiet(&mut t2).await;
    assert_quiet(&mut engine.read_feed("nobody", 1)).await;
    assert!(engine.store().read_feed("t1", 9, 10).await.unwrap().is_empty());
    assert_eq!(engine.store().read_feed("t1", 2, 2).await.unwrap(), seen[1..3]);
    let heads = (engine.feed_head("t1").await.unwrap(), engine.feed_head("t2").await.unwrap());
    assert_eq!((heads, engine.feed_head("nobody").await.unwrap()), ((8, 1), 0), "the last cursor of each feed");

    // A feed's runs are listed, newest first, by workflow too, a page at a time.
    let engine = &engine;
    let listed = |filter: RunFilter| async move {
        let page = engine.list_runs(&filter).await.unwrap();
        (page.runs.into_iter().map(|r| r.id).collect::<Vec<_>>(), page.next_cursor)
    };
    let (all, _) = listed(RunFilter::default().feed("t1")).await;
    assert_eq!(all.len(), 4, "a, b, the parent and its child: {all:?}");
    assert_eq!(&all[2..], [b.clone(), a.clone()]);
    let (turns, _) = listed(RunFilter::default().feed("t1").workflow("turns")).await;
    assert_eq!(turns, [child_entry.run_id.clone(), b.clone(), a.clone()]);
    let (first, cursor) = listed(RunFilter::default().feed("t1").workflow("turns").limit(2)).await;
    assert_eq!(first, turns[..2]);
    let rest = RunFilter { cursor, ..RunFilter::default().feed("t1").workflow("turns") };
    assert_eq!(listed(rest).await, (vec![a.clone()], None));
    assert_eq!(listed(RunFilter::default().feed("t2")).await.0, [other]);
    assert!(listed(RunFilter::default().feed("nobody")).await.0.is_empty());
}

pub async fn eight_concurrent_writers_in_two_feeds_lose_and_duplicate_nothing(backend: &impl Backend) {
    const RUNS: usize = 8;
    const EVENTS: u64 = 40;
    const PER_FEED: usize = RUNS / 2 * EVENTS as usize;
    let engine = Engine::builder(backend.open("db").await)
        .workers(RUNS)
        .register("burst", |ctx: WorkflowContext, _input: Value| async move {
            emit_range(&ctx, 0, EVENTS).await?;
            Ok(json!(null))
        })
        .build();
    let feeds = ["even", "odd"];
    // Readers follow both feeds from the start while the writers write.
    let readers: Vec<_> = feeds
        .iter()
        .map(|feed| {
            let mut reader = engine.read_feed(feed, 1);
            tokio::spawn(async move { take(&mut reader, PER_FEED).await })
        })
        .collect();
    let starts = (0..RUNS).map(|i| {
        let options = StartOptions::default().in_feed(feeds[i % 2]);
        engine.start("burst", json!({ "writer": i }), options)
    });
    let ids: Vec<RunId> = join_all(starts.collect()).await.into_iter().map(Result::unwrap).collect();
    for id in &ids {
        finished(&engine, id).await;
    }
    for (i, (feed, reader)) in feeds.iter().zip(readers).enumerate() {
        let live = reader.await.unwrap();
        let runs: HashSet<&RunId> = ids.iter().skip(i).step_by(2).collect();
        assert_complete(feed, &live, &runs);
        // A reader that starts at a cursor in the middle afterwards gets exactly the rest.
        let mut late = engine.read_feed(feed, 101);
        assert_eq!(take(&mut late, PER_FEED - 100).await, live[100..], "{feed} from cursor 101");
        assert_quiet(&mut late).await;
    }

    fn assert_complete(feed: &str, entries: &[FeedEntry], runs: &HashSet<&RunId>) {
        let cursors: Vec<u64> = entries.iter().map(|e| e.cursor).collect();
        assert_eq!(cursors, (1..=entries.len() as u64).collect::<Vec<_>>(), "{feed}: no gap, no duplicate");
        let mut by_run: BTreeMap<&RunId, Vec<u64>> = BTreeMap::new();
        for entry in entries {
            assert!(runs.contains(&entry.run_id), "{feed} has only its own runs' events");
            assert_eq!(entry.event, json!({ "n": entry.index }));
            by_run.entry(&entry.run_id).or_default().push(entry.index);
        }
        assert_eq!(by_run.len(), runs.len(), "{feed}: every writer's events");
        for indexes in by_run.values() {
            assert_eq!(indexes, &(0..EVENTS).collect::<Vec<_>>(), "{feed}: each run's events once, in order");
        }
    }
}
