-- One-time sign-in links for the report page: a tenant (or the operator) asks for a link with its
-- bearer token and opens it in a browser, which exchanges the code once for a session cookie.
-- Only the code's SHA-256 is stored; a code is good once, until it expires.
CREATE TABLE sign_in_codes (
    code_sha256 bytea PRIMARY KEY CHECK (length(code_sha256) = 32),
    -- NULL: the operator's link.
    tenant_id uuid NULL REFERENCES tenants (id) ON DELETE CASCADE,
    created_at timestamptz NOT NULL DEFAULT now(),
    expires_at timestamptz NOT NULL,
    used_at timestamptz NULL
);
CREATE INDEX sign_in_codes_expires ON sign_in_codes (expires_at);
