//! The backends this build has, chosen at run time from a string.
//!
//! The stack is generic over [`hal::Device`](crate::hal::Device) and the data path under it is
//! monomorphised; programs that pick their NIC from configuration (bypass-perf's `--backend`, the
//! C library's config) open a [`Backend`] from a string and hand it a [`WithDevices`] visitor.
//! The one `match` over the compiled backends happens there, once, not per post.
//!
//! | string | backend | needs |
//! |---|---|---|
//! | `sim`, `sim:inline`, `sim:threaded` | two simulated NICs on one fabric (Inline or Threaded engine), in-process wire | feature `sim` (default) |
//! | `sim+udp://127.0.0.1:0`, `sim:threaded+udp://10.0.0.5:7000` | simulated NICs on the UDP wire bound to that address (port 0: any free port), reachable from other processes and hosts | feature `sim` |
//! | `sim+shm`, `sim:threaded+shm` | simulated NICs on the shared-memory wire (segments in `/dev/shm`), reachable from other processes on this host | feature `sim` |
//! | `sim,ack_hold=off`, `sim:inline,ack_hold=5`, `sim+udp://127.0.0.1:0,ack_hold=off` | how long a simulated NIC may hold a plain ACK back for the next packet it sends, in µs (default 20; `off`: never), on the in-process wire (Inline engine: docs/sim.md, "Held ACKs") and the UDP wire, refused elsewhere (nothing there holds ACKs); for A/B measurements | feature `sim` |
//! | `sim+udp://127.0.0.1:0,ack_timeout_backoff=off`, `sim+shm,ack_timeout_backoff=12` | on any wire above or below (and `vfio:`), the NICs' retransmission waits double after each timeout without progress up to 4.096 µs × 2^N (default N = 18, 1.07 s: they are threads of ordinary processes, which a loaded host deschedules; docs/sim.md, "Retransmission backoff"), or stay fixed with `off`; the in-process wire keeps fixed timeouts | feature `sim` |
//! | `sim+l2:pair`, `sim+l2:pair,loss_ppm=20000` | two simulated NICs on the L2 wire (RoCEv2 in Ethernet frames, ARP) joined by an in-memory cable, 10.99.0.1 and 10.99.0.2: for tests | feature `sim` |
//! | `sim+packet://veth0,ip=10.99.0.2[/24][,gw=10.99.0.1]` | one simulated NIC on the L2 wire through an `AF_PACKET` socket on that interface, speaking RoCEv2 to any RoCE NIC on the link (rxe); server and client share it | feature `sim`; CAP_NET_RAW |
//! | `verbs` | the first RDMA device libibverbs lists | feature `verbs` |
//! | `verbs:rxe0` | the device `rxe0` | feature `verbs` |
//! | `verbs:rxe0,port=1,gid=1,mtu=1024,tc=0` | with device-level settings ([`hal::DeviceConfig`](crate::hal::DeviceConfig)) | feature `verbs` |
//! | `vfio:0000:00:03.0,ip=10.29.0.1[/24][,gw=10.29.0.254][,interrupts=off]` | one simulated NIC (Inline engine) on the L2 wire over the virtio-net device at that PCI address, owned through VFIO (docs/vfio.md); server and client share it; `interrupts=off`: no MSI-X, the port is only polled | feature `vfio`; the device bound to vfio-pci, an IOMMU |
//! | `urma` | the first URMA device liburma lists, opened twice (two contexts, like two hosts) | feature `urma`; liburma at run time |
//! | `urma:udma0` | the URMA device `udma0` | feature `urma` |
//! | `urma:udma0,lib=/path/liburma.so.0,eid=0` | with the liburma to load (else `$BYPASS_URMA_LIB`, else `liburma.so.0`) and the EID index | feature `urma` |
//!
//! Code that keeps stack objects of the opened backend past one call (the C library) holds them
//! as [`any::Any`] values ([`AnyDevice`], [`AnyChannel`], ...; [`Backend::device`] gives the
//! first) and reaches inside with [`match_any!`](crate::match_any).
//!
//! The Stepped engine is not offered here: nothing moves under it until a test drives it, which
//! only a test can do (build its `Fabric` directly).

pub mod any;

pub use any::{
    Any, AnyChannel, AnyConnection, AnyDevice, AnyRegion, AnyRequest, AnyServer, Channels, Connections,
    Devices, Family, Nic, Regions, Requests, Servers,
};

use crate::RpcError;
#[allow(unused_imports)]
use bypass_hal::Device;

