-- Tenants and the usage ledger.

CREATE TABLE tenants (
    id          uuid        PRIMARY KEY,
    name        text        NOT NULL CHECK (length(name) BETWEEN 1 AND 200),
    -- A snapshot of the plan the tenant was sold (cachet_tenants::Plan as JSON).
    plan        jsonb       NOT NULL CHECK (jsonb_typeof(plan) = 'object'),
    created_at  timestamptz NOT NULL DEFAULT now(),
    -- Soft delete: the tenant's rows (the ledger) stay; its name becomes free again.
    deleted_at  timestamptz NULL CHECK (deleted_at >= created_at)
);

-- Names are unique among live tenants only.
CREATE UNIQUE INDEX tenants_live_name ON tenants (name) WHERE deleted_at IS NULL;

-- The usage ledger: one row per request, keyed by the request id (the idempotency key).
CREATE TABLE requests (
    id               uuid             PRIMARY KEY,
    tenant_id        uuid             NOT NULL REFERENCES tenants (id),
    -- Foreign keys to sessions and tasks arrive with those tables.
    session_id       uuid             NULL,
    task_id          uuid             NULL,
    model            text             NOT NULL CHECK (model <> ''),
    endpoint         text             NOT NULL CHECK (endpoint <> ''),
    prompt_tokens    bigint           NOT NULL CHECK (prompt_tokens >= 0),
    cached_tokens    bigint           NOT NULL CHECK (cached_tokens >= 0),
    computed_tokens  bigint           NOT NULL CHECK (computed_tokens >= 0),
    output_tokens    bigint           NOT NULL CHECK (output_tokens >= 0),
    -- 'NaN' compares greater than every number in Postgres, hence the explicit exclusions.
    queue_ms         double precision NOT NULL CHECK (queue_ms >= 0 AND queue_ms <> 'NaN'),
    ttft_ms          double precision NULL     CHECK (ttft_ms >= 0 AND ttft_ms <> 'NaN'),
    e2e_ms           double precision NOT NULL CHECK (e2e_ms >= 0 AND e2e_ms <> 'NaN'),
    compute_seconds  double precision NOT NULL CHECK (compute_seconds >= 0 AND compute_seconds <> 'NaN'),
    cost             double precision NOT NULL CHECK (cost >= 0 AND cost <> 'NaN'),
    -- 'ok', 'cancelled' or 'error' today; not an enum so that new outcomes need no migration.
    status           text             NOT NULL CHECK (status <> ''),
    finish_reason    text             NULL,
    created_at       timestamptz      NOT NULL DEFAULT now()
);

CREATE INDEX requests_tenant_created ON requests (tenant_id, created_at DESC);
CREATE INDEX requests_session ON requests (session_id) WHERE session_id IS NOT NULL;
CREATE INDEX requests_task ON requests (task_id) WHERE task_id IS NOT NULL;
