//! What every test binary of the stack shares, included with `mod common;`:
//!
//! - [`ids`]: the function ids test servers register, once;
//! - [`rig`]: a fabric, a server with the shared functions and a channel to it, on any engine
//!   (Inline, Threaded, or Stepped driven by the test thread), and the bounded waits to drive it;
//! - [`served`]: the same fabric and server without a channel, for tests that open their own;
//! - [`helpers`]: an echo service, bounded waits, polling a future by hand;
//! - [`per_engine!`]: one test per engine for each named scenario.
//!
//! Two pieces stay apart because they change the whole process and a binary opts in by path:
//! `counting_alloc.rs` (a global allocator) and `threads.rs` (this process's thread list).
//! Not every binary uses every piece, hence the `dead_code` allowance.
#![allow(dead_code, unused_imports, unused_macros)]

pub mod helpers;
pub mod ids;
pub mod rig;
pub mod served;

/// Seed of the Stepped engine's scheduler in [`per_engine!`] and [`rig::STEPPED`].
pub const SEED: u64 = 0xE2E_5EED;

/// Makes each named `fn(Engine)` a test per engine: `inline::name` and `threaded::name`; with
/// `stepped:` first, also `stepped::name` on the Stepped engine (for scenarios that drive it
/// themselves, such as those built on [`rig::Rig`]).
macro_rules! per_engine {
    (stepped: $($name:ident),* $(,)?) => {
        $crate::common::per_engine!($($name),*);
        mod stepped {
            $( #[test] fn $name() { super::$name($crate::common::rig::STEPPED) } )*
        }
    };
    ($($name:ident),* $(,)?) => {
        mod inline {
            $( #[test] fn $name() { super::$name(bypass::sim::Engine::Inline) } )*
        }
        mod threaded {
            $( #[test] fn $name() { super::$name(bypass::sim::Engine::Threaded) } )*
        }
    };
}
pub(crate) use per_engine;
