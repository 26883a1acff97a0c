//! cachet-tenants: tenants, plans and prices, JWT verification, and the Postgres store of
//! everything a tenant owns.
//!
//! - The domain: typed ids ([`TenantId`], [`RepoId`], [`SessionId`], [`TaskId`],
//!   [`RequestId`]), the words rows store ([`Endpoint`], [`RequestStatus`], …), [`Plan`] with its [`Prices`] and
//!   [`RateLimits`], [`Tenant`], and the ledger's [`UsageRecord`].
//! - [`jwt`]: bearer tokens (HS256, RS256, EdDSA) carrying the tenant id.
//! - [`store`]: the Postgres [`store::Store`] (sqlx) and its migrations (`migrations/`): tenants,
//!   repositories, sessions and turns, tasks, the usage ledger, webhook deliveries, invalidations.
//! - [`report`]: usage reports and cost per successful task.
//! - [`cluster`]: a private Postgres cluster from the machine's binaries, for `cachet serve`
//!   without a `DATABASE_URL` and for tests.
//!
//! ```
//! use std::time::Duration;
//! use cachet_tenants::jwt::{Jwt, JwtConfig, Role};
//! use cachet_tenants::{Plan, Secret, TenantId};
//!
//! let cfg = JwtConfig { hs256_secret: Some(Secret::new("a long random secret of 32+ bytes")), ..JwtConfig::default() };
//! let jwt = Jwt::new(&cfg).unwrap();
//! let tenant = TenantId::random();
//! let token = jwt.issue(tenant, Duration::from_secs(3600)).unwrap();
//! let claims = jwt.verify(&token).unwrap();
//! assert_eq!((claims.role, claims.tenant), (Role::Tenant, Some(tenant)));
//!
//! // What one request costs: 2,000 prompt tokens of which 1,500 came from the prefix cache.
//! let usd = Plan::default().cost(500, 1_500, 200, 0.0);
//! assert!(usd > 0.0);
//! ```

pub mod cluster;
mod ids;
pub mod jwt;
mod model;
pub mod report;
mod secret;
pub mod store;
mod words;

pub use ids::{ParseIdError, ParseTenantIdError, RepoId, RequestId, SessionId, TaskId, TenantId};
pub use model::{Plan, Prices, RateLimits, Tenant, UsageRecord, DEFAULT_PLAN};
pub use secret::{random_hex, Secret};
pub use store::{Store, StoreError};
pub use words::{Endpoint, FinishReason, RequestStatus, SloClass, UnknownWord};
