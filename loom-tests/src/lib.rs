//! # bypass-loom-tests
//!
//! loom models of the production concurrency code, compiled with `RUSTFLAGS="--cfg loom"`
//! through each crate's `sync` shim, so loom explores the interleavings of the real code, not of
//! a copy. Without `--cfg loom` every test file compiles to nothing (each starts with
//! `#![cfg(loom)]`), so `cargo test --workspace` is unaffected.
//!
//! | file | code under test | what the models prove |
//! |---|---|---|
//! | `tests/tx_ctx.rs` | `bypass::tx_ctx::TxSlab` | a send context is released exactly once and its completion delivered exactly once, whatever order the send completion, ACK, response, timeout and flush arrive in on different threads; stale handles are rejected, even once the slot is live again; a claim winner keeps its context until `end_claim`, even with the slot's next user waiting |
//! | `tests/req_table.rs` | `bypass::req_table::ReqTable` | a response (or `peek`) reaches only the request it belongs to, across wrapping ids in a shared slot; `complete` / `cancel` / `cancel_all` take a request exactly once |
//! | `tests/slab.rs` | the free list, through `TxSlab` and `bypass::buf_pool::BufPool` | get / put from several threads never hands one slot or buffer to two holders nor loses one (ABA included); a token is recovered once |
//! | `tests/credits.rs` | `bypass::credits::Credits` | credits never go negative or above the limit, every take is returned; a blocked `take_wait` is woken by `give` |
//! | `tests/rings.rs` | the sim's rings and doorbells | see that file |
//! | `tests/virtqueue.rs` | `bypass_hal::vfio::virtqueue::SplitQueue` and the software device | chains published on a split virtqueue reach the device whole (descriptors and buffer bytes), used elements reach the driver whole, through a full ring |
//! | `tests/shm_ring.rs` | the sim's shared-memory ring (`sim/src/shm/ring.rs`) | frames cross a full ring once, in order, intact; a sleeping consumer and a waiting producer are never left without their wake-up |
//! | `tests/wake.rs` | the sim's held-ACK handshake and device work-flag loop (`sim/src/wake.rs`) | an ACK held back for the device's next pass is always sent while its peer's user arms a CQ to sleep, by the holder or by the arm's release |
//!
//! Every model has a **broken twin**: the same model with one deliberate bug switched on in the
//! production code through the loom-only mutation switch (`bypass::mutation`, which does not
//! exist in normal builds). Twins are `#[should_panic]`: they prove the model can fail.
//!
//! How to run the suite (as CI does), one model with more preemptions, how to replay a failure
//! and how to add a model: `loom-tests/README.md`.
//!
//! This library holds the harness the test files share (compiled only under `cfg(loom)`):
//! `check` runs a model and `check_mutant` a broken twin, each with a `Bound` on the preemptions
//! loom explores. Both serialize on a process-wide lock: a mutant is a global switch, so a
//! correct model must never run while a twin's mutant is on.

#[cfg(loom)]
pub use harness::*;

#[cfg(loom)]
mod harness {
    use std::sync::{Mutex, MutexGuard, PoisonError};

    pub use bypass::mutation::Mutant;

    /// How many preemptions loom explores per execution of a model.
    ///
    /// `LOOM_MAX_PREEMPTIONS` sets the suite-wide bound (CI: 2; unset: no bound, every
    /// interleaving); a model may raise it where that stays cheap.
    #[derive(Debug, Clone, Copy, PartialEq, Eq)]
    pub enum Bound {
        /// `LOOM_MAX_PREEMPTIONS` as set.
        Env,
        /// At least this many, or more if `LOOM_MAX_PREEMPTIONS` says so (unset: no bound).
        AtLeast(usize),
        /// No bound: every interleaving loom's reduction distinguishes, whatever the variable says.
        Exhaustive,
    }

    /// Held while a model runs: the mutation switch is process-wide and the test harness runs
    /// tests on several threads, so models of one test binary take turns.
    static SERIAL: Mutex<()> = Mutex::new(());

    fn serial() -> MutexGuard<'static, ()> {
        // A twin panics on purpose while holding the lock; the lock guards no data.
        SERIAL.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// `loom::model` with the preemption bound adjusted: the same builder (every `LOOM_*`
    /// variable applies) and the same logging (`LOOM_LOG`).
    fn run<F>(bound: Bound, model: F)
    where
        F: Fn() + Sync + Send + 'static,
    {
        let mut builder = loom::model::Builder::new();
        builder.preemption_bound = match (bound, builder.preemption_bound) {
            (Bound::Env, env) => env,
            (Bound::AtLeast(min), Some(env)) => Some(env.max(min)),
            (Bound::AtLeast(_), None) | (Bound::Exhaustive, _) => None,
        };
        let subscriber = tracing_subscriber::fmt::Subscriber::builder()
            .with_env_filter(tracing_subscriber::EnvFilter::from_env("LOOM_LOG"))
            .with_test_writer()
            .without_time()
            .finish();
        tracing::subscriber::with_default(subscriber, || builder.check(model));
    }

    /// Runs `model` under loom, exploring its interleavings up to `bound`, with no mutant on.
    pub fn check<F>(bound: Bound, model: F)
    where
        F: Fn() + Sync + Send + 'static,
    {
        let _serial = serial();
        run(bound, model);
    }

    /// Runs `model` under loom with `mutant` switched on in the production code: a broken twin
    /// (use the same `bound` as the correct model). The twin's test is `#[should_panic]`; the
    /// mutant is switched off again even when the model panics.
    pub fn check_mutant<F>(mutant: Mutant, bound: Bound, model: F)
    where
        F: Fn() + Sync + Send + 'static,
    {
        let _serial = serial();
        let _mutant = bypass::mutation::set(mutant);
        run(bound, model);
    }

    /// [`check_mutant`] for a mutant of the hal (`bypass_hal::mutation`).
    pub fn check_hal_mutant<F>(mutant: bypass_hal::mutation::Mutant, bound: Bound, model: F)
    where
        F: Fn() + Sync + Send + 'static,
    {
        let _serial = serial();
        let _mutant = bypass_hal::mutation::set(mutant);
        run(bound, model);
    }
}
