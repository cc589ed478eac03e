//! A served fabric: two simulated NICs and a server on one of them with ECHO and HOLD (the
//! requests HOLD keeps go to [`Served::held`]), every accepted connection recorded, and no
//! channel yet: for tests that open their channels themselves (keepalive, client info, several
//! channels) and reach the server's side of each ([`Served::conn`]). [`super::rig::Rig`] is the
//! rig with a channel.

use super::helpers::{echo_and_hold, Held};
use bypass::sim::{Fabric, SimNic};
use bypass::*;
use std::sync::{Arc, Mutex};

pub struct Served {
    pub fabric: Fabric,
    pub snic: SimNic,
    pub cnic: SimNic,
    pub server: Server<SimNic>,
    pub held: Held,
    /// The connections the server accepted, in order.
    pub conns: Arc<Mutex<Vec<Connection<SimNic>>>>,
}

impl Served {
    /// A server named as `config` on a new NIC of `fabric` (and a client NIC after it). `admit`
    /// runs first for each new connection (an `Err` refuses it; an accepted one is recorded);
    /// `setup` adds functions and the other connection events.
    pub fn build(
        fabric: Fabric,
        config: ServerConfig,
        admit: impl Fn(&Connection<SimNic>) -> Result<(), String> + Send + Sync + 'static,
        setup: impl FnOnce(&mut Functions<SimNic>, ConnectionEvents<SimNic>) -> ConnectionEvents<SimNic>,
    ) -> Served {
        let (snic, cnic) = (fabric.add_nic(), fabric.add_nic());
        let held = Held::default();
        let mut functions = echo_and_hold(&held);
        let conns: Arc<Mutex<Vec<Connection<SimNic>>>> = Arc::default();
        let c = conns.clone();
        let events = setup(&mut functions, ConnectionEvents::new()).on_connect(move |conn| {
            admit(conn)?;
            c.lock().unwrap().push(conn.clone());
            Ok(())
        });
        let server = Server::bind_with(&snic, "127.0.0.1:0", config, functions, events).expect("bind");
        Served { fabric, snic, cnic, server, held, conns }
    }

    /// A channel from the client NIC with `config`.
    pub fn connect(&self, config: ChannelConfig) -> Result<Channel<SimNic>, RpcError> {
        Channel::connect(&self.cnic, self.server.local_addr(), config)
    }

    /// The server's side of the channel `channel_id`.
    pub fn conn(&self, channel_id: u32) -> Connection<SimNic> {
        let conns = self.conns.lock().unwrap();
        conns.iter().find(|c| c.channel_id() == channel_id).cloned().expect("the server-side connection")
    }

    /// How many requests HOLD keeps.
    pub fn held(&self) -> usize {
        self.held.lock().unwrap().len()
    }
}

impl Drop for Served {
    /// The server's connect hook holds `conns`, and HOLD's handler holds `held`; what they hold
    /// (connections, requests) holds the server. Emptying both when the rig goes breaks that
    /// cycle, so a test's fabric, NICs and server are freed with it (LeakSanitizer checks).
    fn drop(&mut self) {
        self.conns.lock().unwrap_or_else(|e| e.into_inner()).clear();
        self.held.lock().unwrap_or_else(|e| e.into_inner()).clear();
    }
}
