//! A small deterministic random number generator (SplitMix64).
//!
//! The benchmark's promise is "same seed, same prompts, same arrival
//! schedule", across machines and dependency upgrades, so the generator is
//! written out here rather than taken from a crate whose output stream may
//! change between versions.

/// SplitMix64 (Steele, Lea and Flood, 2014): 64 bits of state, passes
/// BigCrush, more than enough for choosing files and arrival gaps.
#[derive(Clone, Debug)]
pub struct Rng {
    state: u64,
}

impl Rng {
    /// A generator seeded with `seed`.
    pub fn new(seed: u64) -> Rng {
        Rng { state: seed }
    }

    /// A generator for one named stream derived from `seed`, so that e.g. the
    /// arrival schedule does not shift when the prompt builder draws more numbers.
    pub fn derive(seed: u64, stream: &str) -> Rng {
        // FNV-1a of the stream name, mixed into the seed.
        let mut h: u64 = 0xcbf2_9ce4_8422_2325;
        for b in stream.bytes() {
            h ^= u64::from(b);
            h = h.wrapping_mul(0x0000_0100_0000_01b3);
        }
        let mut r = Rng::new(seed ^ h);
        r.next_u64();
        r
    }

    /// The next 64 random bits.
    pub fn next_u64(&mut self) -> u64 {
        self.state = self.state.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.state;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }

    /// A uniform float in `[0, 1)` (53 random bits).
    pub fn next_f64(&mut self) -> f64 {
        (self.next_u64() >> 11) as f64 / (1u64 << 53) as f64
    }

    /// A uniform index in `0..n`; `0` when `n` is `0`.
    pub fn below(&mut self, n: usize) -> usize {
        if n == 0 {
            return 0;
        }
        // Multiply-shift: negligible bias for the small `n` used here.
        ((u128::from(self.next_u64()) * n as u128) >> 64) as usize
    }

    /// An exponentially distributed float with the given mean (inverse CDF).
    pub fn exponential(&mut self, mean: f64) -> f64 {
        // 1 - u is in (0, 1], so the logarithm is finite.
        -mean * (1.0 - self.next_f64()).ln()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn same_seed_same_stream() {
        let a: Vec<u64> = (0..5).scan(Rng::new(7), |r, _| Some(r.next_u64())).collect();
        let b: Vec<u64> = (0..5).scan(Rng::new(7), |r, _| Some(r.next_u64())).collect();
        assert_eq!(a, b);
        let c: Vec<u64> = (0..5).scan(Rng::new(8), |r, _| Some(r.next_u64())).collect();
        assert_ne!(a, c);
    }

    #[test]
    fn floats_and_indexes_stay_in_range() {
        let mut r = Rng::derive(1, "x");
        for _ in 0..10_000 {
            let f = r.next_f64();
            assert!((0.0..1.0).contains(&f));
            assert!(r.below(7) < 7);
        }
        assert_eq!(r.below(0), 0);
    }
}
