//! Choosing the next token from logits: penalties, then greedy or
//! temperature sampling with top-k, top-p and min-p, from a seeded generator
//! so that a seed reproduces a completion exactly.

use std::collections::HashMap;

/// Sampling parameters of one request.
#[derive(Clone, Debug, PartialEq)]
pub struct SamplingParams {
    /// 0 means greedy (argmax).
    pub temperature: f32,
    /// Keep the `top_k` most likely tokens; 0 keeps all.
    pub top_k: usize,
    /// Keep the smallest set of tokens whose probability reaches `top_p`.
    pub top_p: f32,
    /// Drop tokens less likely than `min_p` × the most likely one.
    pub min_p: f32,
    /// Hugging Face style: logits of tokens seen in the prompt or output are
    /// divided (if positive) or multiplied (if negative) by this; 1 is off.
    pub repetition_penalty: f32,
    /// OpenAI style: subtracted once from every token already generated.
    pub presence_penalty: f32,
    /// OpenAI style: subtracted per occurrence in the generated text.
    pub frequency_penalty: f32,
    /// Seed of the random generator; `None` draws one.
    pub seed: Option<u64>,
    /// Added to these tokens' logits before anything else (OpenAI's `logit_bias`).
    pub logit_bias: Vec<(u32, f32)>,
}

impl Default for SamplingParams {
    fn default() -> Self {
        SamplingParams {
            temperature: 0.0,
            top_k: 0,
            top_p: 1.0,
            min_p: 0.0,
            repetition_penalty: 1.0,
            presence_penalty: 0.0,
            frequency_penalty: 0.0,
            seed: None,
            logit_bias: Vec::new(),
        }
    }
}

/// A sampling parameter out of range; the message names it.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("{0}")]
pub struct SamplingError(pub String);

impl SamplingParams {
    /// Checks every parameter's range; the message names the bad one.
    pub fn validate(&self) -> Result<(), SamplingError> {
        let check = |ok: bool, msg: &str| if ok { Ok(()) } else { Err(SamplingError(msg.to_string())) };
        check(
            self.temperature.is_finite() && (0.0..=100.0).contains(&self.temperature),
            "temperature must be in [0, 100]",
        )?;
        check(self.top_p.is_finite() && self.top_p > 0.0 && self.top_p <= 1.0, "top_p must be in (0, 1]")?;
        check(self.min_p.is_finite() && (0.0..=1.0).contains(&self.min_p), "min_p must be in [0, 1]")?;
        check(
            self.repetition_penalty.is_finite() && self.repetition_penalty > 0.0 && self.repetition_penalty <= 10.0,
            "repetition_penalty must be in (0, 10]",
        )?;
        check(
            self.presence_penalty.is_finite() && self.presence_penalty.abs() <= 2.0,
            "presence_penalty must be in [-2, 2]",
        )?;
        check(
            self.frequency_penalty.is_finite() && self.frequency_penalty.abs() <= 2.0,
            "frequency_penalty must be in [-2, 2]",
        )?;
        check(
            self.logit_bias.iter().all(|(_, b)| b.is_finite() && b.abs() <= 100.0),
            "logit_bias values must be in [-100, 100]",
        )
    }
}

/// xoshiro256** seeded through splitmix64: small, fast, and stable across
/// releases (a seed means the same stream forever).
#[derive(Clone, Debug)]
pub struct Rng([u64; 4]);