/// Code generic over a device type, run by [`Backend::run`] on a pair of devices of the chosen
/// backend: `server` and `client` may be two simulated NICs, or one verbs device twice (its queue
/// pairs connect through the NIC's loopback).
pub trait WithDevices {
    /// What the code returns.
    type Output;
    /// Runs with the devices.
    fn run<D: Device + Clone>(self, server: &D, client: &D) -> Self::Output;
}

/// An opened backend.
#[derive(Debug)]
#[non_exhaustive]
pub enum Backend {
    /// Simulated NICs on one fabric.
    #[cfg(feature = "sim")]
    Sim {
        /// The fabric (dropping it stops its device threads).
        fabric: bypass_sim::Fabric,
        /// Its engine.
        engine: bypass_sim::Engine,
    },
    /// An RDMA device through libibverbs.
    #[cfg(feature = "verbs")]
    Verbs(bypass_hal::verbs::VerbsDevice),
    /// A URMA device through liburma, opened twice: the server's context and the client's.
    #[cfg(feature = "urma")]
    Urma {
        /// The server's context.
        server: bypass_hal::urma::UrmaDevice,
        /// The client's context.
        client: bypass_hal::urma::UrmaDevice,
    },
}

/// The backends this build can open, for messages.
pub fn compiled() -> &'static [&'static str] {
    &[
        #[cfg(feature = "sim")]
        "sim",
        #[cfg(feature = "verbs")]
        "verbs",
        #[cfg(feature = "urma")]
        "urma",
        #[cfg(feature = "vfio")]
        "vfio",
    ]
}

/// Takes the option `key=` out of comma-separated options: the other options (`None` if none are
/// left) and the value `parse` makes of it, if given. Every occurrence is parsed, so a bad value
/// is refused even where a later one would override it; the last one counts.
#[cfg(feature = "sim")]
fn take_option<T>(
    options: &str,
    key: &str,
    parse: impl Fn(&str) -> Result<T, String>,
) -> Result<(Option<String>, Option<T>), RpcError> {
    let mut value = None;
    let mut rest = Vec::new();
    for part in options.split(',') {
        match part.strip_prefix(key).and_then(|v| v.strip_prefix('=')) {
            Some(v) => value = Some(parse(v).map_err(RpcError::InvalidArgument)?),
            None => rest.push(part),
        }
    }
    Ok(((!rest.is_empty()).then(|| rest.join(",")), value))
}

/// Refuses options with an empty one among them (`sim,`, `sim+shm,,ack_hold=off`): a stray comma
/// is a typo, not an option.
#[cfg(feature = "sim")]
fn no_empty_option(spec: &str, options: &str) -> Result<(), RpcError> {
    match options.split(',').any(str::is_empty) {
        true => Err(RpcError::InvalidArgument(format!(
            "{spec:?} has an empty option (a stray comma): options are name=value, separated by one comma"
        ))),
        false => Ok(()),
    }
}

/// Refuses an `ack_hold=` where nothing holds ACKs ([`bypass_sim::FabricConfig::holds_acks`]):
/// ignoring it would let an A/B run compare a build with itself.
#[cfg(feature = "sim")]
fn check_hold(
    spec: &str,
    hold: Option<std::time::Duration>,
    config: &bypass_sim::FabricConfig,
) -> Result<(), RpcError> {
    match hold.is_some() && !config.holds_acks() {
        true => Err(RpcError::InvalidArgument(format!(
            "{spec:?}: ack_hold= means nothing here, where the simulated NICs ({:?} engine) send each ACK at \
             once; it applies to the in-process wire with the Inline engine (sim,ack_hold=off) and to the \
             UDP wire",
            config.engine
        ))),
        false => Ok(()),
    }
}

/// Parses the value of `vfio:`'s `interrupts=` option.
#[cfg(feature = "vfio")]
fn parse_interrupts(value: &str) -> Result<bool, String> {
    match value {
        "on" => Ok(true),
        "off" => Ok(false),
        other => Err(format!(
            "vfio: interrupts={other:?}: use interrupts=on (the default: receive interrupts through MSI-X, \
             so a CQ in event mode sleeps) or interrupts=off (the port is only polled)"
        )),
    }
}

#[cfg_attr(all(feature = "sim", feature = "verbs", feature = "urma", feature = "vfio"), allow(dead_code))]
fn not_compiled(kind: &str, feature: &str) -> RpcError {
    RpcError::InvalidArgument(format!(
        "backend {kind:?} is not compiled into this build (rebuild with `--features {feature}`); this build has: {}",
        compiled().join(", ")
    ))
}

