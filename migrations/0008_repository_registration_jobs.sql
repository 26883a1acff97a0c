-- Registration is a job that outlives its HTTP request: the row is written first (so the name
-- is taken and the webhook secret kept before any network I/O), then the mirror is fetched and
-- the row marked 'ready' (with the default branch found) or 'failed' (with an error the tenant
-- may see). A job whose process died leaves 'fetching' with an old `updated_at`, and the
-- sweeper of any replica takes it up again. A failed registration keeps its row (the tenant
-- sees why) but not its name.
ALTER TABLE repositories
    ADD COLUMN status text NOT NULL DEFAULT 'ready' CHECK (status IN ('fetching', 'ready', 'failed')),
    ADD COLUMN error text NULL CHECK (length(error) <= 1000),
    ADD COLUMN updated_at timestamptz NOT NULL DEFAULT now(),
    -- Unknown until the mirror says which of main and master exists (unless the tenant named it).
    ALTER COLUMN default_branch DROP NOT NULL,
    ADD CONSTRAINT repositories_ready_has_branch CHECK (status <> 'ready' OR default_branch IS NOT NULL);

DROP INDEX repositories_live_name;
CREATE UNIQUE INDEX repositories_live_name ON repositories (tenant_id, name)
    WHERE deleted_at IS NULL AND status <> 'failed';
CREATE INDEX repositories_fetching ON repositories (updated_at) WHERE status = 'fetching' AND deleted_at IS NULL;
