//! The audit log on both backends: appends, dedup, pages, and verification of edited chains.

use serde_json::json;

use super::*;
use crate::db::Backend;
use crate::testing::TempDb;

/// Runs `check` on a fresh SQLite database and, if a test server is configured, a fresh
/// PostgreSQL schema.
async fn on_both<F: AsyncFn(&AppDb)>(check: F) {
    let temp = TempDb::sqlite().await;
    check(&temp.open().await).await;
    if let Some(temp) = TempDb::postgres().await {
        check(&temp.open().await).await;
    }
}

/// Lets the test change entries, as someone with the tables' owner rights could.
async fn allow_edits(db: &AppDb) {
    match db.backend() {
        Backend::Postgres => {
            db.execute("ALTER TABLE audit_entries DISABLE TRIGGER audit_entries_append_only", vec![]).await.unwrap();
        }
        _ => {
            db.execute("DROP TRIGGER audit_entries_no_update", vec![]).await.unwrap();
            db.execute("DROP TRIGGER audit_entries_no_delete", vec![]).await.unwrap();
        }
    }
}

fn entry(n: u64) -> AuditEntry {
    AuditEntry::new(AuditKind::Cancel, Actor::new("alice").with_key_id("0123456789ab"), json!({ "n": n, "z": 0 }))
        .about(format!("run_{n:02x}"))
}

async fn append_three(audit: &Audit, tenant: &str) {
    for n in 1..=3 {
        let recorded = audit.record(tenant, entry(n)).await.unwrap();
        assert!(matches!(recorded, Recorded::Appended { seq, .. } if seq == n), "{recorded:?}");
    }
}

#[tokio::test]
async fn appends_chain_per_tenant_and_read_back_in_order() {
    on_both(async |db: &AppDb| {
        let audit = Audit::new(db.clone());
        append_three(&audit, "acme").await;
        audit.record("globex", entry(9)).await.unwrap();
        let page = audit.page("acme", 1, 2).await.unwrap();
        assert_eq!(page.entries.iter().map(|e| e.seq).collect::<Vec<_>>(), [1, 2]);
        assert_eq!((page.next, page.head_seq), (3, 3));
        assert_eq!(page.entries[0].prev_hash, "0".repeat(64));
        assert_eq!(page.entries[1].prev_hash, page.entries[0].hash);
        assert_eq!(page.entries[0].data, json!({ "n": 1, "z": 0 }));
        assert_eq!(
            (page.entries[0].kind.as_str(), page.entries[0].key_id.as_deref()),
            ("cancel", Some("0123456789ab"))
        );
        let rest = audit.page("acme", page.next, 10).await.unwrap();
        assert_eq!(rest.entries.len(), 1);
        assert_eq!(rest.entries[0].hash, rest.head_hash);
        assert_eq!(rest.next, 4);
        assert!(audit.page("acme", 4, 10).await.unwrap().entries.is_empty());
        // Another tenant's chain starts at 1 and is not in acme's pages.
        let globex = audit.page("globex", 1, 10).await.unwrap();
        assert_eq!((globex.entries.len(), globex.entries[0].seq), (1, 1));
        let empty = audit.page("nobody", 1, 10).await.unwrap();
        assert_eq!((empty.entries.len(), empty.head_seq, empty.next), (0, 0, 1));
        let reports = audit.verify(None).await.unwrap();
        assert_eq!(
            reports.iter().map(|r| (r.tenant.as_str(), r.verified)).collect::<Vec<_>>(),
            [("acme", 3), ("globex", 1)]
        );
        assert!(reports.iter().all(ChainReport::is_whole), "{reports:?}");
    })
    .await;
}

#[tokio::test]
async fn a_dedup_key_appends_once() {
    on_both(async |db: &AppDb| {
        let audit = Audit::new(db.clone());
        let keyed = || entry(1).dedup_key("once");
        assert!(matches!(audit.record("acme", keyed()).await.unwrap(), Recorded::Appended { seq: 1, .. }));
        assert_eq!(audit.record("acme", keyed()).await.unwrap(), Recorded::AlreadyRecorded);
        // The same key in another tenant is another entry; the next entry of acme is number 2.
        assert!(matches!(audit.record("globex", keyed()).await.unwrap(), Recorded::Appended { seq: 1, .. }));
        assert!(matches!(audit.record("acme", entry(2)).await.unwrap(), Recorded::Appended { seq: 2, .. }));
        // A refused duplicate of a tenant's first entry leaves no head behind.
        assert!(audit.verify(Some("acme")).await.unwrap()[0].is_whole());
    })
    .await;
}

#[tokio::test]
async fn invalid_entries_are_refused_with_their_code() {
    on_both(async |db: &AppDb| {
        let audit = Audit::new(db.clone());
        let cases = [
            ("", entry(1)),
            ("acme", AuditEntry::new(AuditKind::Cancel, "", json!({}))),
            ("acme", entry(1).dedup_key("k".repeat(MAX_DEDUP_KEY_BYTES + 1))),
            ("acme", AuditEntry::new(AuditKind::Cancel, Actor::new("a").with_key_id("k".repeat(65)), json!({}))),
            ("acme", AuditEntry::new(AuditKind::Cancel, "a", json!("x".repeat(MAX_DATA_BYTES)))),
        ];
        for (tenant, entry) in cases {
            let err = audit.record(tenant, entry).await.unwrap_err();
            assert_eq!(err.code(), "AUDIT_INVALID_ENTRY", "{err}");
        }
        assert!(audit.verify(None).await.unwrap().is_empty(), "nothing was appended");
    })
    .await;
}

