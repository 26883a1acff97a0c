//! cachet-tests: integration tests that start the real `cachet` binary (see
//! `tests/tests/`). The library itself is empty.
