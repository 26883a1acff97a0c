-- The part of a request's time to first token spent moving its prompt's K/V from another server
-- before the engine took it (prefill/decode disaggregation, warm hand-off), in milliseconds;
-- NULL when nothing moved. Included in ttft_ms and e2e_ms.
ALTER TABLE requests ADD COLUMN kv_transfer_ms double precision NULL
    CHECK (kv_transfer_ms >= 0 AND kv_transfer_ms <> 'NaN' AND kv_transfer_ms <> 'Infinity');
