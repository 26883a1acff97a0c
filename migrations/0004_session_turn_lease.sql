-- One turn at a time per session, across replicas: the replica running a turn holds a lease
-- (renewed while the turn runs, so a replica that dies frees the session within a minute).
ALTER TABLE sessions ADD COLUMN turn_holder uuid NULL;
ALTER TABLE sessions ADD COLUMN turn_lease_until timestamptz NULL;