#[tokio::test]
async fn entries_cannot_be_changed_through_the_application_tables() {
    on_both(async |db: &AppDb| {
        let audit = Audit::new(db.clone());
        append_three(&audit, "acme").await;
        let update = db.execute("UPDATE audit_entries SET data = '{}' WHERE seq = 2", vec![]).await;
        assert!(update.unwrap_err().to_string().contains("append-only"));
        let delete = db.execute("DELETE FROM audit_entries WHERE seq = 3", vec![]).await;
        assert!(delete.unwrap_err().to_string().contains("append-only"));
    })
    .await;
}

#[tokio::test]
async fn verification_names_the_first_entry_that_was_changed() {
    on_both(async |db: &AppDb| {
        let audit = Audit::new(db.clone());
        append_three(&audit, "acme").await;
        append_three(&audit, "globex").await;
        allow_edits(db).await;
        let edit = "UPDATE audit_entries SET data = '{\"n\":2,\"z\":1}' WHERE tenant = 'acme' AND seq = 2";
        db.execute(edit, vec![]).await.unwrap();
        let reports = audit.verify(None).await.unwrap();
        let broken = reports[0].broken.as_ref().expect("acme's chain is broken");
        assert_eq!((reports[0].tenant.as_str(), broken.seq, broken.problem), ("acme", 2, Problem::HashMismatch));
        assert_eq!(reports[0].verified, 1);
        assert!(reports[1].is_whole(), "globex's chain is another: {reports:?}");

        // Recomputing the edited entry's hash moves the break to the next entry, whose prev_hash
        // still names the original.
        let edited = audit.page("acme", 2, 1).await.unwrap().entries.remove(0);
        let fields = chain::ChainedFields {
            tenant: "acme",
            seq: 2,
            time_ms: edited.time,
            kind: &edited.kind,
            actor: &edited.actor,
            key_id: edited.key_id.as_deref(),
            automation: edited.automation.as_deref(),
            data: "{\"n\":2,\"z\":1}",
        };
        let prev: [u8; 32] = hex_simd::decode_to_vec(&edited.prev_hash).unwrap().try_into().unwrap();
        let rehashed = chain::entry_hash(&prev, &fields).to_vec();
        let relink = "UPDATE audit_entries SET hash = $1 WHERE tenant = 'acme' AND seq = 2";
        db.execute(relink, vec![rehashed.into()]).await.unwrap();
        let broken = audit.verify(Some("acme")).await.unwrap().remove(0).broken.unwrap();
        assert_eq!((broken.seq, broken.problem), (3, Problem::ChainBroken), "{broken:?}");
    })
    .await;
}

#[tokio::test]
async fn verification_finds_removed_and_inserted_entries() {
    on_both(async |db: &AppDb| {
        let audit = Audit::new(db.clone());
        for tenant in ["a", "b", "c"] {
            append_three(&audit, tenant).await;
        }
        allow_edits(db).await;
        db.execute("DELETE FROM audit_entries WHERE tenant = 'a' AND seq = 2", vec![]).await.unwrap();
        db.execute("DELETE FROM audit_entries WHERE tenant = 'b' AND seq = 3", vec![]).await.unwrap();
        // An entry added after the head, copied from another chain.
        let copy = "INSERT INTO audit_entries (tenant, seq, time_ms, kind, actor, key_id, automation, data, dedup_key,
                        prev_hash, hash)
                    SELECT 'c', 4, time_ms, kind, actor, key_id, automation, data, NULL, hash, hash
                    FROM audit_entries WHERE tenant = 'a' AND seq = 3";
        db.execute(copy, vec![]).await.unwrap();
        let reports = audit.verify(None).await.unwrap();
        let found: Vec<(i64, Problem)> =
            reports.iter().map(|r| r.broken.as_ref().map(|b| (b.seq, b.problem)).unwrap()).collect();
        assert_eq!(found, [(2, Problem::SeqGap), (3, Problem::HeadMismatch), (4, Problem::ChainBroken)], "{reports:?}");
    })
    .await;
}

#[tokio::test]
async fn concurrent_appends_to_one_tenant_make_one_chain() {
    on_both(async |db: &AppDb| {
        let audit = Audit::new(db.clone());
        let tasks: Vec<_> = (0..16)
            .map(|n| {
                let audit = audit.clone();
                tokio::spawn(async move { audit.record(if n % 2 == 0 { "even" } else { "odd" }, entry(n)).await })
            })
            .collect();
        for task in tasks {
            task.await.unwrap().unwrap();
        }
        for report in audit.verify(None).await.unwrap() {
            assert_eq!((report.verified, report.head_seq), (8, Some(8)), "{report:?}");
            assert!(report.is_whole(), "{report:?}");
        }
    })
    .await;
}