impl Rng {
    pub fn new(seed: u64) -> Rng {
        let mut z = seed;
        let mut next = || {
            z = z.wrapping_add(0x9E37_79B9_7F4A_7C15);
            let mut x = z;
            x = (x ^ (x >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
            x = (x ^ (x >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
            x ^ (x >> 31)
        };
        Rng([next(), next(), next(), next()])
    }

    pub fn next_u64(&mut self) -> u64 {
        let s = &mut self.0;
        let result = s[1].wrapping_mul(5).rotate_left(7).wrapping_mul(9);
        let t = s[1] << 17;
        s[2] ^= s[0];
        s[3] ^= s[1];
        s[1] ^= s[2];
        s[0] ^= s[3];
        s[2] ^= t;
        s[3] = s[3].rotate_left(45);
        result
    }

    /// Uniform in [0, 1).
    pub fn next_f64(&mut self) -> f64 {
        (self.next_u64() >> 11) as f64 * (1.0 / (1u64 << 53) as f64)
    }
}

/// Per-request sampler state.
#[derive(Clone, Debug)]
pub struct Sampler {
    params: SamplingParams,
    rng: Rng,
    /// Tokens of the prompt and the output (repetition penalty).
    seen: HashMap<u32, ()>,
    /// Occurrences in the output (presence/frequency penalties).
    generated: HashMap<u32, u32>,
    candidates: Vec<(u32, f32)>,
}

impl Sampler {
    /// A sampler for a request whose prompt is `prompt`.
    pub fn new(params: SamplingParams, prompt: &[u32]) -> Sampler {
        let seed = params.seed.unwrap_or_else(|| {
            use std::hash::{BuildHasher, Hasher};
            let mut h = std::collections::hash_map::RandomState::new().build_hasher();
            h.write_u128(
                std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_nanos()),
            );
            h.finish()
        });
        let seen =
            if params.repetition_penalty != 1.0 { prompt.iter().map(|&t| (t, ())).collect() } else { HashMap::new() };
        Sampler { params, rng: Rng::new(seed), seen, generated: HashMap::new(), candidates: Vec::new() }
    }

    /// The parameters.
    pub fn params(&self) -> &SamplingParams {
        &self.params
    }

    /// Picks the next token from `logits` (which it modifies) and records it.
    pub fn sample(&mut self, logits: &mut [f32]) -> u32 {
        self.adjust(logits);
        self.pick(logits)
    }

    /// The first half of [`Sampler::sample`]: `logit_bias`, then the penalties.
    pub fn adjust(&self, logits: &mut [f32]) {
        for &(t, bias) in &self.params.logit_bias {
            if let Some(l) = logits.get_mut(t as usize) {
                *l += bias;
            }
        }
        self.apply_penalties(logits);
    }

    /// The second half of [`Sampler::sample`]: temperature, top-k, top-p and
    /// min-p over adjusted `logits`, then the draw; records the token.
    pub fn pick(&mut self, logits: &[f32]) -> u32 {
        let token = if self.params.temperature == 0.0 { argmax(logits) } else { self.sample_random(logits) };
        self.accept(token);
        token
    }

    /// Records a token as generated (for the penalties).
    pub fn accept(&mut self, token: u32) {
        *self.generated.entry(token).or_insert(0) += 1;
        if self.params.repetition_penalty != 1.0 {
            self.seen.insert(token, ());
        }
    }

    fn apply_penalties(&self, logits: &mut [f32]) {
        let p = &self.params;
        if p.repetition_penalty != 1.0 {
            for &t in self.seen.keys() {
                if let Some(l) = logits.get_mut(t as usize) {
                    *l = if *l > 0.0 { *l / p.repetition_penalty } else { *l * p.repetition_penalty };
                }
            }
        }
        if p.presence_penalty != 0.0 || p.frequency_penalty != 0.0 {
            for (&t, &n) in &self.generated {
                if let Some(l) = logits.get_mut(t as usize) {
                    *l -= p.presence_penalty + p.frequency_penalty * n as f32;
                }
            }
        }
    }

    fn sample_random(&mut self, logits: &[f32]) -> u32 {
        let p = &self.params;
        let max = logits.iter().fold(f32::NEG_INFINITY, |m, &v| m.max(v));
        if !max.is_finite() {
            return argmax(logits);
        }
        let inv_t = 1.0 / p.temperature;
        // Unnormalised probabilities; the most likely token has weight 1.
        let c = &mut self.candidates;
        c.clear();
        c.extend(logits.iter().enumerate().map(|(i, &l)| (i as u32, ((l - max) * inv_t).exp())));
        let by_weight = |a: &(u32, f32), b: &(u32, f32)| b.1.total_cmp(&a.1).then(a.0.cmp(&b.0));
        if p.top_k > 0 && p.top_k < c.len() {
            c.select_nth_unstable_by(p.top_k - 1, by_weight);
            c.truncate(p.top_k);
        }
        if p.min_p > 0.0 {
            c.retain(|&(_, w)| w >= p.min_p);
        }
        if p.top_p < 1.0 {
            let total: f64 = c.iter().map(|&(_, w)| w as f64).sum();
            // Sort only as large a head as the mass needs.
            let mut k = c.len().min(64);
            loop {
                if k < c.len() {
                    c.select_nth_unstable_by(k - 1, by_weight);
                }
                c[..k].sort_unstable_by(by_weight);
                let mut cum = 0f64;
                let cut = c[..k].iter().position(|&(_, w)| {
                    cum += w as f64;
                    cum >= p.top_p as f64 * total
                });
                if let Some(i) = cut {
                    c.truncate(i + 1);
                    break;
                }
                if k == c.len() {
                    break;
                }
                k = (k * 4).min(c.len());
            }
        }
        let total: f64 = c.iter().map(|&(_, w)| w as f64).sum();
        let mut r = self.rng.next_f64() * total;
        for &(t, w) in c.iter() {
            r -= w as f64;
            if r < 0.0 {
                return t;
            }
        }
        c.last().map_or_else(|| argmax(logits), |&(t, _)| t)
    }
}

/// Index of the largest logit (the lowest index among ties).
/// Log-probabilities of one generated token: its own and its step's most
/// likely tokens', under the distribution the sampler drew from before
/// temperature, truncation (top-k/top-p/min-p) and any grammar mask, that is
/// the model's logits after `logit_bias` and the penalties.
#[derive(Clone, Debug, PartialEq)]
pub struct TokenLogprobs {
    pub logprob: f32,
    /// The most likely tokens, most likely first (ties: lower id first).
    pub top: Vec<(u32, f32)>,
}

/// The log of the sum of `exp(logits)`, and the `n` most likely tokens with their
/// log-probabilities. Non-finite logits have probability zero.
pub fn log_softmax_top(logits: &[f32], n: usize) -> (f32, Vec<(u32, f32)>) {
    let max = logits.iter().copied().filter(|l| l.is_finite()).fold(f32::NEG_INFINITY, f32::max);
    if !max.is_finite() {
        return (f32::NEG_INFINITY, Vec::new());
    }
    let sum: f64 = logits.iter().filter(|l| l.is_finite()).map(|&l| f64::from(l - max).exp()).sum();
    let lse = max + sum.ln() as f32;
    let mut top: Vec<(u32, f32)> = Vec::with_capacity(n + 1);
    if n > 0 {
        for (i, &l) in logits.iter().enumerate() {
            if !l.is_finite() || (top.len() == n && l <= top[n - 1].1) {
                continue;
            }
            let at = top.partition_point(|&(_, v)| v >= l);
            top.insert(at, (i as u32, l));
            top.truncate(n);
        }
    }
    (lse, top.into_iter().map(|(i, l)| (i, l - lse)).collect())
}

pub fn argmax(logits: &[f32]) -> u32 {
    let mut best = 0;
    for (i, &v) in logits.iter().enumerate() {
        if v > logits[best] {
            best = i;
        }
    }
    best as u32
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sampler(p: SamplingParams) -> Sampler {
        Sampler::new(p, &[])
    }

    #[test]
    fn greedy_takes_the_first_maximum() {
        let mut s = sampler(SamplingParams::default());
        assert_eq!(s.sample(&mut [0.1, 3.0, 3.0, -1.0]), 1);
    }

    #[test]
    fn same_seed_same_tokens() {
        let p = SamplingParams { temperature: 1.0, seed: Some(42), ..Default::default() };
        let logits: Vec<f32> = (0..1000).map(|i| ((i * 37 % 101) as f32) / 20.0).collect();
        let run = || {
            let mut s = sampler(p.clone());
            (0..50).map(|_| s.sample(&mut logits.clone())).collect::<Vec<_>>()
        };
        assert_eq!(run(), run());
        let other = {
            let mut s = sampler(SamplingParams { seed: Some(43), ..p.clone() });
            (0..50).map(|_| s.sample(&mut logits.clone())).collect::<Vec<_>>()
        };
        assert_ne!(run(), other);
    }

    #[test]
    fn top_k_one_is_greedy() {
        let p = SamplingParams { temperature: 5.0, top_k: 1, seed: Some(1), ..Default::default() };
        let mut s = sampler(p);
        for _ in 0..20 {
            assert_eq!(s.sample(&mut [0.0, 1.0, 0.5, 0.9]), 1);
        }
    }

    #[test]
    fn top_p_and_min_p_cut_the_tail() {
        // Probabilities ~ [0.5, 0.3, 0.2 spread over 1000 tiny tokens].
        let mut logits = vec![-20.0f32; 1002];
        logits[0] = 2.0;
        logits[1] = 1.5;
        let p = SamplingParams { temperature: 1.0, top_p: 0.9, seed: Some(7), ..Default::default() };
        let mut s = sampler(p);
        for _ in 0..200 {
            let t = s.sample(&mut logits.clone());
            assert!(t <= 1, "top_p sampled tail token {t}");
        }
        let p = SamplingParams { temperature: 1.0, min_p: 0.5, seed: Some(7), ..Default::default() };
        let mut s = sampler(p);
        for _ in 0..200 {
            assert!(s.sample(&mut logits.clone()) <= 1);
        }
    }

    #[test]
    fn sampling_follows_the_distribution() {
        let p = SamplingParams { temperature: 1.0, seed: Some(3), ..Default::default() };
        let mut s = sampler(p);
        let logits = [0f32, (3f32).ln()]; // p = [0.25, 0.75]
        let ones = (0..4000).filter(|_| s.sample(&mut logits.clone()) == 1).count();
        assert!((2800..3200).contains(&ones), "{ones}");
    }

    #[test]
    fn penalties() {
        let p = SamplingParams { frequency_penalty: 1.0, presence_penalty: 0.5, ..Default::default() };
        let mut s = sampler(p);
        assert_eq!(s.sample(&mut [1.0, 0.9]), 0);
        // Token 0 now costs 1.5: 1.0 - 1.5 < 0.9.
        assert_eq!(s.sample(&mut [1.0, 0.9]), 1);

        let p = SamplingParams { repetition_penalty: 2.0, ..Default::default() };
        let mut s = Sampler::new(p, &[0]);
        // 1.0 / 2 = 0.5 < 0.9.
        assert_eq!(s.sample(&mut [1.0, 0.9]), 1);
        let mut l = [-1.0, -1.5];
        s.apply_penalties(&mut l);
        assert_eq!(l, [-2.0, -3.0]);
    }

    #[test]
    fn logit_bias_moves_tokens_before_sampling() {
        let p = SamplingParams { logit_bias: vec![(2, 5.0), (0, -100.0)], ..Default::default() };
        let mut s = sampler(p);
        assert_eq!(s.sample(&mut [3.0, 1.0, 0.0]), 2, "0 + 5 beats 3 - 100 and 1");
        let bad = SamplingParams { logit_bias: vec![(1, 101.0)], ..Default::default() };
        assert!(bad.validate().unwrap_err().0.contains("logit_bias"));
    }

    #[test]
    fn log_softmax_top_matches_the_definition() {
        let logits = [1.0f32, 3.0, f32::NEG_INFINITY, 3.0, -2.0];
        let (lse, top) = log_softmax_top(&logits, 3);
        let sum: f32 = [1.0f32, 3.0, 3.0, -2.0].iter().map(|l| l.exp()).sum();
        assert!((lse - sum.ln()).abs() < 1e-5);
        assert_eq!(top.iter().map(|t| t.0).collect::<Vec<_>>(), [1, 3, 0], "ties: lower id first");
        let p: f32 = top.iter().map(|t| t.1.exp()).sum::<f32>() + (-2.0f32 - lse).exp();
        assert!((p - 1.0).abs() < 1e-5, "probabilities sum to one: {p}");
        assert!(log_softmax_top(&logits, 0).1.is_empty());
        assert_eq!(log_softmax_top(&[f32::NEG_INFINITY; 3], 2), (f32::NEG_INFINITY, vec![]));
    }

    #[test]
    fn validation_names_the_parameter() {
        let bad = SamplingParams { top_p: 0.0, ..Default::default() };
        assert!(bad.validate().unwrap_err().0.contains("top_p"));
        let bad = SamplingParams { temperature: f32::NAN, ..Default::default() };
        assert!(bad.validate().unwrap_err().0.contains("temperature"));
        SamplingParams::default().validate().unwrap();
    }
}
