//! Model-based test: random sequences of claims, completions, releases, extensions, clock moves,
//! reopens, crashes (process, power loss, torn tail) and failing writes or fsyncs, checked step by step
//! against the in-memory reference model in `idemlog::model`. After every crash every acknowledged
//! operation must be present, and an operation whose I/O failed must be entirely there or entirely
//! absent.

use idemlog::model::{Simulation, Step};
use proptest::prelude::*;

fn step() -> impl Strategy<Value = Step> {
    prop_oneof![
        6 => (any::<u8>(), any::<u8>(), 0u8..3, any::<u8>())
            .prop_map(|(scope, key, fp, ttl)| Step::Claim { scope, key, fp, ttl }),
        4 => (any::<u8>(), prop::sample::select(vec![200u16, 201, 400, 422]), any::<u8>(), any::<bool>())
            .prop_map(|(token, status, body_len, side)| Step::Complete { token, status, body_len, side }),
        1 => any::<u8>().prop_map(|token| Step::Release { token }),
        1 => any::<u8>().prop_map(|token| Step::Extend { token }),
        2 => (any::<u8>(), any::<u8>()).prop_map(|(scope, key)| Step::Get { scope, key }),
        2 => (0u32..20_000).prop_map(|ms| Step::Advance { ms }),
        1 => Just(Step::Reopen),
        1 => any::<u64>().prop_map(|mode| Step::Crash { mode: mode % 8 }),
        1 => Just(Step::FailSync),
        1 => Just(Step::FailWrite),
    ]
}

fn run(steps: &[Step], segment_size: u32) -> Result<(), TestCaseError> {
    let mut sim = Simulation::new(segment_size);
    for (i, step) in steps.iter().enumerate() {
        sim.run(step)
            .map_err(|e| TestCaseError::fail(format!("step {i} {step:?}: {e}")))?;
    }
    sim.run(&Step::Crash { mode: 1 })
        .map_err(|e| TestCaseError::fail(format!("final power loss: {e}")))?;
    Ok(())
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 512, ..ProptestConfig::default() })]

    #[test]
    fn store_matches_model_through_crashes_and_faults(steps in prop::collection::vec(step(), 1..120)) {
        run(&steps, 4096)?;
    }

    #[test]
    fn store_matches_model_with_large_segments(steps in prop::collection::vec(step(), 1..120)) {
        run(&steps, 1 << 20)?;
    }
}

#[test]
fn decoded_byte_sequences_run_against_the_model() {
    // The fuzz target's entry point, on a few fixed inputs.
    for seed in 0u8..64 {
        let bytes: Vec<u8> = (0..200u32)
            .map(|i| (i as u8).wrapping_mul(seed).wrapping_add(seed))
            .collect();
        let mut sim = Simulation::default();
        for step in Step::decode_all(&bytes) {
            sim.run(&step)
                .unwrap_or_else(|e| panic!("seed {seed} {step:?}: {e}"));
        }
    }
}
