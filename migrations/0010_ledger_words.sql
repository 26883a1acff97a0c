-- The ledger's words are closed sets, mapped to Rust enums (`cachet_tenants::{Endpoint,
-- RequestStatus, FinishReason, SloClass}`): a row with any other word could not be read back.
-- NOT VALID: enforced for every row written from now on, without rewriting or refusing the rows
-- an older server wrote (all of which used these words).
ALTER TABLE requests ADD CONSTRAINT requests_endpoint_known
    CHECK (endpoint IN ('chat.completions', 'completions', 'sessions.messages', 'responses')) NOT VALID;
ALTER TABLE requests ADD CONSTRAINT requests_status_known
    CHECK (status IN ('running', 'ok', 'cancelled', 'error', 'interrupted')) NOT VALID;
ALTER TABLE requests ADD CONSTRAINT requests_finish_reason_known
    CHECK (finish_reason IS NULL OR finish_reason IN ('stop', 'length')) NOT VALID;
ALTER TABLE requests ADD CONSTRAINT requests_slo_class_known
    CHECK (slo_class IS NULL OR slo_class IN ('interactive', 'batch')) NOT VALID;
