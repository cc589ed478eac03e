//! Values of whichever backend was opened at run time: one enum family over the compiled device
//! types, for programs that keep stack objects past one call (the C library keeps a server, a
//! channel, a request, a region per handle).
//!
//! [`WithDevices`](super::WithDevices) runs generic code once on the devices of a [`Backend`];
//! it cannot hand back a `Channel<D>` whose `D` the caller never names. [`Any<F>`] can: one
//! variant per compiled backend, holding `F`'s object for that backend's device type
//! ([`AnyDevice`], [`AnyServer`], [`AnyChannel`], [`AnyConnection`], [`AnyRequest`],
//! [`AnyRegion`]). [`match_any!`](crate::match_any) runs code generic over [`Nic`] on the value
//! inside; [`Nic::wrap`] and [`Any::get`] go in and out. A call through it costs one `match`.
//!
//! A new backend is added here (a variant, its [`Nic`] impl, its `match_any!` arm) and in
//! [`Backend`]; nothing outside this module names the variants.
//!
//! [`Backend`]: super::Backend

use crate::{Channel, Connection, Request, Server};
use bypass_hal::Device;
use std::fmt;
use std::sync::Arc;

/// A device type of a compiled backend: what [`Any`] holds objects of.
pub trait Nic: Device + Clone + Send + Sync + 'static {
    /// The name of its backend (`sim`, `verbs`, `urma`).
    const BACKEND: &'static str;
    /// Wraps `F`'s object for this device type: `D::wrap::<Servers>(server)`.
    fn wrap<F: Family>(x: F::Of<Self>) -> Any<F>;
    /// The object inside `a`, if `a` holds this device type's.
    fn get<F: Family>(a: &Any<F>) -> Option<&F::Of<Self>>;
}

/// A kind of object generic over the device type (a type constructor): `Of<D>` is the object
/// for device `D`.
pub trait Family {
    /// The object for device type `D`.
    type Of<D: Nic>;
}

/// One value per compiled backend: `F`'s object for the backend that was opened.
pub enum Any<F: Family> {
    /// On the simulated NIC (`sim...` and `vfio:...` specs).
    #[cfg(feature = "sim")]
    Sim(F::Of<bypass_sim::SimNic>),
    /// On an RDMA NIC through libibverbs.
    #[cfg(feature = "verbs")]
    Verbs(F::Of<bypass_hal::verbs::VerbsDevice>),
    /// On a URMA (UB) device through liburma.
    #[cfg(feature = "urma")]
    Urma(F::Of<bypass_hal::urma::UrmaDevice>),
    /// Never constructed: keeps `F` used in a build without any backend.
    #[doc(hidden)]
    #[cfg(not(any(feature = "sim", feature = "verbs", feature = "urma")))]
    _Never(std::convert::Infallible, std::marker::PhantomData<F>),
}

impl<F: Family> Any<F> {
    /// The object inside, if it is `D`'s: `region.get::<D>()`.
    pub fn get<D: Nic>(&self) -> Option<&F::Of<D>> {
        D::get(self)
    }

    /// The name of the backend the value is on (`sim`, `verbs`, `urma`).
    pub fn backend(&self) -> &'static str {
        match self {
            #[cfg(feature = "sim")]
            Any::Sim(_) => <bypass_sim::SimNic as Nic>::BACKEND,
            #[cfg(feature = "verbs")]
            Any::Verbs(_) => <bypass_hal::verbs::VerbsDevice as Nic>::BACKEND,
            #[cfg(feature = "urma")]
            Any::Urma(_) => <bypass_hal::urma::UrmaDevice as Nic>::BACKEND,
            #[cfg(not(any(feature = "sim", feature = "verbs", feature = "urma")))]
            Any::_Never(n, _) => match *n {},
        }
    }
}

impl<F: Family> fmt::Debug for Any<F> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Any({})", self.backend())
    }
}

