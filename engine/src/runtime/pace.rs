//! Pacing prefill around decode: how long a forward pass of `n` tokens takes,
//! and so how many tokens a pass may carry while requests are decoding
//! without stretching their inter-token latency past its target.
//!
//! A pass costs about `fixed + n · per_token`: the fixed part (reading every
//! weight once, launching the layers) dominates decode, the per-token part
//! dominates prefill. Both are fitted online from the passes the engine runs
//! (least squares with exponential forgetting, so the fit follows the load:
//! long contexts make attention dearer per token). Chunking never changes a
//! request's output (batch invariance), so pacing only moves time around:
//! decoders keep their rhythm, a long prompt arrives in smaller chunks.

use super::Engine;
use cachet_kernels::backend::Backend;
use std::time::Duration;

/// Weight of the past per observed pass: about the last 1 / (1 − λ) = 20
/// passes count.
const FORGET: f64 = 0.95;

/// Online fit of pass time against pass size.
#[derive(Clone, Debug, Default)]
pub(crate) struct PassModel {
    w: f64,
    n: f64,
    nn: f64,
    t: f64,
    nt: f64,
}

impl PassModel {
    /// Records a pass of `tokens` tokens that took `secs`.
    pub fn observe(&mut self, tokens: usize, secs: f64) {
        if tokens == 0 || !secs.is_finite() || secs < 0.0 {
            return;
        }
        let n = tokens as f64;
        self.w = self.w * FORGET + 1.0;
        self.n = self.n * FORGET + n;
        self.nn = self.nn * FORGET + n * n;
        self.t = self.t * FORGET + secs;
        self.nt = self.nt * FORGET + n * secs;
    }

    /// `(fixed seconds, seconds per token)`, or None before any pass.
    /// When the passes seen so far were (nearly) all of one size the two
    /// cannot be told apart; the whole cost is then taken as per-token,
    /// which over-estimates big passes and so errs towards smaller chunks.
    pub fn fit(&self) -> Option<(f64, f64)> {
        if self.w <= 0.0 || self.n <= 0.0 {
            return None;
        }
        let proportional = (0.0, self.t / self.n);
        let mean = self.n / self.w;
        let var = self.nn / self.w - mean * mean;
        // Sizes must differ by a few tokens on average before the slope means anything.
        if var < 4.0 {
            return Some(proportional);
        }
        let slope = (self.nt / self.w - mean * self.t / self.w) / var;
        let fixed = self.t / self.w - slope * mean;
        if !(slope.is_finite() && slope > 0.0 && fixed.is_finite()) {
            return Some(proportional);
        }
        if fixed < 0.0 {
            // Noise can tilt the line below the origin; keep the slope
            // through the mean point, anchored at zero.
            return Some((0.0, self.t / self.n));
        }
        Some((fixed, slope))
    }

    /// Predicted seconds of a pass of `tokens` tokens.
    pub fn seconds(&self, tokens: usize) -> Option<f64> {
        self.fit().map(|(fixed, per)| fixed + per * tokens as f64)
    }

    /// The most tokens one pass can carry within `target`; None before any
    /// pass. Zero when even a one-token pass takes longer.
    pub fn tokens_within(&self, target: Duration) -> Option<usize> {
        let (fixed, per) = self.fit()?;
        let room = target.as_secs_f64() - fixed;
        if room <= 0.0 {
            return Some(0);
        }
        // The epsilon keeps an exact fit (250 ms at 5 ms a token) from rounding down.
        Some(((room / per + 1e-9).floor() as usize).max(1))
    }
}