impl Backend {
    /// Opens the backend `spec` names (see the module docs).
    pub fn open(spec: &str) -> Result<Backend, RpcError> {
        let (head, wire) = match spec.split_once('+') {
            Some((head, wire)) => (head, Some(wire)),
            None => (spec, None),
        };
        // `sim`, `sim:<engine>`, `sim,<options>`, `sim:<engine>,<options>`, each with its wire.
        if let Some(after) = head.strip_prefix("sim").filter(|a| a.is_empty() || a.starts_with([':', ','])) {
            return Self::open_sim(spec, after, wire);
        }
        if let Some(wire) = wire {
            return Err(RpcError::InvalidArgument(format!(
                "a wire (`+{wire}`) is chosen only for the simulator, as in sim+udp://127.0.0.1:0; {head:?} has its own"
            )));
        }
        let (kind, rest) = spec.split_once(':').unwrap_or((spec, ""));
        match kind {
            "verbs" => Self::open_verbs(rest),
            "urma" => Self::open_urma(rest),
            "vfio" => Self::open_vfio(rest),
            other => Err(RpcError::InvalidArgument(format!(
                "unknown backend {other:?} in {spec:?}: expected sim, sim:inline, sim:threaded, verbs or verbs:<device>[,option=value...], urma or urma:<device>[,lib=<path>][,eid=<index>], vfio:<pci-address>,ip=<IPv4>"
            ))),
        }
    }

    #[cfg(feature = "vfio")]
    fn open_vfio(rest: &str) -> Result<Backend, RpcError> {
        use bypass_sim::l2::{L2Addr, L2Attachment};
        use bypass_sim::{Engine, Fabric, FabricConfig};
        let Some((pci, opts)) = rest.split_once(',') else {
            return Err(RpcError::InvalidArgument(format!(
                "vfio:{rest} names no address for the NIC: expected vfio:<pci-address>,ip=<IPv4>[/prefix][,gw=<IPv4>], e.g. vfio:0000:00:03.0,ip=10.29.0.1/24"
            )));
        };
        no_empty_option(&format!("vfio:{rest}"), opts)?;
        let (opts, interrupts) = take_option(opts, "interrupts", parse_interrupts)?;
        let interrupts = interrupts.unwrap_or(true);
        let (opts, backoff) = take_option(
            opts.as_deref().unwrap_or(""),
            "ack_timeout_backoff",
            FabricConfig::parse_ack_timeout_backoff,
        )?;
        let addr = L2Addr::parse_options(opts.as_deref().unwrap_or("")).map_err(RpcError::InvalidArgument)?;
        let options = bypass_hal::vfio::VirtioNetOptions { interrupts, ..Default::default() };
        let port = bypass_hal::vfio::VirtioNet::open_with(pci, &options)
            .map_err(|e| RpcError::InvalidArgument(format!("cannot open the VFIO NIC {pci}: {e}")))?;
        let engine = Engine::Inline;
        // The transport is software in this process, as on the simulator's byte wires: its
        // retransmission waits back off unless the string says otherwise.
        let config = FabricConfig {
            ack_timeout_backoff: backoff.unwrap_or(Some(bypass_sim::BYTE_WIRE_ACK_TIMEOUT_BACKOFF)),
            ..FabricConfig::new(engine)
        };
        let fabric = Fabric::try_with_l2(config, vec![L2Attachment { port: Box::new(port), addr }])
            .map_err(RpcError::InvalidArgument)?;
        Ok(Backend::Sim { fabric, engine })
    }

    #[cfg(not(feature = "vfio"))]
    fn open_vfio(_: &str) -> Result<Backend, RpcError> {
        Err(not_compiled("vfio", "vfio"))
    }

