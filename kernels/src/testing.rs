//! Test support shared by every crate's tests and benchmarks: one small deterministic generator
//! for random inputs (weights, activations, token ids). Not for anything a user sees: the
//! benchmark's workload has its own generator with a stability promise (`cachet-bench`'s `Rng`).

/// A 64-bit linear congruential generator (Knuth's MMIX constants): the same stream on every
/// machine, for every seed, with no dependency.
#[derive(Clone, Debug)]
pub struct Lcg(pub u64);

impl Lcg {
    /// A generator seeded with `seed`.
    pub fn new(seed: u64) -> Lcg {
        Lcg(seed)
    }

    /// The next state.
    pub fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
        self.0
    }

    /// 32 random bits (the state's high half: an LCG's low bits are weak).
    pub fn next_u32(&mut self) -> u32 {
        (self.next_u64() >> 32) as u32
    }

    /// A uniform float in `[-1, 1)` (24 random bits).
    pub fn f(&mut self) -> f32 {
        ((self.next_u64() >> 40) as f32 / (1u64 << 24) as f32) * 2.0 - 1.0
    }

    /// `n` uniform floats in `[-scale, scale)`.
    pub fn vec(&mut self, n: usize, scale: f32) -> Vec<f32> {
        (0..n).map(|_| self.f() * scale).collect()
    }
}

#[cfg(test)]
mod tests {
    use super::Lcg;

    #[test]
    fn the_stream_is_fixed_and_floats_stay_in_range() {
        let mut a = Lcg::new(7);
        let mut b = Lcg::new(7);
        assert_eq!(a.vec(1000, 1.0), b.vec(1000, 1.0));
        // The stream itself is part of the contract: reference fixtures were drawn from it.
        assert_eq!(Lcg::new(0).next_u64(), 1442695040888963407);
        let v = Lcg::new(1).vec(10_000, 0.5);
        assert!(v.iter().all(|x| (-0.5..0.5).contains(x)));
        let mean = v.iter().sum::<f32>() / v.len() as f32;
        assert!(mean.abs() < 0.02, "{mean}");
    }
}
