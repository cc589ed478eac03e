//! The entry guard: every `extern "C"` function runs its body in [`guard`], so a Rust panic
//! never unwinds into C. A panic becomes the function's error value and a log line.

use std::panic::{catch_unwind, AssertUnwindSafe};

/// Runs `f`; if it panics, logs `name` and the panic message and returns `on_panic`.
pub fn guard<R>(name: &'static str, on_panic: R, f: impl FnOnce() -> R) -> R {
    match catch_unwind(AssertUnwindSafe(f)) {
        Ok(r) => r,
        Err(payload) => {
            let why = payload
                .downcast_ref::<&str>()
                .map(|s| s.to_string())
                .or_else(|| payload.downcast_ref::<String>().cloned())
                .unwrap_or_else(|| "unknown panic".into());
            // The log sink is the caller's code; do not let a second panic escape either.
            let _ = catch_unwind(AssertUnwindSafe(|| {
                crate::log!(crate::log::ERROR, "{name}: internal error (panic: {why}); the call failed")
            }));
            on_panic
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_panic_becomes_the_error_value() {
        assert_eq!(guard("t", -1, || 5), 5);
        assert_eq!(guard("t", -1, || -> i32 { panic!("boom") }), -1);
        assert_eq!(guard("t", -1, || -> i32 { std::panic::panic_any(17u8) }), -1);
    }
}
