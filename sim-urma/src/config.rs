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

use bypass_sim::{Engine, WireConfig};

/// The variable `urma_init` reads.
pub const ENV: &str = "BYPASS_SIM_URMA";

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
}

impl Default for Config {
    fn default() -> Self {
        Config { wire: WireConfig::InProcess, engine: Engine::Inline, devices: 2 }
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
            } else if part == "inproc" {
                c.wire = WireConfig::InProcess;
            } else {
                c.wire = WireConfig::parse(part).map_err(|e| {
                    format!("{ENV}: {e}; or inproc, engine=inline|threaded, devices=N (comma-separated)")
                })?;
            }
        }
        Ok(c)
    }

    /// One line for logs.
    pub fn describe(&self) -> String {
        let wire = match self.wire {
            WireConfig::Udp(a) => format!("udp://{a}"),
            WireConfig::Shm => "shm".into(),
            _ => "inproc".into(),
        };
        format!("{} device(s) on the {wire} wire, engine {:?}", self.devices, self.engine)
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
    }
}
