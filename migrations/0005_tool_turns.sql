-- Tool calls in sessions: an answer that calls tools is followed by the tools' results, each a
-- turn of its own (role 'tool') naming the call it answers.
ALTER TABLE turns DROP CONSTRAINT turns_role_check;
ALTER TABLE turns ADD CONSTRAINT turns_role_check CHECK (role IN ('user', 'assistant', 'tool'));
ALTER TABLE turns ADD COLUMN tool_call_id text NULL CHECK (length(tool_call_id) BETWEEN 1 AND 200);