    /// Opens the simulator: `after` is what follows `sim` before the wire (`""`, `:<engine>`,
    /// `,<options>` or `:<engine>,<options>`), `wire` what follows the `+`, options and all.
    #[cfg(feature = "sim")]
    fn open_sim(spec: &str, after: &str, wire: Option<&str>) -> Result<Backend, RpcError> {
        use bypass_sim::{Engine, Fabric, FabricConfig, WireConfig};
        let (engine, options) = match after.strip_prefix(':') {
            Some(rest) => match rest.split_once(',') {
                Some((engine, options)) => (Some(engine), Some(options)),
                None => (Some(rest), None),
            },
            None => (None, after.strip_prefix(',')),
        };
        let engine = match engine {
            None | Some("inline") => Engine::Inline,
            Some("threaded") => Engine::Threaded,
            Some("") => {
                return Err(RpcError::InvalidArgument(format!(
                    "{spec:?} names no engine after `sim:`: write sim (Inline), sim:inline or sim:threaded"
                )))
            }
            Some(other) => {
                return Err(RpcError::InvalidArgument(format!(
                    "unknown simulator engine {other:?}: expected sim:inline or sim:threaded (Stepped needs a test to drive it)"
                )))
            }
        };
        let defaults = FabricConfig::new(engine);
        let Some(wire) = wire else {
            // The in-process wire: `sim,ack_hold=off`, `sim:inline,ack_hold=5`.
            let mut config = defaults;
            if let Some(options) = options {
                no_empty_option(spec, options)?;
                let (unknown, hold) = take_option(options, "ack_hold", FabricConfig::parse_ack_hold)?;
                if let Some(unknown) = unknown {
                    return Err(RpcError::InvalidArgument(format!(
                        "unknown option(s) {unknown:?} for the simulator's in-process wire: it takes only \
                         ack_hold=<us>|off (e.g. sim:inline,ack_hold=off)"
                    )));
                }
                check_hold(spec, hold, &config)?;
                config.ack_hold = hold.unwrap_or(config.ack_hold);
            }
            let fabric = Fabric::try_with_config(config).map_err(RpcError::InvalidArgument)?;
            return Ok(Backend::Sim { fabric, engine });
        };
        if let Some(options) = options {
            return Err(RpcError::InvalidArgument(format!(
                "in {spec:?} the options ({options:?}) go after the wire when there is one, as in \
                 sim:inline+udp://127.0.0.1:0,ack_hold=off, not before it"
            )));
        }
        // Every wire here carries packets between NICs that are threads of ordinary processes,
        // which a loaded host deschedules for longer than `retry_count` fixed ACK timeouts: their
        // retransmission waits back off unless the string says otherwise.
        let (name, options) = match wire.split_once(',') {
            Some((name, options)) => (name, Some(options)),
            None => (wire, None),
        };
        let (backoff, hold, wire) = match options {
            None => (None, None, wire.to_string()),
            Some(options) => {
                no_empty_option(spec, options)?;
                let (rest, backoff) =
                    take_option(options, "ack_timeout_backoff", FabricConfig::parse_ack_timeout_backoff)?;
                let (rest, hold) = match rest {
                    Some(rest) => take_option(&rest, "ack_hold", FabricConfig::parse_ack_hold)?,
                    None => (None, None),
                };
                (backoff, hold, rest.map_or_else(|| name.to_string(), |rest| format!("{name},{rest}")))
            }
        };
        let l2 = bypass_sim::l2::parse_wire(&wire);
        let config = FabricConfig {
            wire: match l2 {
                Some(_) => WireConfig::L2,
                None => WireConfig::parse(&wire).map_err(RpcError::InvalidArgument)?,
            },
            ack_timeout_backoff: backoff.unwrap_or(Some(bypass_sim::BYTE_WIRE_ACK_TIMEOUT_BACKOFF)),
            ack_hold: hold.unwrap_or(defaults.ack_hold),
            ..defaults
        };
        check_hold(spec, hold, &config)?;
        let fabric = match l2 {
            Some(ports) => Fabric::try_with_l2(config, ports.map_err(RpcError::InvalidArgument)?),
            None => Fabric::try_with_config(config),
        };
        Ok(Backend::Sim { fabric: fabric.map_err(RpcError::InvalidArgument)?, engine })
    }

    #[cfg(not(feature = "sim"))]
    fn open_sim(_: &str, _: &str, _: Option<&str>) -> Result<Backend, RpcError> {
        Err(not_compiled("sim", "sim"))
    }

    #[cfg(feature = "verbs")]
    fn open_verbs(rest: &str) -> Result<Backend, RpcError> {
        Ok(Backend::Verbs(bypass_hal::verbs::VerbsDevice::open_spec(rest)?))
    }

    #[cfg(not(feature = "verbs"))]
    fn open_verbs(_: &str) -> Result<Backend, RpcError> {
        Err(not_compiled("verbs", "verbs"))
    }

    #[cfg(feature = "urma")]
    fn open_urma(rest: &str) -> Result<Backend, RpcError> {
        let server = bypass_hal::urma::UrmaDevice::open_spec(rest)?;
        let client = bypass_hal::urma::UrmaDevice::open_spec(rest)?;
        Ok(Backend::Urma { server, client })
    }

    #[cfg(not(feature = "urma"))]
    fn open_urma(_: &str) -> Result<Backend, RpcError> {
        Err(not_compiled("urma", "urma"))
    }

