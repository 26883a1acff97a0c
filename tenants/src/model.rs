//! The tenant domain: plans with their prices and limits, tenants, and usage records.

use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};

use crate::ids::{RequestId, SessionId, TaskId, TenantId};
use crate::words::{Endpoint, FinishReason, RequestStatus, SloClass};

/// List prices in USD. Prompt tokens are priced per million, split into the ones the engine
/// computed and the ones it reused from the prefix cache; compute is priced per second.
#[derive(Clone, Copy, Debug, PartialEq, Serialize, Deserialize)]
pub struct Prices {
    /// USD per million prompt tokens that were computed (prefilled).
    pub prompt_per_mtok: f64,
    /// USD per million prompt tokens served from the prefix cache.
    pub cached_per_mtok: f64,
    /// USD per million generated tokens.
    pub output_per_mtok: f64,
    /// USD per second of engine compute attributed to the request.
    pub compute_per_second: f64,
}

/// Request and token rate limits of a plan; `None` means unlimited.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct RateLimits {
    /// Requests per minute.
    pub requests_per_minute: Option<u32>,
    /// Prompt plus output tokens per minute.
    pub tokens_per_minute: Option<u64>,
}

/// What a tenant pays and may use. A tenant row keeps a snapshot of its plan, so changing a
/// built-in plan never changes what an existing tenant was sold.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Plan {
    /// The plan's name, e.g. `"standard"`.
    pub name: String,
    /// List prices.
    pub prices: Prices,
    /// The fraction of the KV pool (0..=1) the tenant may keep cached when the pool is short.
    pub kv_share: f64,
    /// Rate limits.
    pub limits: RateLimits,
}

/// The name of the default plan.
pub const DEFAULT_PLAN: &str = "standard";

const LIST_PRICES: Prices =
    Prices { prompt_per_mtok: 0.10, cached_per_mtok: 0.01, output_per_mtok: 0.40, compute_per_second: 0.0 };

impl Plan {
    /// The built-in plans: `free` (low limits, a quarter of the KV pool), `standard` (the default:
    /// the whole pool, no limits) and `compute` (billed by engine seconds instead of tokens).
    /// `free` carries the list prices too, so the ledger shows what its requests would cost.
    pub fn builtin() -> Vec<Plan> {
        vec![
            Plan {
                name: "free".into(),
                prices: LIST_PRICES,
                kv_share: 0.25,
                limits: RateLimits { requests_per_minute: Some(20), tokens_per_minute: Some(40_000) },
            },
            Plan { name: DEFAULT_PLAN.into(), prices: LIST_PRICES, kv_share: 1.0, limits: RateLimits::default() },
            Plan {
                name: "compute".into(),
                prices: Prices {
                    prompt_per_mtok: 0.0,
                    cached_per_mtok: 0.0,
                    output_per_mtok: 0.0,
                    compute_per_second: 0.0005,
                },
                kv_share: 1.0,
                limits: RateLimits::default(),
            },
        ]
    }

    /// The built-in plan called `name`, if there is one.
    pub fn by_name(name: &str) -> Option<Plan> {
        Plan::builtin().into_iter().find(|plan| plan.name == name)
    }

    /// Checks that the share is within 0..=1 and every price is finite and non-negative.
    pub fn validate(&self) -> Result<(), String> {
        if self.name.trim().is_empty() {
            return Err("plan name is empty".into());
        }
        if !(0.0..=1.0).contains(&self.kv_share) {
            return Err(format!("plan {}: kv_share must be within 0..=1", self.name));
        }
        let p = &self.prices;
        for (what, price) in [
            ("prompt_per_mtok", p.prompt_per_mtok),
            ("cached_per_mtok", p.cached_per_mtok),
            ("output_per_mtok", p.output_per_mtok),
            ("compute_per_second", p.compute_per_second),
        ] {
            if !price.is_finite() || price < 0.0 {
                return Err(format!("plan {}: {what} must be finite and non-negative", self.name));
            }
        }
        Ok(())
    }

    /// The cost in USD of one request under this plan.
    pub fn cost(
        &self,
        computed_prompt_tokens: u64,
        cached_tokens: u64,
        output_tokens: u64,
        compute_seconds: f64,
    ) -> f64 {
        let p = &self.prices;
        let per_mtok = |tokens: u64, price: f64| tokens as f64 * price / 1_000_000.0;
        per_mtok(computed_prompt_tokens, p.prompt_per_mtok)
            + per_mtok(cached_tokens, p.cached_per_mtok)
            + per_mtok(output_tokens, p.output_per_mtok)
            + compute_seconds.max(0.0) * p.compute_per_second
    }
}

impl Default for Plan {
    fn default() -> Plan {
        Plan::by_name(DEFAULT_PLAN).expect("the default plan is built in")
    }
}

/// A tenant: everything it owns is scoped by its id.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Tenant {
    /// Its id.
    pub id: TenantId,
    /// Its name, unique among live tenants.
    pub name: String,
    /// A snapshot of its plan.
    pub plan: Plan,
    /// When it was created.
    pub created_at: DateTime<Utc>,
    /// When it was deleted (soft delete); `None` while live.
    pub deleted_at: Option<DateTime<Utc>>,
}

impl Tenant {
    /// Whether the tenant has not been deleted.
    pub fn is_live(&self) -> bool {
        self.deleted_at.is_none()
    }
}

