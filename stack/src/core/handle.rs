//! `(index, generation)` handles: the packing shared by [`crate::core::tx_ctx::TxHandle`] and
//! [`crate::core::buf_pool::BufToken`]. They stay distinct types (a send-context handle cannot be passed
//! where a buffer token is expected); this macro only writes their common conversions once.

/// Implements `to_u64`/`from_u64` (generation in the high 32 bits, index in the low 32), `From`
/// both ways and `Display` (`"<what> #<index> gen <generation>"`) for a struct with `index: u32`
/// and `generation: u32` fields.
macro_rules! generational_handle {
    ($ty:ident, $what:literal) => {
        impl $ty {
            /// Packs the handle into a `u64` (generation high, index low), e.g. for a `wr_id`.
            pub const fn to_u64(self) -> u64 {
                ((self.generation as u64) << 32) | self.index as u64
            }

            /// Inverse of `to_u64`. Any `u64` gives a value; a bogus one is refused where it is
            /// used (the slot's generation will not match).
            pub const fn from_u64(v: u64) -> $ty {
                $ty { index: v as u32, generation: (v >> 32) as u32 }
            }
        }

        impl From<$ty> for u64 {
            fn from(h: $ty) -> u64 {
                h.to_u64()
            }
        }

        impl From<u64> for $ty {
            fn from(v: u64) -> $ty {
                $ty::from_u64(v)
            }
        }

        impl std::fmt::Display for $ty {
            fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                write!(f, concat!($what, " #{} gen {}"), self.index, self.generation)
            }
        }
    };
}

pub(crate) use generational_handle;
