//! A request being served ([`Request`]): its arguments (inline or fetched by rendezvous), the
//! reply (inline or written to the client's buffer), and the SERVER_DECLINE of a request
//! dropped unanswered.

use super::*;
use crate::conn::bufs::RecvBuf;

/// A request being handled. Read its arguments with [`Request::args`]; answer with
/// [`Request::reply`] (or [`Request::reply_with`], [`Request::reply_status`]) on any thread.
/// Dropped without a reply, it is dropped cleanly: its buffer is re-posted and its credit
/// returned, and a client waiting for a response gets it only as a timeout.
pub struct Request<D: Device + Clone> {
    pub(super) conn: Arc<Conn<D>>,
    /// The receive buffer the request came in, until it is given back (once: `give_back`).
    pub(super) buf: Option<RecvBuf>,
    pub(super) queue: usize,
    /// The queue's life it arrived in (a request of an earlier life gets no reply).
    pub(super) epoch: u32,
    pub(super) args: (u32, u32),
    pub(super) header: RequestHeader,
    pub(super) done: bool,
    /// Rendezvous state: gathered arguments, the client's response buffer (`None`: eager).
    pub(super) rndv: Option<Box<rndv::ReqRndv<D::Region>>>,
}

impl<D: Device + Clone> std::fmt::Debug for Request<D> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Request")
            .field("function", &self.header.function)
            .field("req_id", &self.header.req_id)
            .field("channel", &self.header.channel)
            .field("args", &(self.args.1 as usize))
            .finish()
    }
}

impl<D: Device + Clone> Request<D> {
    /// The function called.
    pub fn function(&self) -> FunctionId {
        self.header.function
    }

    /// The request id (unique among the client's outstanding calls).
    pub fn req_id(&self) -> u32 {
        self.header.req_id
    }

    /// The client's channel id.
    pub fn channel_id(&self) -> u32 {
        self.conn.channel_id
    }

    /// The info string the client sent when it connected.
    pub fn client_info(&self) -> &str {
        &self.conn.client_info
    }

    /// The connection's context value ([`Connection::set_context`]; 0 until set).
    pub fn context(&self) -> u64 {
        self.conn.live.context.load(Ordering::Acquire)
    }

    /// The connection the request came on (e.g. to read or set its context, or close it).
    pub fn connection(&self) -> Connection<D> {
        Connection { conn: self.conn.clone() }
    }

    /// Whether the client waits for a response (`WAIT_RSP` and `ACK` modes). For the other
    /// modes a reply sends nothing.
    pub fn wants_response(&self) -> bool {
        !self.header.no_response
    }

    /// Largest response data: what fits the client's message size, or the client's response
    /// buffer if it named a larger one (rendezvous response).
    pub fn max_response(&self) -> usize {
        self.inline_max().max(self.response_capacity().unwrap_or(0))
    }

    /// Largest response data sent inline (after the rendezvous prefix, if the request has one).
    pub(super) fn inline_max(&self) -> usize {
        self.conn.client_msg.min(self.conn.ep.msg_size) - ResponseHeader::LEN - self.prefix_len()
    }

    pub(super) fn prefix_len(&self) -> usize {
        if self.header.response_descriptor {
            wire::RNDV_PREFIX_LEN
        } else {
            0
        }
    }

    /// The arguments: inline, borrowed from the receive buffer (no copy), or for a rendezvous
    /// request the gathered bytes the server READ (see [`Request::segments`]).
    pub fn args(&self) -> &[u8] {
        if let Some(a) = self.rndv_args() {
            return a;
        }
        self.inline_args()
    }

    /// The inline arguments (after the descriptors) of the request message.
    pub fn inline_args(&self) -> &[u8] {
        let (off, len) = self.args;
        // The buffer is given back only as the request is consumed (its reply, its drop).
        let Some(buf) = &self.buf else { return &[] };
        let bytes = self.conn.ep.recv_bytes(buf, (off + len) as usize);
        bytes.get(off as usize..).unwrap_or(&[])
    }

    /// Gives the request's receive buffer back (the first call only), with its credit if
    /// `grant`.
    pub(super) fn give_back(&mut self, grant: bool) {
        if let Some(buf) = self.buf.take() {
            self.conn.release(self.queue, buf, grant);
        }
    }

    /// Replies SUCCESS with `data`.
    pub fn reply(self, data: &[u8]) -> Result<(), RpcError> {
        self.reply_status(Status::Success, data)
    }

    /// Replies with `status` and `data`.
    pub fn reply_status(self, status: Status, data: &[u8]) -> Result<(), RpcError> {
        if self.wants_large_reply(data.len()) {
            return rndv::reply_large(self, status, rndv::Source::Copy(data));
        }
        self.reply_with(status, |_, out| {
            out.get_mut(..data.len()).map(|o| o.copy_from_slice(data)).map(|()| data.len()).ok_or(data.len())
        })
    }

