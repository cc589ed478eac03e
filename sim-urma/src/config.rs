//! The library's configuration: one environment variable, read by `urma_init`.
//!
//! `BYPASS_SIM_URMA` is a comma-separated list; every part is optional:
//!
//! | part | meaning | default |
//! |---|---|---|
//! | `inproc` | the in-process wire: devices of this process reach each other only | yes |
//! | `shm` | the shared-memory wire: processes of this host | |
//! | `udp://IP:PORT` | the UDP wire: processes and hosts; device `i` binds `PORT+i` (0: any free port) | |
//! | `engine=inline` / `engine=threaded` | who runs the simulated device (see `docs/sim.md`) | `inline` |
//! | `devices=N` | how many devices, `bypass_sim0` .. `bypass_sim{N-1}` (1..=16) | 2 |
//! | `ack_timeout_floor=N` | the least ACK timeout a jetty gets, as an `err_timeout` exponent (4.096 µs × 2^N, 0..=31) | 12 (16.8 ms) on `shm` and `udp`, 0 on `inproc` |
//! | `ack_timeout_backoff=N` | the longest a retransmission wait grows to, as an exponent (4.096 µs × 2^N, 1..=31); `0` or `off`: every wait is the ACK timeout | 18 (1.07 s) on `shm` and `udp`, off on `inproc` |
//! | `stats` | print each device's counters (packets, retransmissions, timeouts, RNR NAKs, queue errors) to stderr at `urma_uninit` or process exit | off |
//!
//! **ACK timeout floor.** A jetty's `err_timeout` asks for an ACK timeout of 4.096 µs × 2^N (URPC
//! asks N = 2, 16.4 µs). Hardware honours such a value only down to its timer granularity (rxe
//! counts in jiffies, 1–10 ms), and on the byte wires a hop is a socket or a ring that another
//! process's thread drains when the OS schedules it: on a loaded host that takes milliseconds,
//! and a 16 µs timeout then retransmits until the retry count runs out (URPC's first request
//! failed with an ACK timeout in one run of eleven over UDP). So on those wires a smaller
//! `err_timeout` is raised to the floor; `ack_timeout_floor=0` gives the exact value back.
//!
//! **ACK timeout backoff.** The floor does not cover a process the host stops for longer than
//! the whole retry budget: seven retransmissions at a fixed 16.8 ms give up after ~134 ms, and a
//! loaded 2-vCPU host deschedules a process (its simulated device with it) for longer than that
//! (UMDK's perftest QPS and `urma_sample -m 0 -e` failed so over UDP). On the byte wires each
//! timeout without progress therefore doubles the next wait, up to 2^18 × 4.096 µs = 1.07 s, and
//! an acknowledgement that makes progress brings it back (`bypass_sim::FabricConfig::
//! ack_timeout_backoff`): a jetty then gives up after ~3.2 s without an answer instead of
//! ~134 ms. Real UB and RDMA NICs do not need this — hardware is not descheduled — so it models
//! the simulator's host, not UDMA. `ack_timeout_backoff=0` turns it off (with
//! `ack_timeout_floor=0`, the timer is exactly the hardware's: the jetty's `err_timeout`, fixed).

use bypass_sim::{Engine, FabricConfig, WireConfig, BYTE_WIRE_ACK_TIMEOUT_BACKOFF};

/// The variable `urma_init` reads.
pub const ENV: &str = "BYPASS_SIM_URMA";

/// The default ACK timeout floor on the byte wires: 4.096 µs × 2^12 = 16.8 ms (see the module
/// docs).
pub const BYTE_WIRE_ACK_TIMEOUT_FLOOR: u8 = 12;

/// Most devices one process may configure.
pub const MAX_DEVICES: usize = 16;

/// What `BYPASS_SIM_URMA` asked for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Config {
    /// The wire between NICs.
    pub wire: WireConfig,
    /// The engine.
    pub engine: Engine,
    /// Number of devices.
    pub devices: usize,
    /// `ack_timeout_floor=`, if given: the least `err_timeout` exponent a jetty gets.
    pub ack_timeout_floor: Option<u8>,
    /// `ack_timeout_backoff=`, if given: the cap, `None` for off.
    pub ack_timeout_backoff: Option<Option<std::time::Duration>>,
    /// `stats`: print the devices' counters at `urma_uninit` or exit.
    pub stats: bool,
}

impl Default for Config {
    fn default() -> Self {
        Config {
            wire: WireConfig::InProcess,
            engine: Engine::Inline,
            devices: 2,
            ack_timeout_floor: None,
            ack_timeout_backoff: None,
            stats: false,
        }
    }
}

impl Config {
    /// Reads [`ENV`] (unset or empty: the defaults).
    pub fn from_env() -> Result<Config, String> {
        match std::env::var(ENV) {
            Ok(v) => Self::parse(&v),
            Err(std::env::VarError::NotPresent) => Ok(Config::default()),
            Err(e) => Err(format!("{ENV} is not valid UTF-8 ({e})")),
        }
    }

