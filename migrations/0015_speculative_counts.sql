-- Speculative decoding: a request's ledger row counts the tokens drafted into its passes and those
-- the model confirmed (output tokens that took no pass of their own; output_tokens counts them once).
ALTER TABLE requests ADD COLUMN drafted_tokens BIGINT NOT NULL DEFAULT 0,
    ADD COLUMN accepted_tokens BIGINT NOT NULL DEFAULT 0;
ALTER TABLE requests ADD CONSTRAINT requests_speculative_counts_valid
    CHECK (drafted_tokens >= 0 AND accepted_tokens >= 0 AND accepted_tokens <= drafted_tokens) NOT VALID;