    /// Replies with `status` and data written by `fill(args, out)` straight into the send buffer
    /// (no intermediate copy): `fill` returns the bytes written, or `Err(needed)` if `out` is too
    /// small, which sends REMOTE_LEN_ERR instead and returns [`RpcError::TooLarge`].
    ///
    /// If `fill` panics, the request is answered SERVER_DECLINE (its buffer and send context go
    /// back as for any reply) and the panic then continues.
    pub fn reply_with(
        mut self,
        status: Status,
        fill: impl FnOnce(&[u8], &mut [u8]) -> Result<usize, usize>,
    ) -> Result<(), RpcError> {
        self.respond(status, fill)
    }

    /// Every reply, and the SERVER_DECLINE of a request dropped by a panic. Marks the request
    /// done first: it is consumed exactly once.
    pub(super) fn respond(
        &mut self,
        status: Status,
        fill: impl FnOnce(&[u8], &mut [u8]) -> Result<usize, usize>,
    ) -> Result<(), RpcError> {
        self.done = true;
        if self.stale() {
            // Its queue was recovered since: the client failed this call already, and the
            // buffer (but no credit) belongs to the queue's new life.
            self.give_back(false);
            bump(&self.conn.counters.failed_replies);
            return Err(RpcError::Queue(hal::Status::Flushed));
        }
        if self.header.no_response {
            self.give_back(true);
            return Ok(());
        }
        let mut tx = match self.conn.acquire_tx() {
            Ok(tx) => tx,
            Err(e) => {
                self.give_back(true);
                bump(&self.conn.counters.failed_replies);
                return Err(e);
            }
        };
        let conn = &self.conn;
        let prefix = self.prefix_len();
        let limit = self.inline_max() + ResponseHeader::LEN;
        let out = &mut conn.ep.send_buf(&mut tx)[..limit + prefix];
        let (header_bytes, body) = out.split_at_mut(ResponseHeader::LEN);
        // A rendezvous request's response starts with the written length: 0, the data is inline.
        let (prefix_bytes, body) = body.split_at_mut(prefix);
        prefix_bytes.fill(0);
        // `fill` is the caller's code: if it panics, the context and the buffer must still go
        // back, so the panic is held until the request has been answered. AssertUnwindSafe:
        // after a panic `body` is not read (the response carries no data).
        let args = self.args();
        let filled = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| fill(args, body)));
        let mut panicked = None;
        let (status, len, result) = match filled {
            Ok(Ok(n)) if n <= limit - ResponseHeader::LEN => (status, n, Ok(())),
            Ok(Ok(n) | Err(n)) => (
                Status::RemoteLenErr,
                0,
                Err(RpcError::TooLarge {
                    len: n + ResponseHeader::LEN,
                    max: limit,
                    header: ResponseHeader::LEN,
                }),
            ),
            Err(payload) => {
                panicked = Some(payload);
                (Status::ServerDecline, 0, Ok(()))
            }
        };
        let header = ResponseHeader {
            ack: false,
            status,
            req_id_range: wire::REQ_ID_RANGE_SINGLE,
            req_id: self.header.req_id,
            channel: conn.channel_id,
            function_defined: self.header.function_defined,
            total_size: (ResponseHeader::LEN + prefix + len) as u32,
        };
        let buf = self.buf.take();
        let sent = if let Err(e) = header.encode(header_bytes) {
            if let Some(buf) = buf {
                conn.release(self.queue, buf, true);
            }
            conn.drop_tx(tx);
            Err(RpcError::InvalidArgument(format!("cannot encode the response: {e}")))
        } else {
            // The response returns the credit: the buffer must be posted again first.
            if let Some(buf) = buf {
                conn.release(self.queue, buf, false);
            }
            if trace::is_enabled() {
                let args = [
                    ("req_id", self.header.req_id.into()),
                    ("status", status_name(status).into()),
                    ("len", len.into()),
                    ("now", (!conn.dispatching()).into()),
                ];
                trace("reply", &args);
            }
            match conn.send(self.queue, tx, ResponseHeader::LEN + prefix + len) {
                Ok(()) => {
                    if !liveness::is_probe(self.header.function) {
                        bump(&conn.counters.responses);
                    }
                    result
                }
                Err(e) => {
                    bump(&conn.counters.failed_replies);
                    Err(e)
                }
            }
        };
        if let Some(payload) = panicked {
            std::panic::resume_unwind(payload);
        }
        sent
    }
}

impl<D: Device + Clone> Drop for Request<D> {
    fn drop(&mut self) {
        if self.done {
            return;
        }
        if std::thread::panicking() {
            // Dropped by a panic (its handler's, or that of a thread it was handed to): answer
            // SERVER_DECLINE now rather than let the caller wait out its deadline. Nothing here
            // panics, so this is safe during unwinding.
            if trace::is_enabled() {
                trace("request declined (panic)", &[("req_id", self.header.req_id.into())]);
            }
            let _ = self.respond(Status::ServerDecline, |_, _| Ok(0));
            return;
        }
        if trace::is_enabled() {
            trace("request dropped", &[("req_id", self.header.req_id.into())]);
        }
        bump(&self.conn.counters.dropped);
        let grant = !self.stale();
        self.give_back(grant);
    }
}

impl<D: Device + Clone> Request<D> {
    /// Whether the request's queue was recovered since it arrived.
    pub(super) fn stale(&self) -> bool {
        self.conn.ep.queues[self.queue].epoch.load(Ordering::Acquire) != self.epoch
    }
}
