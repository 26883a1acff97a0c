-- Public prefixes: prompt openings the operator declared public (an agent client's system prompt
-- and tool schemas, the same for all its users), so that every tenant's request that starts with
-- one reuses one cached computation of it. What is stored is what the operator gave (chat
-- messages and tools, text, or token ids); each server renders it through its own model's chat
-- template, the way a request is rendered. Nothing here is tenant data.
CREATE TABLE public_prefixes (
    id uuid PRIMARY KEY,
    name text NOT NULL UNIQUE CHECK (length(name) BETWEEN 1 AND 200),
    -- json, not jsonb: the text as given, keys in their order (a chat template renders tool
    -- schemas key by key, so an order changed by storage would render other tokens).
    source json NOT NULL,
    prewarm boolean NOT NULL DEFAULT true,
    created_at timestamptz NOT NULL DEFAULT now()
);
