//! A CQ's completion event channel as the hal sees it, common to the verbs and URMA backends:
//! an fd the caller waits on and a non-blocking take of the pending events, each naming the CQ
//! that raised it. A channel is a CQ's own ([`crate::Device::create_cq`]: the CQ's
//! `ack_events` takes its events) or shared by several ([`crate::Device::create_cq_on`]: the
//! [`crate::EventChannel`] takes them).
//!
//! Also the check of a CQ's depth, the one argument a CQ is created with.

use crate::{DeviceCaps, Error, Result};
use std::os::fd::{BorrowedFd, RawFd};

/// A backend's event channel (an `ibv_comp_channel`, a JFCE).
pub(crate) trait EventSource {
    /// The channel's fd, open as long as the channel is.
    fn fd(&self) -> RawFd;

    /// Takes up to `max` pending events without blocking (acknowledging each), calling `f` with
    /// the id of the CQ that raised it; how many it took.
    fn take(&self, max: usize, f: impl FnMut(u64)) -> Result<usize>;

    /// The fd, borrowed for as long as the channel is.
    fn borrowed_fd(&self) -> BorrowedFd<'_> {
        // SAFETY: the channel's fd stays open while the channel (borrowed here) lives.
        unsafe { BorrowedFd::borrow_raw(self.fd()) }
    }

    /// `EventChannel::take_events`: the ids of the CQs of up to `out.len()` pending events.
    fn take_into(&self, out: &mut [u64]) -> Result<usize> {
        let mut i = 0;
        self.take(out.len(), |id| {
            out[i] = id;
            i += 1;
        })
    }

    /// `CompletionQueue::ack_events` of a CQ on this channel: takes every pending event if the
    /// channel is the CQ's own (`private`); a shared channel's are the `EventChannel`'s to take.
    fn ack_own(&self, private: bool) -> Result<u64> {
        if !private {
            return Ok(0);
        }
        Ok(self.take(usize::MAX, |_| {})? as u64)
    }
}

/// Checks a CQ's `depth` against the device's caps.
pub(crate) fn check_depth(caps: &DeviceCaps, name: &str, depth: u32) -> Result<()> {
    if depth == 0 || depth > caps.max_cq_depth {
        return Err(Error::InvalidArgument(format!(
            "CQ depth {depth} is outside 1..={} of {name}",
            caps.max_cq_depth
        )));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::cell::RefCell;

    /// A channel with events pending from the CQs listed.
    struct Pending(RefCell<Vec<u64>>);

    impl EventSource for Pending {
        fn fd(&self) -> RawFd {
            -1
        }
        fn take(&self, max: usize, mut f: impl FnMut(u64)) -> Result<usize> {
            let mut p = self.0.borrow_mut();
            let n = max.min(p.len());
            p.drain(..n).for_each(&mut f);
            Ok(n)
        }
    }

    #[test]
    fn events_name_their_cqs_and_only_an_own_channel_is_acked_by_its_cq() {
        let ch = Pending(RefCell::new(vec![3, 5, 3]));
        let mut out = [0; 2];
        assert_eq!(ch.take_into(&mut out).unwrap(), 2);
        assert_eq!(out, [3, 5]);
        assert_eq!(ch.ack_own(false).unwrap(), 0, "a shared channel's events stay for the channel");
        assert_eq!(ch.ack_own(true).unwrap(), 1);
        assert_eq!(ch.take_into(&mut out).unwrap(), 0);
        let caps = DeviceCaps::new(16, 64, 1, 1, 0, 1024, 1024);
        assert!(check_depth(&caps, "d", 64).is_ok());
        assert!(check_depth(&caps, "d", 0).is_err());
        let e = check_depth(&caps, "d", 65).unwrap_err().to_string();
        assert!(e.contains("CQ depth 65 is outside 1..=64 of d"), "{e}");
    }
}