    /// Parses a value of [`ENV`].
    pub fn parse(s: &str) -> Result<Config, String> {
        let mut c = Config::default();
        for part in s.split(',').map(str::trim).filter(|p| !p.is_empty()) {
            if let Some(e) = part.strip_prefix("engine=") {
                c.engine = match e {
                    "inline" => Engine::Inline,
                    "threaded" => Engine::Threaded,
                    other => {
                        return Err(format!(
                            "{ENV}: unknown engine {other:?}: expected engine=inline or engine=threaded"
                        ))
                    }
                };
            } else if let Some(n) = part.strip_prefix("devices=") {
                c.devices =
                    n.parse::<usize>().ok().filter(|n| (1..=MAX_DEVICES).contains(n)).ok_or_else(|| {
                        format!("{ENV}: devices={n:?} must be a number in 1..={MAX_DEVICES}")
                    })?;
            } else if let Some(n) = part.strip_prefix("ack_timeout_floor=") {
                c.ack_timeout_floor = Some(n.parse::<u8>().ok().filter(|n| *n <= 31).ok_or_else(|| {
                    format!(
                        "{ENV}: ack_timeout_floor={n:?} must be an err_timeout exponent in 0..=31 (4.096 us x 2^N)"
                    )
                })?);
            } else if let Some(n) = part.strip_prefix("ack_timeout_backoff=") {
                c.ack_timeout_backoff =
                    Some(FabricConfig::parse_ack_timeout_backoff(n).map_err(|e| format!("{ENV}: {e}"))?);
            } else if part == "stats" {
                c.stats = true;
            } else if part == "inproc" {
                c.wire = WireConfig::InProcess;
            } else {
                c.wire = WireConfig::parse(part).map_err(|e| {
                    format!(
                        "{ENV}: {e}; or inproc, engine=inline|threaded, devices=N, ack_timeout_floor=N, \
                         ack_timeout_backoff=N|off, stats (comma-separated)"
                    )
                })?;
            }
        }
        Ok(c)
    }

    /// The least `err_timeout` exponent a jetty gets: the one asked for, else
    /// [`BYTE_WIRE_ACK_TIMEOUT_FLOOR`] on the shared-memory and UDP wires and none in process.
    pub fn ack_timeout_floor(&self) -> u8 {
        self.ack_timeout_floor.unwrap_or(match self.wire {
            WireConfig::Udp(_) | WireConfig::Shm => BYTE_WIRE_ACK_TIMEOUT_FLOOR,
            _ => 0,
        })
    }

    /// The retransmission backoff's cap ([`bypass_sim::FabricConfig::ack_timeout_backoff`]):
    /// the one asked for, else [`BYTE_WIRE_ACK_TIMEOUT_BACKOFF`] on the shared-memory and UDP
    /// wires and none in process; `None` when off.
    pub fn ack_timeout_backoff(&self) -> Option<std::time::Duration> {
        self.ack_timeout_backoff.unwrap_or(match self.wire {
            WireConfig::Udp(_) | WireConfig::Shm => Some(BYTE_WIRE_ACK_TIMEOUT_BACKOFF),
            _ => None,
        })
    }

    /// One line for logs.
    pub fn describe(&self) -> String {
        let wire = match self.wire {
            WireConfig::Udp(a) => format!("udp://{a}"),
            WireConfig::Shm => "shm".into(),
            _ => "inproc".into(),
        };
        let backoff = match self.ack_timeout_backoff() {
            Some(cap) => format!("doubling up to {cap:?}"),
            None => "fixed".into(),
        };
        format!(
            "{} device(s) on the {wire} wire, engine {:?}, ACK timeout floor 2^{} x 4.096 us, {backoff}",
            self.devices,
            self.engine,
            self.ack_timeout_floor()
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_every_part_and_refuses_nonsense() {
        assert_eq!(Config::parse("").unwrap(), Config::default());
        let c = Config::parse("udp://127.0.0.1:7000, engine=threaded,devices=3").unwrap();
        assert_eq!(c.wire, WireConfig::Udp("127.0.0.1:7000".parse().unwrap()));
        assert_eq!((c.engine, c.devices), (Engine::Threaded, 3));
        assert_eq!(Config::parse("shm").unwrap().wire, WireConfig::Shm);
        assert!(Config::parse("devices=0").unwrap_err().contains("1..=16"));
        assert!(Config::parse("engine=stepped").unwrap_err().contains("engine=inline"));
        assert!(Config::parse("tcp://x").unwrap_err().contains("unknown simulator wire"));
        assert_eq!(Config::parse("inproc").unwrap().ack_timeout_floor(), 0);
        assert_eq!(Config::parse("shm").unwrap().ack_timeout_floor(), BYTE_WIRE_ACK_TIMEOUT_FLOOR);
        assert_eq!(Config::parse("udp://127.0.0.1:0,ack_timeout_floor=0").unwrap().ack_timeout_floor(), 0);
        assert_eq!(Config::parse("ack_timeout_floor=14").unwrap().ack_timeout_floor(), 14);
        assert!(Config::parse("ack_timeout_floor=32").unwrap_err().contains("0..=31"));
        let cap = |s: &str| Config::parse(s).unwrap().ack_timeout_backoff();
        assert_eq!(cap("inproc"), None);
        assert_eq!(cap("shm"), Some(std::time::Duration::from_nanos(4096 << 18)));
        assert_eq!(cap("udp://127.0.0.1:0"), cap("shm"));
        assert_eq!(cap("shm,ack_timeout_backoff=0"), None);
        assert_eq!(cap("shm,ack_timeout_backoff=off"), None);
        assert_eq!(cap("ack_timeout_backoff=10"), Some(std::time::Duration::from_nanos(4096 << 10)));
        assert!(Config::parse("ack_timeout_backoff=32").unwrap_err().contains("1..=31"));
        assert!(Config::parse("ack_timeout_backoff=on").unwrap_err().contains("or off"));
        assert!(!Config::parse("shm").unwrap().stats);
        assert!(Config::parse("shm,stats").unwrap().stats);
    }
}
