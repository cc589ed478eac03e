//! Issue 30 defect 12: the server's request and response counters count the application's
//! calls only. Keepalive probes (the stack's own requests, sent whenever a channel is idle for
//! an interval) used to be counted too, so a test that ran longer than an interval, as under
//! load, saw more requests than it made.

use bypass::sim::Engine;
use bypass::Keepalive;
use std::time::Duration;

mod common;
use common::ids::ECHO;
use common::rig::Rig;

/// Keepalive at 1 ms: the idle channel probes many times before and between the calls; the
/// server counts exactly the calls made.
fn keepalive_probes_are_not_counted_as_requests(engine: Engine) {
    let keepalive = Some(Keepalive { interval: Duration::from_millis(1), misses: 1000 });
    let rig = Rig::with(engine, |c, s| {
        c.keepalive = keepalive;
        s.keepalive = keepalive;
    });
    common::helpers::wait_for("a few probes", || rig.channel.stats().keepalive_probes >= 3);
    let mut out = Vec::new();
    for i in 0..5u8 {
        rig.channel.call(ECHO, &[i], &mut out).expect("echo");
    }
    common::helpers::wait_for("more probes", || rig.channel.stats().keepalive_probes >= 6);
    let s = rig.server.stats();
    assert_eq!((s.requests, s.responses), (5, 5), "{s:?}");
}

common::per_engine!(keepalive_probes_are_not_counted_as_requests);
