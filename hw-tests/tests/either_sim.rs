//! The `Either` device and its environment on the host, no hardware: the hal conformance suite
//! and the RPC suite with one end on each of two simulated NICs that share nothing but an
//! in-memory Ethernet cable (the L2 wire, `bypass_sim::l2::pair`): two fabrics, one on the
//! Inline engine (as the `vfio:` backend runs its NIC) and one on the Threaded engine, each
//! knowing only its own NIC — the shape of `vfio_suites.rs`, where the other end is rxe. Both
//! orders (the Inline NIC first, and second), so every scenario runs with each NIC as requester
//! and as responder, as server and as client.

use bypass_hal::{Device, Error, QueueConfig};
use bypass_hw_tests::either::{Either, EitherEnv};
use bypass_sim::{Engine, Fabric, FabricConfig, SimNic};

/// Two simulated NICs on two fabrics joined by an in-memory cable: one on the Inline engine, one
/// on the Threaded engine. (Each NIC keeps its fabric alive.)
fn nics() -> (SimNic, SimNic) {
    let (mut ports, _) = bypass_sim::l2::pair::pair_attachments(Default::default()).unwrap();
    let second = ports.pop().unwrap();
    let inline = Fabric::try_with_l2(FabricConfig::new(Engine::Inline), ports).unwrap();
    let threaded = Fabric::try_with_l2(FabricConfig::new(Engine::Threaded), vec![second]).unwrap();
    (inline.add_nic(), threaded.add_nic())
}

/// The Inline NIC first (A, the requester; the server) or second (B; the client). Both are
/// simulated NICs, whose CQs arm against the consumer index.
fn env(inline_first: bool) -> EitherEnv<SimNic, SimNic> {
    let (l, r) = nics();
    if inline_first { EitherEnv::left_first(l, r) } else { EitherEnv::right_first(l, r) }
        .second_arms_against_consumer_index(true)
}

bypass_hal::conformance_suite!(hal_inline_first, || super::env(true));
bypass_hal::conformance_suite!(hal_threaded_first, || super::env(false));
bypass::rpc_suite!(rpc_inline_server, || super::env(true));
bypass::rpc_suite!(rpc_threaded_server, || super::env(false));

/// Each device takes only its own objects: a queue of one NIC on a CQ of the other is refused
/// with a clear error, as is a CQ on the other's event channel.
#[test]
fn objects_of_the_other_device_are_refused() {
    let (inline, threaded) = nics();
    let (l, r): (Either<SimNic, SimNic>, Either<SimNic, SimNic>) =
        (Either::Left(inline), Either::Right(threaded));
    let (cl, cr) = (l.create_cq(8).unwrap(), r.create_cq(8).unwrap());
    let e = l.create_queue(&QueueConfig::default(), &cl, &cr).unwrap_err();
    assert!(matches!(&e, Error::InvalidArgument(m) if m.contains("other device")), "{e:?}");
    let e = r.create_queue(&QueueConfig::default(), &cl, &cl).unwrap_err();
    assert!(matches!(e, Error::InvalidArgument(_)), "{e:?}");
    let ch = r.create_channel().unwrap();
    assert!(matches!(l.create_cq_on(8, &ch), Err(Error::InvalidArgument(_))));
    assert!(l.create_queue(&QueueConfig::default(), &cl, &cl).is_ok());
}
