-- A ledger row says the finish reason its client saw: `tool_calls` for an answer that ended
-- with tool calls (the engine's `stop` after them), as OpenAI's API reports it.
ALTER TABLE requests DROP CONSTRAINT requests_finish_reason_known;
ALTER TABLE requests ADD CONSTRAINT requests_finish_reason_known
    CHECK (finish_reason IS NULL OR finish_reason IN ('stop', 'length', 'tool_calls')) NOT VALID;
