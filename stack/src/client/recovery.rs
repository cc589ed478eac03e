//! Queue recovery on the client (see [`crate::recovery`]).

use super::ChannelInner;
use crate::hal::Device;
use std::net::TcpStream;

impl<D: Device + Clone> ChannelInner<D> {
    /// Recovers the queues that asked for it (monitor thread).
    pub(super) fn recover_pending(&self, _stream: &mut TcpStream) {}
}
