//! # bypass-hw-tests
//!
//! Runs the hal conformance suite (`bypass_hal::conformance`) and, later, the stack's end-to-end
//! tests on real NICs (verbs, URMA, vfio) when the machine has one. The real backends are not
//! written yet, so there is nothing to run here; the suite runs on the simulator in `bypass-sim`.
