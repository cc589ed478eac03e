//! Chains of work requests as the verbs and URMA libraries take them, common to both backends:
//! a batch is built in a buffer the queue owns (no allocation when posting), each request
//! linked to the next by a raw pointer, and a refused post names the request it stopped at.

/// The `next` pointer of request `i` of a chain of `n` built at the start of `buf`: the request
/// after it, or null for the last.
pub(crate) fn next<T>(buf: &mut [T], i: usize, n: usize) -> *mut T {
    if i + 1 < n {
        &mut buf[i + 1]
    } else {
        std::ptr::null_mut()
    }
}

/// How many requests of a refused chain of `n` starting at `base` the library posted anyway
/// (they will complete): those before `bad`, the request it reports, null for none. `bad` is
/// what the library wrote back: null or a pointer into the chain.
pub(crate) fn posted_before<T>(bad: *mut T, base: *const T, n: usize) -> usize {
    if bad.is_null() {
        return 0;
    }
    // SAFETY: a bad request the library reports points into the chain it was given, which
    // starts at `base` (both pointers are in the one buffer).
    unsafe { bad.cast_const().offset_from(base) }.clamp(0, n as isize) as usize
}

/// What a refused post says: request (or receive: `what`) `posted` of a batch of `n` on `place`
/// (a queue, a shared receive queue) was refused, the ones before it were posted.
pub(crate) fn refusal(what: &str, posted: usize, n: usize, place: std::fmt::Arguments<'_>) -> String {
    format!("{what} {posted} of a batch of {n} on {place} refused, the {posted} before it were posted")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn chains_link_forward_and_refusals_count_what_went_before() {
        let mut buf = [0u64; 4];
        let base = buf.as_ptr();
        assert_eq!(next(&mut buf, 0, 3).cast_const(), base.wrapping_add(1));
        assert!(next(&mut buf, 2, 3).is_null(), "the last of the chain");
        let bad = buf.as_mut_ptr().wrapping_add(2);
        assert_eq!(posted_before(bad, base, 3), 2);
        assert_eq!(posted_before(std::ptr::null_mut::<u64>(), base, 3), 0);
        assert_eq!(
            refusal("receive", 2, 3, format_args!("QP {}", 7)),
            "receive 2 of a batch of 3 on QP 7 refused, the 2 before it were posted"
        );
    }
}