    /// A one-line description for reports (`sim (engine Inline)`, `verbs rxe0 ...`).
    pub fn describe(&self) -> String {
        match self {
            #[cfg(feature = "sim")]
            Backend::Sim { engine, fabric } => {
                let backoff = match fabric.config().ack_timeout_backoff {
                    Some(cap) => format!("ACK timeouts back off up to {cap:?}"),
                    None => "fixed ACK timeouts".into(),
                };
                // Only when the string changed it: which wires and engines hold ACKs is the
                // simulator's business (docs/sim.md).
                let hold = match fabric.config().ack_hold {
                    h if h == bypass_sim::FabricConfig::new(*engine).ack_hold => String::new(),
                    std::time::Duration::ZERO => ", ACKs never held".into(),
                    h => format!(", ACKs held up to {h:?}"),
                };
                format!("{}{hold}, {backoff}", Self::describe_sim(fabric, *engine))
            }
            #[cfg(feature = "verbs")]
            Backend::Verbs(d) => {
                let (gid_index, _) = d.gid();
                format!(
                    "verbs {} port {} GID index {} path MTU {}",
                    d.name(),
                    d.port(),
                    gid_index,
                    d.path_mtu()
                )
            }
            #[cfg(feature = "urma")]
            Backend::Urma { server, .. } => {
                let (_, eid_index) = server.eid();
                format!("urma {} EID index {eid_index} through {}", server.name(), server.library())
            }
            #[allow(unreachable_patterns)]
            _ => unreachable!("a Backend is always one of the compiled variants"),
        }
    }

    /// The simulator's part of [`describe`](Self::describe): its wire and engine.
    #[cfg(feature = "sim")]
    fn describe_sim(fabric: &bypass_sim::Fabric, engine: bypass_sim::Engine) -> String {
        match fabric.config().wire {
            bypass_sim::WireConfig::Udp(at) => {
                format!("sim (the software NIC) on the UDP wire at {at}, engine {engine:?}")
            }
            bypass_sim::WireConfig::Shm => {
                format!("sim (the software NIC) on the shared-memory wire (this host), engine {engine:?}")
            }
            bypass_sim::WireConfig::L2 => format!(
                "sim (the software NIC) on the L2 wire (RoCEv2 in Ethernet frames), path MTU {}, engine {engine:?}",
                fabric.config().mtu
            ),
            _ => format!("sim (the software NIC, in this process), engine {engine:?}"),
        }
    }

    /// A device of this backend, kept by the caller: on the simulator a new NIC on the fabric
    /// (an L2 fabric has one per port, so a second one on an AF_PACKET or VFIO port fails, as may
    /// binding a UDP socket), on verbs the device, on URMA the server's context (the servers and
    /// clients of one process share it, as they share a verbs device, and loop back).
    pub fn device(&self) -> Result<AnyDevice, RpcError> {
        match self {
            #[cfg(feature = "sim")]
            Backend::Sim { fabric, .. } => {
                fabric.try_add_nic().map(bypass_sim::SimNic::wrap::<Devices>).map_err(|e| {
                    RpcError::InvalidArgument(format!(
                        "cannot add a simulated NIC: {e}; give each server its own port or wire"
                    ))
                })
            }
            #[cfg(feature = "verbs")]
            Backend::Verbs(d) => Ok(bypass_hal::verbs::VerbsDevice::wrap::<Devices>(d.clone())),
            #[cfg(feature = "urma")]
            Backend::Urma { server, .. } => Ok(bypass_hal::urma::UrmaDevice::wrap::<Devices>(server.clone())),
            #[allow(unreachable_patterns)]
            _ => unreachable!("a Backend is always one of the compiled variants"),
        }
    }

    /// Runs `w` on a server and a client device of this backend.
    #[cfg_attr(not(any(feature = "sim", feature = "verbs", feature = "urma")), allow(unused_variables))]
    pub fn run<W: WithDevices>(&self, w: W) -> W::Output {
        match self {
            #[cfg(feature = "sim")]
            Backend::Sim { fabric, .. } => {
                let server = fabric.add_nic();
                // An L2 fabric with one port (AF_PACKET, VFIO) has one NIC: the client shares it
                // and its queues reach the server's through the wire's loopback, as on a verbs
                // device.
                let single =
                    fabric.config().wire == bypass_sim::WireConfig::L2 && fabric.l2_ports_left() == 0;
                let client = if single { server.clone() } else { fabric.add_nic() };
                w.run(&server, &client)
            }
            #[cfg(feature = "verbs")]
            Backend::Verbs(dev) => w.run(dev, dev),
            #[cfg(feature = "urma")]
            Backend::Urma { server, client } => w.run(server, client),
            #[allow(unreachable_patterns)]
            _ => unreachable!("a Backend is always one of the compiled variants"),
        }
    }
}

