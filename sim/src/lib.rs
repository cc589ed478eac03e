//! # bypass-sim: a software NIC
//!
//! A simulated RDMA-style NIC that implements [`bypass_hal`], split the way hardware is:
//!
//! - the **driver** ([`SimNic`], [`SimRegion`], [`SimCq`], [`SimQueue`]) writes 64-byte-block
//!   WQEs into send and receive rings, fences, and rings a doorbell with the producer index; it
//!   polls 64-byte CQEs by owner bit and maps ring slots back to `wr_id`s with side tables;
//! - the **device** fetches WQEs, checks keys, bounds and access rights, moves data, runs a
//!   reliable-connected transport (PSNs, ACK/NAK, go-back-N retransmission on a timer, RNR NAK and
//!   retry with 7 = forever, retry exhaustion → error completion and queue ERROR) and writes CQEs;
//! - a **wire** ([`wire::Wire`]) carries packets between NICs: the in-process wire, optionally
//!   behind a seeded fault wire that drops, duplicates and reorders ([`FaultPlan`]).
//!
//! The [`Engine`] decides who runs the device: the application's own threads on doorbells and
//! polls (`Inline`), a device thread per NIC (`Threaded`), or a test, one seeded-random unit at a
//! time under a virtual clock (`Stepped`). `docs/sim.md` describes the device model for hardware engineers.
//!
//! ```
//! use bypass_hal::*;
//! use bypass_sim::{Engine, Fabric};
//!
//! let fabric = Fabric::new(Engine::Inline);
//! let (nic_a, nic_b) = (fabric.add_nic(), fabric.add_nic());
//! let cfg = QueueConfig::default();
//! let (mut cq_a, mut cq_b) = (nic_a.create_cq(256).unwrap(), nic_b.create_cq(256).unwrap());
//! let mut qa = nic_a.create_queue(&cfg, &cq_a, &cq_a).unwrap();
//! let mut qb = nic_b.create_queue(&cfg, &cq_b, &cq_b).unwrap();
//! let (ia, ib) = (qa.info(), qb.info());
//! qa.connect(&ib).unwrap();
//! qb.connect(&ia).unwrap();
//!
//! let src = nic_a.register(64, Access::empty()).unwrap();
//! let dst = nic_b.register(64, Access::LOCAL_WRITE).unwrap();
//! src.write(0, b"hello, NIC").unwrap();
//! qb.post_recv(&[RecvWr { wr_id: 7, sges: &[dst.sge(0, 64).unwrap()] }]).unwrap();
//! qa.post_send(&[SendWr::send(1, &[src.sge(0, 10).unwrap()])]).unwrap();
//!
//! let mut wc = [Completion::default(); 4];
//! assert_eq!(cq_b.poll(&mut wc).unwrap(), 1);
//! assert_eq!((wc[0].wr_id, wc[0].byte_len, wc[0].status), (7, 10, Status::Success));
//! let mut got = [0u8; 10];
//! dst.read(0, &mut got).unwrap();
//! assert_eq!(&got, b"hello, NIC");
//! ```

mod clock;
mod device;
mod driver;
mod eventfd;
mod fabric;
mod fault;
pub mod layout;
mod nic;
pub mod packet;
mod ring;
mod shared;
mod sync;
pub mod wire;

pub use device::NicStats;
pub use driver::{SimCq, SimNic, SimQueue, SimRegion};
pub use fabric::{Engine, Fabric, FabricConfig};
pub use fault::{FaultPlan, FaultStats};
