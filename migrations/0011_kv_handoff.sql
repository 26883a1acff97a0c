-- Warm hand-off between replicas: where each replica's KV disk tier can be read (the URL other
-- replicas reach it at, refreshed while it runs), and which replica last ran each session's
-- turn (the one a replica the session moves to fetches the session's prefix from).
CREATE TABLE replicas (
    id uuid PRIMARY KEY,
    kv_url text NOT NULL,
    seen_at timestamptz NOT NULL DEFAULT now()
);
ALTER TABLE sessions ADD COLUMN last_replica uuid NULL;