/// Defines one family marker and its alias.
macro_rules! family {
    ($(#[$doc:meta])* $marker:ident, $alias:ident, $of:ty) => {
        $(#[$doc])*
        #[derive(Debug)]
        pub enum $marker {}
        impl Family for $marker {
            type Of<D: Nic> = $of;
        }
        $(#[$doc])*
        pub type $alias = Any<$marker>;
    };
}

family!(
    /// A device.
    Devices, AnyDevice, D
);
family!(
    /// A started server.
    Servers, AnyServer, Server<D>
);
family!(
    /// A client's channel.
    Channels, AnyChannel, Channel<D>
);
family!(
    /// A server's connection.
    Connections, AnyConnection, Connection<D>
);
family!(
    /// A request being handled.
    Requests, AnyRequest, Request<D>
);
family!(
    /// A registered memory region.
    Regions, AnyRegion, Arc<D::Region>
);

/// Implements [`Nic`] for one backend's device type.
#[allow(unused_macros)] // a build without backends
macro_rules! nic {
    ($dev:ty, $variant:ident, $name:literal) => {
        impl Nic for $dev {
            const BACKEND: &'static str = $name;
            fn wrap<F: Family>(x: F::Of<Self>) -> Any<F> {
                Any::$variant(x)
            }
            fn get<F: Family>(a: &Any<F>) -> Option<&F::Of<Self>> {
                match a {
                    Any::$variant(x) => Some(x),
                    #[allow(unreachable_patterns)]
                    _ => None,
                }
            }
        }
    };
}

#[cfg(feature = "sim")]
nic!(bypass_sim::SimNic, Sim, "sim");
#[cfg(feature = "verbs")]
nic!(bypass_hal::verbs::VerbsDevice, Verbs, "verbs");
#[cfg(feature = "urma")]
nic!(bypass_hal::urma::UrmaDevice, Urma, "urma");

// `match_any!` is defined once per set of compiled backends, here, so its arms follow this
// crate's features (a `#[cfg]` inside an exported macro would follow the caller's).
#[allow(unused_macros)] // a build without backends
macro_rules! define_match_any {
    ($d:tt $($variant:ident)*) => {
        /// Runs `body` with `x` bound to the value inside a [`backend::Any`](crate::backend::Any)
        /// (by value or by reference, as `e` is), whatever the backend; `body` is compiled once
        /// per backend, so it may call code generic over [`Nic`](crate::backend::Nic):
        /// `bypass::match_any!(&channel, c => c.is_closed())`.
        #[macro_export]
        macro_rules! match_any {
            ($d e:expr, $d x:ident => $d body:expr) => {
                match $d e {
                    $( $d crate::backend::Any::$variant($d x) => $d body, )*
                }
            };
        }
    };
}

#[cfg(all(feature = "sim", feature = "verbs", feature = "urma"))]
define_match_any!($ Sim Verbs Urma);
#[cfg(all(feature = "sim", feature = "verbs", not(feature = "urma")))]
define_match_any!($ Sim Verbs);
#[cfg(all(feature = "sim", not(feature = "verbs"), feature = "urma"))]
define_match_any!($ Sim Urma);
#[cfg(all(feature = "sim", not(feature = "verbs"), not(feature = "urma")))]
define_match_any!($ Sim);
#[cfg(all(not(feature = "sim"), feature = "verbs", feature = "urma"))]
define_match_any!($ Verbs Urma);
#[cfg(all(not(feature = "sim"), feature = "verbs", not(feature = "urma")))]
define_match_any!($ Verbs);
#[cfg(all(not(feature = "sim"), not(feature = "verbs"), feature = "urma"))]
define_match_any!($ Urma);
/// Runs `body` on the value inside a [`backend::Any`](crate::backend::Any); this build has no
/// backend, so there is none.
#[cfg(not(any(feature = "sim", feature = "verbs", feature = "urma")))]
#[macro_export]
macro_rules! match_any {
    ($e:expr, $x:ident => $body:expr) => {
        match $e {
            _ => unreachable!("this build has no backend, so no backend::Any value exists"),
        }
    };
}

#[cfg(all(test, feature = "sim"))]
mod tests {
    use super::*;
    use crate::{ChannelConfig, FunctionId, Functions, ServerConfig};
    use bypass_sim::{Engine, Fabric, SimNic};

    fn serve_on<D: Nic>(dev: &D, echo: FunctionId) -> AnyServer {
        let mut f = Functions::new();
        f.register(echo, |req| {
            let args = req.args().to_vec();
            let _ = req.reply(&args);
        });
        D::wrap::<Servers>(Server::bind(dev, "127.0.0.1:0", ServerConfig::new("any"), f).unwrap())
    }

    fn connect_on<D: Nic>(dev: &D, server: &AnyServer) -> AnyChannel {
        let addr = match_any!(server, s => s.local_addr());
        D::wrap::<Channels>(Channel::connect(dev, addr, ChannelConfig::new("any")).unwrap())
    }

    #[test]
    fn objects_of_the_opened_backend_outlive_the_call_that_made_them() {
        let fabric = Fabric::new(Engine::Inline);
        let dev: AnyDevice = SimNic::wrap::<Devices>(fabric.add_nic());
        let echo = FunctionId::new(0x100, 1, true, 1).unwrap();
        let server = match_any!(&dev, d => serve_on(d, echo));
        let channel = match_any!(&dev, d => connect_on(d, &server));
        let mut rsp = Vec::new();
        match_any!(&channel, c => c.call(echo, b"erased", &mut rsp)).unwrap();
        assert_eq!(rsp, b"erased");
        assert_eq!((dev.backend(), format!("{channel:?}")), ("sim", "Any(sim)".to_string()));
        assert!(channel.get::<SimNic>().is_some());
    }
}