#[cfg(all(test, feature = "sim"))]
mod tests {
    use super::*;

    struct Caps;
    impl WithDevices for Caps {
        type Output = u32;
        fn run<D: Device + Clone>(self, server: &D, client: &D) -> u32 {
            server.caps().max_send_sge.min(client.caps().max_send_sge)
        }
    }

    #[test]
    fn opens_the_simulator() {
        for spec in ["sim", "sim:inline", "sim:threaded"] {
            let b = Backend::open(spec).unwrap();
            assert!(b.describe().starts_with("sim"), "{spec}: {}", b.describe());
            assert!(b.run(Caps) > 0);
        }
    }

    #[test]
    fn opens_the_simulator_on_the_udp_wire() {
        for spec in ["sim+udp://127.0.0.1:0", "sim:threaded+udp://127.0.0.1:0"] {
            let b = Backend::open(spec).unwrap();
            assert!(b.describe().contains("UDP wire at 127.0.0.1:0"), "{spec}: {}", b.describe());
            assert!(b.run(Caps) > 0);
        }
        let text = |s: &str| Backend::open(s).unwrap_err().to_string();
        assert!(text("sim+tcp://x").contains("udp://IP:PORT"), "{}", text("sim+tcp://x"));
        assert!(text("sim+udp://nowhere").contains("IPv4:port"), "{}", text("sim+udp://nowhere"));
        assert!(text("verbs+udp://1.2.3.4:0").contains("only for the simulator"));
        // Issue 30, defect 8: these opened, then panicked when a NIC was added.
        let e = text("sim+udp://0.0.0.0:0");
        assert!(e.contains("0.0.0.0:0") && e.contains("127.0.0.1:0"), "{e}");
        // 192.0.2.1 (TEST-NET-1, RFC 5737) is never an address of this host: nothing is sent there.
        let e = text("sim+udp://192.0.2.1:0");
        assert!(e.contains("no socket binds at 192.0.2.1"), "{e}");
    }

    #[test]
    fn opens_the_simulator_on_the_shared_memory_wire() {
        for spec in ["sim+shm", "sim:threaded+shm"] {
            let b = Backend::open(spec).unwrap();
            assert!(b.describe().contains("shared-memory wire"), "{spec}: {}", b.describe());
            assert!(b.run(Caps) > 0);
        }
        let text = |s: &str| Backend::open(s).unwrap_err().to_string();
        assert!(text("sim+shmem").contains("expected shm"), "{}", text("sim+shmem"));
        assert!(text("verbs+shm").contains("only for the simulator"));
    }

    /// `ack_hold=` reaches the fabric on the in-process wire (after the name or the engine) and
    /// on the byte wires (after the wire), and bad values or misplaced options say what to write.
    #[test]
    fn the_ack_hold_is_set_from_the_string() {
        let hold = |spec: &str| match Backend::open(spec).unwrap_or_else(|e| panic!("{spec}: {e}")) {
            Backend::Sim { fabric, .. } => fabric.config().ack_hold,
            #[allow(unreachable_patterns)]
            _ => unreachable!(),
        };
        let default = bypass_sim::FabricConfig::new(bypass_sim::Engine::Inline).ack_hold;
        assert_eq!(hold("sim"), default);
        assert_eq!(hold("sim,ack_hold=off"), std::time::Duration::ZERO);
        assert_eq!(hold("sim:inline,ack_hold=0"), std::time::Duration::ZERO);
        assert_eq!(hold("sim:inline,ack_hold=5"), std::time::Duration::from_micros(5));
        assert_eq!(
            hold("sim:threaded+udp://127.0.0.1:0,ack_hold=off,ack_timeout_backoff=off"),
            std::time::Duration::ZERO
        );
        assert_eq!(hold("sim+udp://127.0.0.1:0,ack_hold=7"), std::time::Duration::from_micros(7));
        assert_eq!(hold("sim+udp://127.0.0.1:0"), default);
        let b = Backend::open("sim,ack_hold=off").unwrap();
        assert!(b.describe().contains("ACKs never held"), "{}", b.describe());
        let err = |spec: &str| Backend::open(spec).unwrap_err().to_string();
        assert!(err("sim,ack_hold=1001").contains("1..=1000"), "{}", err("sim,ack_hold=1001"));
        assert!(err("sim,ack_hold=fast").contains("or off"), "{}", err("sim,ack_hold=fast"));
        assert!(err("sim:inline,mtu=1024").contains("only ack_hold"), "{}", err("sim:inline,mtu=1024"));
        assert!(
            err("sim:inline,ack_hold=off+shm").contains("after the wire"),
            "{}",
            err("sim:inline,ack_hold=off+shm")
        );
        // Where nothing would hold an ACK, the option is refused rather than silently ignored.
        for spec in ["sim:threaded,ack_hold=5", "sim+shm,ack_hold=off", "sim+l2:pair,ack_hold=3"] {
            let e = err(spec);
            assert!(e.contains("ack_hold=") && e.contains("UDP wire"), "{spec}: {e}");
        }
        // Every occurrence is checked, not only the last.
        let e = err("sim,ack_hold=2000,ack_hold=5");
        assert!(e.contains("\"2000\""), "{e}");
    }

