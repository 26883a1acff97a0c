-- The ledger opens a request's row when the engine admits it (status 'running') and keeps it
-- current while tokens stream (every few dozen output tokens); the row's final state replaces it
-- at the end. A process killed mid-stream leaves the row with what was streamed, marked
-- 'interrupted' once it has not moved for a while. A final row is never replaced (the ledger's
-- inserts stay idempotent on the request id).
ALTER TABLE requests ADD COLUMN updated_at timestamptz NOT NULL DEFAULT now();
CREATE INDEX requests_running ON requests (updated_at) WHERE status = 'running';
