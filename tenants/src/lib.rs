//! cachet-tenants: tenants, plans and prices, JWT verification, and the Postgres
//! store of everything a tenant owns.
//!
//! Not built yet: see "The service" issue. The crate exists so the workspace
//! layout of `DESIGN.md` is in place from the start.
