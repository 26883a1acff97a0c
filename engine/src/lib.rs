//! cachet-engine: cachet's inference engine.