impl<B: Backend> Engine<B> {
    /// Tokens the next pass may carry. Without decoding requests (or with
    /// pacing off) that is the configured token budget; while requests decode
    /// it is what fits in the tightest inter-token target among them, but
    /// never less than the decode tokens plus `min_prefill_chunk` (so prompts
    /// keep moving when the decoders alone fill the target) and never more
    /// than the token budget.
    pub(super) fn step_budget(&self) -> usize {
        let max = self.cfg.token_budget;
        if !self.cfg.pace_prefill {
            return max;
        }
        let decoding = self.running.iter().filter(|s| s.first_token.is_some() && s.remaining() == 1);
        let (count, itl) = decoding.fold((0usize, None::<Duration>), |(c, m), s| {
            let itl = self.cfg.targets(s.req.slo).itl;
            (c + 1, Some(m.map_or(itl, |m: Duration| m.min(itl))))
        });
        let Some(itl) = itl else { return max };
        let Some(fits) = self.pace.tokens_within(itl) else { return max };
        fits.max(count + self.cfg.min_prefill_chunk).min(max)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn recovers_a_linear_cost() {
        let mut m = PassModel::default();
        for i in 0..60 {
            let n = [1, 4, 64, 200, 512][i % 5];
            m.observe(n, 0.012 + 0.0025 * n as f64);
        }
        let (fixed, per) = m.fit().unwrap();
        assert!((fixed - 0.012).abs() < 1e-9, "{fixed}");
        assert!((per - 0.0025).abs() < 1e-12, "{per}");
        // (0.25 − 0.012) / 0.0025 = 95.2
        assert_eq!(m.tokens_within(Duration::from_millis(250)), Some(95));
        assert_eq!(m.tokens_within(Duration::from_millis(10)), Some(0));
    }

    #[test]
    fn one_size_only_is_taken_as_per_token_cost() {
        let mut m = PassModel::default();
        assert_eq!(m.fit(), None);
        assert_eq!(m.tokens_within(Duration::from_secs(1)), None);
        for _ in 0..10 {
            m.observe(100, 0.5);
        }
        let (fixed, per) = m.fit().unwrap();
        assert_eq!(fixed, 0.0);
        assert!((per - 0.005).abs() < 1e-12);
        assert_eq!(m.tokens_within(Duration::from_millis(250)), Some(50));
    }

    #[test]
    fn follows_a_change_of_speed() {
        let mut m = PassModel::default();
        for i in 0..100 {
            let n = [1, 300][i % 2];
            m.observe(n, 0.01 + 0.001 * n as f64);
        }
        // Attention over long contexts makes every token three times dearer.
        for i in 0..100 {
            let n = [1, 300][i % 2];
            m.observe(n, 0.01 + 0.003 * n as f64);
        }
        let per = m.fit().unwrap().1;
        assert!((per - 0.003).abs() < 1e-4, "{per}");
    }

    #[test]
    fn ignores_nonsense_and_never_goes_below_zero() {
        let mut m = PassModel::default();
        m.observe(0, 1.0);
        m.observe(10, f64::NAN);
        m.observe(10, -1.0);
        assert_eq!(m.fit(), None);
        // Bigger passes that happen to be faster: no negative slope.
        m.observe(1, 0.5);
        m.observe(100, 0.1);
        let (fixed, per) = m.fit().unwrap();
        assert!(fixed >= 0.0 && per > 0.0);
    }

    /// The engine itself (no thread), stepped by hand, with a made-up pass
    /// cost so the chunk sizes are exact.
    mod engine {
        use super::super::super::{request::Request, Engine, EngineConfig};
        use super::PassModel;
        use crate::generate::GenerateParams;
        use crate::kv_pool::PoolSize;
        use crate::radix::TenantKey;
        use crate::testing::{Tiny, TinyArch};
        use cachet_kernels::cpu::CpuBackend;
        use cachet_kernels::quant::DType;
        use std::time::Duration;

        fn engine(cfg: EngineConfig) -> Engine<CpuBackend> {
            let dir = tempfile::tempdir().unwrap();
            let path = dir.path().join("tiny.gguf");
            Tiny::random(TinyArch::Qwen2, 5, false).write_gguf(DType::Q8_0, &path).unwrap();
            let backend = CpuBackend::new(1).unwrap();
            let loaded = crate::loader::load(&path, &backend).unwrap();
            Engine::build(backend, loaded, cfg).unwrap().0
        }

        fn cfg() -> EngineConfig {
            EngineConfig {
                pool: PoolSize::Tokens(4096),
                overload_factor: 0.0,
                min_prefill_chunk: 8,
                interactive: crate::runtime::SloTargets {
                    ttft: Duration::from_secs(3),
                    itl: Duration::from_millis(250),
                },
                ..EngineConfig::default()
            }
        }

        /// 10 ms a pass plus 2 ms a token: 120 tokens fit in 250 ms.
        fn pass_cost() -> PassModel {
            let mut m = PassModel::default();
            for n in [1, 100, 1, 300] {
                m.observe(n, 0.010 + 0.002 * n as f64);
            }
            m
        }

        fn submit(e: &mut Engine<CpuBackend>, prompt: usize, max_tokens: usize) -> u64 {
            let params = GenerateParams { max_tokens, ignore_eos: true, ..Default::default() };
            let tokens = (0..prompt as u32).map(|i| (i * 7 + 3) % 300).collect();
            let (tx, rx) = tokio::sync::mpsc::unbounded_channel();
            std::mem::forget(rx);
            let id = e.next_id;
            e.submit(Request::new(TenantKey::new("t"), tokens, params), tx);
            id
        }

        fn computed(e: &Engine<CpuBackend>, id: u64) -> usize {
            e.running.iter().find(|s| s.id == id).map_or(0, |s| s.computed)
        }

        /// A decodes; B's 600-token prompt arrives; one step.
        fn chunk_next_to_a_decoder(cfg: EngineConfig, cost: PassModel) -> (usize, usize) {
            let mut e = engine(cfg);
            let a = submit(&mut e, 10, 1000);
            e.step();
            assert!(e.running[0].first_token.is_some(), "A decodes after one step");
            let b = submit(&mut e, 600, 4);
            e.pace = cost;
            let before = e.running[0].generated();
            e.step();
            assert_eq!(e.running.iter().find(|s| s.id == a).unwrap().generated(), before + 1, "A got its token");
            (computed(&e, b), e.step_budget())
        }

        #[test]
        fn a_prompt_next_to_a_decoder_comes_in_chunks_that_fit_the_inter_token_target() {
            let (chunk, _) = chunk_next_to_a_decoder(cfg(), pass_cost());
            // (250 − 10) / 2 = 120 tokens in the pass, one of them A's.
            assert_eq!(chunk, 119);
        }

        #[test]
        fn without_pacing_the_prompt_fills_the_token_budget() {
            let (chunk, budget) = chunk_next_to_a_decoder(EngineConfig { pace_prefill: false, ..cfg() }, pass_cost());
            assert_eq!(chunk, 511);
            assert_eq!(budget, 512);
        }

        #[test]
        fn when_decoders_alone_fill_the_target_prompts_still_move() {
            let mut slow = PassModel::default();
            for n in [1, 50, 1, 50] {
                slow.observe(n, 0.300 + 0.002 * n as f64);
            }
            let (chunk, _) = chunk_next_to_a_decoder(cfg(), slow);
            assert_eq!(chunk, 8, "min_prefill_chunk");
        }

        #[test]
        fn batch_decoders_allow_bigger_chunks_and_no_decoder_means_the_full_budget() {
            let batch = EngineConfig {
                interactive: crate::runtime::SloTargets { ttft: Duration::from_secs(3), itl: Duration::from_secs(1) },
                ..cfg()
            };
            let (chunk, _) = chunk_next_to_a_decoder(batch, pass_cost());
            assert_eq!(chunk, 494, "(1000 − 10) / 2 = 495 tokens, one of them A's");

            let mut e = engine(cfg());
            let b = submit(&mut e, 600, 4);
            e.pace = pass_cost();
            e.step();
            assert_eq!(computed(&e, b), 512);
        }
    }
}