    /// Strings that look almost right are refused, each saying what is wrong (the fuzz target
    /// `backend_string` found `sim:` opening the Inline engine).
    #[test]
    fn near_misses_are_refused_with_a_reason() {
        let err = |spec: &str| match Backend::open(spec) {
            Ok(b) => panic!("{spec:?} opened {}", b.describe()),
            Err(e) => e.to_string(),
        };
        for spec in ["sim:", "sim:+shm", "sim:,ack_hold=off"] {
            assert!(err(spec).contains("names no engine"), "{spec}: {}", err(spec));
        }
        for spec in
            ["sim,", "sim:inline,", "sim,ack_hold=off,", "sim+shm,", "sim+udp://127.0.0.1:0,,ack_hold=3"]
        {
            assert!(err(spec).contains("empty option"), "{spec}: {}", err(spec));
        }
        assert!(err("sim,ack_hold=off+shm").contains("go after the wire"), "{}", err("sim,ack_hold=off+shm"));
        assert!(err("simulator").contains("unknown backend"), "{}", err("simulator"));
        assert!(err("sims+shm").contains("only for the simulator"), "{}", err("sims+shm"));
    }

    /// The byte wires' NICs back off their retransmission waits unless the string turns it off
    /// (issue 28: a peer process descheduled for longer than 7 fixed ACK timeouts failed queues);
    /// the in-process wire keeps fixed timeouts.
    #[test]
    fn byte_wires_back_off_unless_told_otherwise() {
        let backoff = |spec: &str| match Backend::open(spec).unwrap() {
            Backend::Sim { fabric, .. } => fabric.config().ack_timeout_backoff,
            #[allow(unreachable_patterns)]
            _ => unreachable!(),
        };
        let on = Some(bypass_sim::BYTE_WIRE_ACK_TIMEOUT_BACKOFF);
        assert_eq!(backoff("sim"), None);
        assert_eq!(backoff("sim+udp://127.0.0.1:0"), on);
        assert_eq!(backoff("sim+shm"), on);
        assert_eq!(backoff("sim+l2:pair,loss_ppm=10"), on);
        assert_eq!(backoff("sim+udp://127.0.0.1:0,ack_timeout_backoff=off"), None);
        assert_eq!(backoff("sim:threaded+shm,ack_timeout_backoff=0"), None);
        assert_eq!(
            backoff("sim+l2:pair,ack_timeout_backoff=10,loss_ppm=10"),
            Some(std::time::Duration::from_nanos(4096 << 10))
        );
        assert_eq!(
            backoff("sim+shm,ack_timeout_backoff=off,ack_timeout_backoff=18"),
            on,
            "the last one counts"
        );
        let b = Backend::open("sim+udp://127.0.0.1:0").unwrap();
        assert!(b.describe().ends_with("ACK timeouts back off up to 1.073741824s"), "{}", b.describe());
        let b = Backend::open("sim+shm,ack_timeout_backoff=off").unwrap();
        assert!(b.describe().ends_with("fixed ACK timeouts"), "{}", b.describe());
        let e = Backend::open("sim+shm,ack_timeout_backoff=40").unwrap_err().to_string();
        assert!(e.contains("ack_timeout_backoff=\"40\"") && e.contains("1..=31"), "{e}");
        let e = Backend::open("sim+shm,loss_ppm=3").unwrap_err().to_string();
        assert!(e.contains("shm,loss_ppm=3"), "other options stay where they belong: {e}");
        let e =
            Backend::open("sim+shm,ack_timeout_backoff=40,ack_timeout_backoff=3").unwrap_err().to_string();
        assert!(e.contains("\"40\""), "a bad value is refused even where a later one overrides it: {e}");
        for bad in ["sim+ack_timeout_backoff=3,shm", "sim+shm,", "sim+shm,ack_timeout_backoff=3,"] {
            assert!(Backend::open(bad).is_err(), "{bad:?}: the wire comes first, and no empty option");
        }
    }

