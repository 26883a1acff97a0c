-- A task may be opened by the server for a client's own run id (Codex's `session-id` header):
-- the requests of one agent run land in one task without the client knowing about tasks. One
-- task per (tenant, client session): the same id from two tenants names two tasks.
ALTER TABLE tasks ADD COLUMN client_session text NULL
    CHECK (client_session IS NULL OR length(client_session) BETWEEN 1 AND 200);
CREATE UNIQUE INDEX tasks_client_session ON tasks (tenant_id, client_session);
