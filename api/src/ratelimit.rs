//! Per-tenant rate limits from the tenant's plan: requests per minute and
//! tokens per minute (prompt plus requested output), as token buckets that
//! refill continuously.

use cachet_tenants::{RateLimits, TenantId};
use std::collections::HashMap;
use std::sync::Mutex;
use std::time::{Duration, Instant};

#[derive(Debug)]
struct Bucket {
    level: f64,
    at: Instant,
}

impl Bucket {
    /// Takes `amount` from a bucket of `per_minute` capacity, or says how
    /// long until it could.
    fn take(&mut self, amount: f64, per_minute: f64, now: Instant) -> Result<(), Duration> {
        let rate = per_minute / 60.0;
        self.level = (self.level + rate * now.duration_since(self.at).as_secs_f64()).min(per_minute);
        self.at = now;
        if amount > per_minute {
            return Err(Duration::from_secs(60));
        }
        if self.level >= amount {
            self.level -= amount;
            Ok(())
        } else {
            Err(Duration::from_secs_f64((amount - self.level) / rate))
        }
    }
}

/// The buckets of every tenant.
#[derive(Debug, Default)]
pub struct RateLimiter {
    buckets: Mutex<HashMap<(TenantId, bool), Bucket>>,
}

impl RateLimiter {
    /// Admits one request of `tokens` tokens, or returns what to tell the
    /// client and when to retry.
    pub fn check(&self, tenant: TenantId, limits: &RateLimits, tokens: u64) -> Result<(), (String, Duration)> {
        let now = Instant::now();
        let mut buckets = self.buckets.lock().unwrap_or_else(|e| e.into_inner());
        let mut take = |tokens_bucket: bool, amount: f64, per_minute: f64| {
            buckets
                .entry((tenant, tokens_bucket))
                .or_insert(Bucket { level: per_minute, at: now })
                .take(amount, per_minute, now)
        };
        if let Some(rpm) = limits.requests_per_minute {
            take(false, 1.0, rpm as f64)
                .map_err(|wait| (format!("rate limit: {rpm} requests per minute for this tenant's plan"), wait))?;
        }
        if let Some(tpm) = limits.tokens_per_minute {
            take(true, tokens as f64, tpm as f64)
                .map_err(|wait| (format!("rate limit: {tpm} tokens per minute for this tenant's plan"), wait))?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn buckets_limit_and_refill() {
        let mut b = Bucket { level: 2.0, at: Instant::now() };
        let t0 = b.at;
        assert!(b.take(1.0, 2.0, t0).is_ok());
        assert!(b.take(1.0, 2.0, t0).is_ok());
        let wait = b.take(1.0, 2.0, t0).unwrap_err();
        assert!((wait.as_secs_f64() - 30.0).abs() < 1e-6, "{wait:?}");
        assert!(b.take(1.0, 2.0, t0 + Duration::from_secs(31)).is_ok());
        assert_eq!(b.take(5.0, 2.0, t0).unwrap_err(), Duration::from_secs(60));
    }
}