    #[test]
    fn bad_strings_say_what_is_accepted() {
        let text = |s: &str| Backend::open(s).unwrap_err().to_string();
        assert!(text("nic0").contains("unknown backend \"nic0\""), "{}", text("nic0"));
        assert!(text("sim:stepped").contains("Stepped needs a test"), "{}", text("sim:stepped"));
        #[cfg(not(feature = "urma"))]
        assert!(text("urma:x").contains("--features urma"), "{}", text("urma:x"));
        #[cfg(feature = "urma")]
        {
            let e = text("urma:udma0,lib=/nonexistent/liburma.so.0");
            assert!(e.contains("liburma not found") && e.contains("BYPASS_URMA_LIB"), "{e}");
            assert!(text("urma:udma0,speed=1").contains("unknown option"));
        }
        #[cfg(not(feature = "verbs"))]
        assert!(text("verbs:rxe0").contains("--features verbs"), "{}", text("verbs:rxe0"));
        #[cfg(not(feature = "vfio"))]
        assert!(text("vfio:0000:00:03.0,ip=10.29.0.1").contains("--features vfio"));
        #[cfg(feature = "vfio")]
        {
            let e = text("vfio:0000:00:03.0");
            assert!(e.contains("names no address") && e.contains("ip=<IPv4>"), "{e}");
            let e = text("vfio:0000:00:03.0,ip=10.29.0.300");
            assert!(e.contains("bad IPv4 address"), "{e}");
            // On a machine without this device bound to vfio-pci, the driver says why.
            let e = text("vfio:zz:00.0,ip=10.29.0.1");
            assert!(e.contains("cannot open the VFIO NIC zz:00.0"), "{e}");
            let e = text("vfio:zz:00.0,ip=10.29.0.1,interrupts=maybe");
            assert!(e.contains("interrupts=\"maybe\"") && e.contains("interrupts=off"), "{e}");
            let e = text("vfio:zz:00.0,ip=10.29.0.1,ack_timeout_backoff=99");
            assert!(e.contains("1..=31"), "{e}");
            // Well-formed options get as far as the device.
            let e = text("vfio:zz:00.0,interrupts=off,ip=10.29.0.1,ack_timeout_backoff=off");
            assert!(e.contains("cannot open the VFIO NIC zz:00.0"), "{e}");
        }
    }
}

/// The RPC conformance suite (`crate::conformance`) on the urma backend, over the liburma
/// `$BYPASS_URMA_LIB` names (the simulated one, or UMDK's on a UB host), with the device spec of
/// `$BYPASS_URMA_SPEC`: the server and the client on two contexts of one device, as
/// [`Backend::open`] runs `urma`. Without a loadable liburma every scenario prints why it skipped:
///
/// ```text
/// BYPASS_URMA_LIB=/path/liburma.so.0 cargo test -p bypass --features urma --lib backend::urma_rpc
/// ```
#[cfg(all(test, feature = "urma", feature = "conformance", not(loom)))]
mod urma_rpc_env {
    use bypass_hal::urma::{UrmaDevice, LIB_ENV, SPEC_ENV};
    use std::time::Duration;

    pub(super) struct UrmaRpcEnv {
        server: UrmaDevice,
        client: UrmaDevice,
    }

    impl UrmaRpcEnv {
        pub(super) fn from_env(test: &str) -> Option<Self> {
            let spec = std::env::var(SPEC_ENV).unwrap_or_default();
            match bypass_hal::urma::device_names(&bypass_hal::urma::parse_spec(&spec).ok()?.1) {
                Err(e) => {
                    eprintln!("SKIP {test}: {e} (set {LIB_ENV}=<path of a liburma.so.0>)");
                    None
                }
                Ok(_) => {
                    let open = || {
                        UrmaDevice::open_spec(&spec).unwrap_or_else(|e| panic!("{SPEC_ENV}={spec:?}: {e}"))
                    };
                    Some(UrmaRpcEnv { server: open(), client: open() })
                }
            }
        }
    }

    impl crate::conformance::Env for UrmaRpcEnv {
        type Dev = UrmaDevice;
        fn server(&self) -> &UrmaDevice {
            &self.server
        }
        fn client(&self) -> &UrmaDevice {
            &self.client
        }
        fn progress(&self) {}
        fn advance(&self, d: Duration) {
            std::thread::sleep(d);
        }
    }
}

#[cfg(all(test, feature = "urma", feature = "conformance", not(loom)))]
use urma_rpc_env::UrmaRpcEnv;

#[cfg(all(test, feature = "urma", feature = "conformance", not(loom)))]
crate::rpc_suite!(urma_rpc, skip_unless UrmaRpcEnv::from_env);
