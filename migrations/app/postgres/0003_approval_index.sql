-- The automations that wait for a decision, by tenant: the approvals list reads this instead of
-- every tenant's runs. A round adds its row when it asks; the next round removes it.
CREATE TABLE approval_index (
    automation_id TEXT NOT NULL,
    round         INTEGER NOT NULL,
    tenant        TEXT NOT NULL,
    requested_at  BIGINT NOT NULL,
    PRIMARY KEY (automation_id, round)
);

CREATE INDEX approval_index_by_tenant ON approval_index (tenant, requested_at);
