//! The scheduler's time. Every decision it makes (admission, ordering, refusals, pacing) and
//! every time it reports (queue time, time to first token) reads [`Clock::now`]: the system's
//! monotonic clock in the engine, a clock that moves only when told in the scheduler's tests, so
//! they check waiting and deadlines without sleeping.

use std::time::{Duration, Instant};

#[derive(Clone, Copy, Debug)]
pub(crate) enum Clock {
    /// [`Instant::now`].
    System,
    /// Stands still until [`Clock::advance`].
    #[cfg_attr(not(test), allow(dead_code))]
    Manual(Instant),
}

impl Clock {
    pub(crate) fn now(&self) -> Instant {
        match self {
            Clock::System => Instant::now(),
            Clock::Manual(t) => *t,
        }
    }

    /// Moves a manual clock forward (a system clock moves by itself).
    #[cfg_attr(not(test), allow(dead_code))]
    pub(crate) fn advance(&mut self, by: Duration) {
        if let Clock::Manual(t) = self {
            *t += by;
        }
    }
}
