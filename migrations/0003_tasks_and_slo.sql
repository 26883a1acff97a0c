-- Tasks (a unit of work an agent attempts, with its outcome) and each request's SLO verdict.

CREATE TABLE tasks (
    id              uuid        PRIMARY KEY,
    tenant_id       uuid        NOT NULL REFERENCES tenants (id),
    -- The session the task runs in, if any (plain chat completions may carry tasks too).
    session_id      uuid        NULL REFERENCES sessions (id),
    title           text        NOT NULL CHECK (length(title) BETWEEN 1 AND 500),
    -- 'open' until an outcome is recorded once: 'succeeded', 'failed' or 'abandoned'.
    status          text        NOT NULL DEFAULT 'open'
                                CHECK (status IN ('open', 'succeeded', 'failed', 'abandoned')),
    evidence        jsonb       NULL,
    created_at      timestamptz NOT NULL DEFAULT now(),
    last_active_at  timestamptz NOT NULL DEFAULT now(),
    closed_at       timestamptz NULL CHECK ((status = 'open') = (closed_at IS NULL))
);

CREATE INDEX tasks_tenant_created ON tasks (tenant_id, created_at DESC);
CREATE INDEX tasks_open ON tasks (last_active_at) WHERE status = 'open';
CREATE INDEX tasks_session ON tasks (session_id) WHERE session_id IS NOT NULL;

-- The SLO class a request ran under and whether it met its targets (TTFT and mean
-- inter-token latency); NULL for rows written before this migration and for refusals.
ALTER TABLE requests ADD COLUMN slo_class text NULL;
ALTER TABLE requests ADD COLUMN slo_met boolean NULL;
