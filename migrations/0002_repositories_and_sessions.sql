-- Repositories, sessions and their turns, webhook deliveries and cache invalidations.

CREATE TABLE repositories (
    id              uuid        PRIMARY KEY,
    tenant_id       uuid        NOT NULL REFERENCES tenants (id),
    name            text        NOT NULL CHECK (length(name) BETWEEN 1 AND 200),
    -- What the tenant registered: a clone URL or a local path under the allowed root.
    source          text        NOT NULL CHECK (source <> ''),
    default_branch  text        NOT NULL CHECK (default_branch <> ''),
    -- The HMAC key of the repository's push webhook. It must be readable to verify a
    -- signature, so it is stored as given out (like the git hosts that send the webhooks).
    webhook_secret  text        NOT NULL CHECK (length(webhook_secret) >= 32),
    -- How the context is built: budget, file rules (cachet_context options as JSON).
    options         jsonb       NOT NULL DEFAULT '{}' CHECK (jsonb_typeof(options) = 'object'),
    created_at      timestamptz NOT NULL DEFAULT now(),
    deleted_at      timestamptz NULL CHECK (deleted_at >= created_at)
);

CREATE UNIQUE INDEX repositories_live_name ON repositories (tenant_id, name) WHERE deleted_at IS NULL;

CREATE TABLE sessions (
    id              uuid        PRIMARY KEY,
    tenant_id       uuid        NOT NULL REFERENCES tenants (id),
    repo_id         uuid        NOT NULL REFERENCES repositories (id),
    branch          text        NOT NULL CHECK (branch <> ''),
    created_at      timestamptz NOT NULL DEFAULT now(),
    last_active_at  timestamptz NOT NULL DEFAULT now(),
    -- Set by DELETE /v1/sessions/{id} or when the session idles out.
    closed_at       timestamptz NULL
);

CREATE INDEX sessions_tenant ON sessions (tenant_id, created_at DESC);
CREATE INDEX sessions_open_by_branch ON sessions (repo_id, branch) WHERE closed_at IS NULL;

-- A session's history, append-only: user turns as assembled (named files, tool output,
-- question), assistant turns as generated.
CREATE TABLE turns (
    session_id      uuid        NOT NULL REFERENCES sessions (id),
    seq             integer     NOT NULL CHECK (seq >= 0),
    role            text        NOT NULL CHECK (role IN ('user', 'assistant')),
    content         text        NOT NULL,
    -- Assistant turns: the token ids exactly as generated, so the next prompt repeats them
    -- (and hits the cache) instead of a re-tokenization that may differ.
    tokens          integer[]   NULL,
    -- The model that generated an assistant turn (its tokens are reused only for that model).
    model           text        NULL,
    -- User turns: the commit the repository context was built at.
    commit          text        NULL,
    request_id      uuid        NULL,
    created_at      timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (session_id, seq)
);

-- Webhook deliveries seen, so that a redelivered one is acknowledged and not applied twice.
CREATE TABLE webhook_deliveries (
    repo_id         uuid        NOT NULL REFERENCES repositories (id),
    delivery_id     text        NOT NULL CHECK (length(delivery_id) BETWEEN 1 AND 200),
    event           text        NOT NULL,
    received_at     timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (repo_id, delivery_id)
);

-- What each push invalidated.
CREATE TABLE invalidations (
    id              bigserial   PRIMARY KEY,
    repo_id         uuid        NOT NULL REFERENCES repositories (id),
    delivery_id     text        NOT NULL,
    ref             text        NOT NULL,
    before          text        NOT NULL,
    after           text        NOT NULL,
    paths           text[]      NOT NULL,
    evicted_tokens  bigint      NOT NULL CHECK (evicted_tokens >= 0),
    prewarmed       integer     NOT NULL CHECK (prewarmed >= 0),
    created_at      timestamptz NOT NULL DEFAULT now()
);

CREATE INDEX invalidations_repo ON invalidations (repo_id, created_at DESC);
