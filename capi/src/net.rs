//! Type erasure over the compiled backends.
//!
//! The stack is generic over the device type; the C API holds one object per handle, so every
//! generic stack object is wrapped in [`ByDev`] (one variant per compiled backend) and code
//! generic over [`Nic`] runs on it through [`by_dev!`](crate::by_dev). The memory side uses the
//! same: [`AnyRegion`], [`Nic::region`] and [`Nic::region_of`].

use bypass::hal::Device;
use bypass::{Channel, Connection, Request, Server};
use bypass_sim::SimNic;
use std::convert::Infallible;
use std::marker::PhantomData;
use std::sync::Arc;

/// The verbs device (with feature `verbs`).
#[cfg(feature = "verbs")]
pub type VerbsNic = bypass::hal::verbs::VerbsDevice;
/// Without feature `verbs`, a stand-in type; [`ByDev::Verbs`] does not exist then.
#[cfg(not(feature = "verbs"))]
pub type VerbsNic = SimNic;

/// The URMA device (with feature `urma`).
#[cfg(feature = "urma")]
pub type UrmaNic = bypass::hal::urma::UrmaDevice;
/// Without feature `urma`, a stand-in type; [`ByDev::Urma`] does not exist then.
#[cfg(not(feature = "urma"))]
pub type UrmaNic = SimNic;

/// One value per compiled backend: `S` on the simulator, `V` on verbs, `U` on URMA.
#[derive(Debug)]
pub enum ByDev<S, V, U> {
    /// The simulated NIC (`TCP` type, or `BYPASS_BACKEND=sim...`).
    Sim(S),
    /// An RDMA NIC (`RDMA` type).
    #[cfg(feature = "verbs")]
    Verbs(V),
    /// A URMA (UB) device (`UBC` type).
    #[cfg(feature = "urma")]
    Urma(U),
    /// Never constructed (keeps `V` and `U` used in every build).
    #[doc(hidden)]
    _Never(Infallible, PhantomData<(V, U)>),
}

/// Runs `$body` with `$x` bound to the value inside a [`ByDev`] (by value or by reference, as
/// `$e` is), whatever the backend: `by_dev!(&channel, c => c.is_closed())`.
#[macro_export]
macro_rules! by_dev {
    ($e:expr, $x:ident => $body:expr) => {
        match $e {
            $crate::net::ByDev::Sim($x) => $body,
            #[cfg(feature = "verbs")]
            $crate::net::ByDev::Verbs($x) => $body,
            #[cfg(feature = "urma")]
            $crate::net::ByDev::Urma($x) => $body,
            $crate::net::ByDev::_Never(..) => unreachable!("ByDev::_Never is never constructed"),
        }
    };
}

/// A device of the server.
pub type Dev = ByDev<SimNic, VerbsNic, UrmaNic>;
/// A started server.
pub type AnyServer = ByDev<Server<SimNic>, Server<VerbsNic>, Server<UrmaNic>>;
/// A client's channel.
pub type AnyChannel = ByDev<Channel<SimNic>, Channel<VerbsNic>, Channel<UrmaNic>>;
/// A server-side connection.
pub type AnyConn = ByDev<Connection<SimNic>, Connection<VerbsNic>, Connection<UrmaNic>>;
/// A request being handled.
pub type AnyRequest = ByDev<Request<SimNic>, Request<VerbsNic>, Request<UrmaNic>>;
/// A registered memory region.
pub type AnyRegion = ByDev<
    Arc<<SimNic as Device>::Region>,
    Arc<<VerbsNic as Device>::Region>,
    Arc<<UrmaNic as Device>::Region>,
>;

/// A device type the C API runs on: wraps its generic objects into the `Any*` enums.
pub trait Nic: Device + Clone + Send + Sync + 'static {
    /// Wraps a device.
    fn dev(d: Self) -> Dev;
    /// Wraps a server.
    fn server(s: Server<Self>) -> AnyServer;
    /// Wraps a channel.
    fn channel(c: Channel<Self>) -> AnyChannel;
    /// Wraps a connection.
    fn conn(c: Connection<Self>) -> AnyConn;
    /// Wraps a request.
    fn request(r: Request<Self>) -> AnyRequest;
    /// Wraps a region.
    fn region(r: Arc<Self::Region>) -> AnyRegion;
    /// The region inside `r`, if `r` is of this device type.
    fn region_of(r: &AnyRegion) -> Option<&Arc<Self::Region>>;
}

impl Nic for SimNic {
    fn dev(d: Self) -> Dev {
        ByDev::Sim(d)
    }
    fn server(s: Server<Self>) -> AnyServer {
        ByDev::Sim(s)
    }
    fn channel(c: Channel<Self>) -> AnyChannel {
        ByDev::Sim(c)
    }
    fn conn(c: Connection<Self>) -> AnyConn {
        ByDev::Sim(c)
    }
    fn request(r: Request<Self>) -> AnyRequest {
        ByDev::Sim(r)
    }
    fn region(r: Arc<Self::Region>) -> AnyRegion {
        ByDev::Sim(r)
    }
    fn region_of(r: &AnyRegion) -> Option<&Arc<Self::Region>> {
        match r {
            ByDev::Sim(r) => Some(r),
            #[allow(unreachable_patterns)]
            _ => None,
        }
    }
}

#[cfg(feature = "verbs")]
impl Nic for VerbsNic {
    fn dev(d: Self) -> Dev {
        ByDev::Verbs(d)
    }
    fn server(s: Server<Self>) -> AnyServer {
        ByDev::Verbs(s)
    }
    fn channel(c: Channel<Self>) -> AnyChannel {
        ByDev::Verbs(c)
    }
    fn conn(c: Connection<Self>) -> AnyConn {
        ByDev::Verbs(c)
    }
    fn request(r: Request<Self>) -> AnyRequest {
        ByDev::Verbs(r)
    }
    fn region(r: Arc<Self::Region>) -> AnyRegion {
        ByDev::Verbs(r)
    }
    fn region_of(r: &AnyRegion) -> Option<&Arc<Self::Region>> {
        match r {
            ByDev::Verbs(r) => Some(r),
            #[allow(unreachable_patterns)]
            _ => None,
        }
    }
}

#[cfg(feature = "urma")]
impl Nic for UrmaNic {
    fn dev(d: Self) -> Dev {
        ByDev::Urma(d)
    }
    fn server(s: Server<Self>) -> AnyServer {
        ByDev::Urma(s)
    }
    fn channel(c: Channel<Self>) -> AnyChannel {
        ByDev::Urma(c)
    }
    fn conn(c: Connection<Self>) -> AnyConn {
        ByDev::Urma(c)
    }
    fn request(r: Request<Self>) -> AnyRequest {
        ByDev::Urma(r)
    }
    fn region(r: Arc<Self::Region>) -> AnyRegion {
        ByDev::Urma(r)
    }
    fn region_of(r: &AnyRegion) -> Option<&Arc<Self::Region>> {
        match r {
            ByDev::Urma(r) => Some(r),
            #[allow(unreachable_patterns)]
            _ => None,
        }
    }
}