/// One row of the usage ledger: a request with its tokens, timings and cost.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct UsageRecord {
    /// The request id: the idempotency key of the ledger.
    pub id: RequestId,
    /// The tenant that made the request.
    pub tenant: TenantId,
    /// The session the request belongs to, if any.
    pub session_id: Option<SessionId>,
    /// The task the request belongs to, if any.
    pub task_id: Option<TaskId>,
    /// The model that served it.
    pub model: String,
    /// The endpoint it came through.
    pub endpoint: Endpoint,
    /// Prompt tokens in total (cached plus computed).
    pub prompt_tokens: i64,
    /// Prompt tokens reused from the prefix cache.
    pub cached_tokens: i64,
    /// Prompt tokens the engine computed.
    pub computed_tokens: i64,
    /// Generated tokens.
    pub output_tokens: i64,
    /// Time spent waiting for admission, in milliseconds.
    pub queue_ms: f64,
    /// Time to the first output token, in milliseconds; `None` if none was produced.
    pub ttft_ms: Option<f64>,
    /// End-to-end latency, in milliseconds.
    pub e2e_ms: f64,
    /// Engine compute attributed to the request, in seconds.
    pub compute_seconds: f64,
    /// Its cost in USD under the tenant's plan.
    pub cost: f64,
    /// `running` while it streams, then how it ended.
    pub status: RequestStatus,
    /// Why generation stopped, if it did.
    pub finish_reason: Option<FinishReason>,
    /// When the request was received.
    pub created_at: DateTime<Utc>,
    /// The SLO class it ran under.
    #[serde(default)]
    pub slo_class: Option<SloClass>,
    /// Whether it met its class's TTFT and inter-token targets (`None`: no verdict, e.g. it failed
    /// before its first token).
    #[serde(default)]
    pub slo_met: Option<bool>,
    /// Time spent moving the prompt's K/V from another server before the engine took the request
    /// (a prefill server's computation and transfer, or a warm hand-off's fetch), in
    /// milliseconds; included in `ttft_ms` and `e2e_ms`. `None`: nothing moved.
    #[serde(default)]
    pub kv_transfer_ms: Option<f64>,
    /// Speculative decoding: tokens drafted into the request's passes, and those the model
    /// confirmed (output tokens that took no pass of their own; `output_tokens` counts them once).
    #[serde(default)]
    pub drafted_tokens: i64,
    #[serde(default)]
    pub accepted_tokens: i64,
}

impl UsageRecord {
    /// Checks what the ledger's constraints demand: non-negative counts, finite non-negative
    /// times and cost, a non-empty model.
    pub fn validate(&self) -> Result<(), String> {
        let id = self.id;
        for (what, value) in [
            ("prompt_tokens", self.prompt_tokens),
            ("cached_tokens", self.cached_tokens),
            ("computed_tokens", self.computed_tokens),
            ("output_tokens", self.output_tokens),
            ("drafted_tokens", self.drafted_tokens),
            ("accepted_tokens", self.accepted_tokens),
        ] {
            if value < 0 {
                return Err(format!("usage row {id}: {what} is negative"));
            }
        }
        for (what, value) in [
            ("queue_ms", Some(self.queue_ms)),
            ("ttft_ms", self.ttft_ms),
            ("e2e_ms", Some(self.e2e_ms)),
            ("compute_seconds", Some(self.compute_seconds)),
            ("cost", Some(self.cost)),
        ] {
            if value.is_some_and(|v| !v.is_finite() || v < 0.0) {
                return Err(format!("usage row {id}: {what} must be finite and non-negative"));
            }
        }
        if self.model.is_empty() {
            return Err(format!("usage row {id}: model is empty"));
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn builtin_plans_are_valid_and_standard_is_the_default() {
        let plans = Plan::builtin();
        for plan in &plans {
            plan.validate().unwrap();
        }
        let free = Plan::by_name("free").unwrap();
        assert_eq!(free.kv_share, 0.25);
        assert!(free.limits.requests_per_minute.is_some());
        let standard = Plan::default();
        assert_eq!(standard.name, "standard");
        assert_eq!(standard.kv_share, 1.0);
        assert_eq!(standard.limits, RateLimits::default());
    }

    #[test]
    fn cost_adds_up_each_part() {
        let plan = Plan {
            name: "t".into(),
            prices: Prices {
                prompt_per_mtok: 1.0,
                cached_per_mtok: 0.5,
                output_per_mtok: 4.0,
                compute_per_second: 0.25,
            },
            kv_share: 1.0,
            limits: RateLimits::default(),
        };
        assert_eq!(plan.cost(1_000_000, 0, 0, 0.0), 1.0);
        assert_eq!(plan.cost(0, 2_000_000, 0, 0.0), 1.0);
        assert_eq!(plan.cost(0, 0, 500_000, 0.0), 2.0);
        assert_eq!(plan.cost(0, 0, 0, 4.0), 1.0);
        assert_eq!(plan.cost(1_000_000, 2_000_000, 500_000, 4.0), 5.0);
        let standard = Plan::default();
        assert!(standard.cost(1000, 0, 0, 0.0) > standard.cost(0, 1000, 0, 0.0), "a cache hit is cheaper");
    }

    #[test]
    fn invalid_plans_are_rejected() {
        let plan = Plan { kv_share: 1.5, ..Plan::default() };
        assert!(plan.validate().is_err());
        let mut plan = Plan::default();
        plan.prices.output_per_mtok = f64::NAN;
        assert!(plan.validate().is_err());
    }
}
