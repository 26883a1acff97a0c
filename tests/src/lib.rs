//! cachet-tests: integration tests of the whole service. The library itself is empty; the tests
//! are three binaries under `tests/tests/`:
//!
//! - `api` (`tests/api/main.rs`): the service's `Application` (what `cachet serve` runs) started
//!   in-process on a random port by `helpers::spawn_app`, each test with a fresh migrated database
//!   on one private Postgres cluster per binary, a tiny random-weight model written once, and real
//!   git repositories made in the test; requests go over HTTP as a client's would.
//! - `memory`: what a request can make the server hold (its own process, so the resident-memory
//!   high-water mark is its own).
//! - `fuzz_corpus`: every input of the fuzz corpora (`fuzz/corpus`) through the fuzz targets'
//!   entry points, so the corpus is a regression test in every run.
//!
//! The `cachet` binary itself (its CLI, `cachet serve` with its own private cluster, `kill -9`
//! mid-stream, its JSON logs) is tested in `api/tests/`.
