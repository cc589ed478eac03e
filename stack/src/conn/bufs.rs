//! Who owns an endpoint's message buffers, carried by types, so that the views of them
//! ([`Endpoint::send_buf`](super::endpoint::Endpoint::send_buf),
//! [`Endpoint::recv_bytes`](super::endpoint::Endpoint::recv_bytes)) are safe functions and the
//! `unsafe` that makes a slice of registered memory stays in `conn/`.
//!
//! - A [`TxToken`] is the one right to write a send context's buffer and to post it. Only the
//!   endpoint makes one ([`Endpoint::get_tx`](super::endpoint::Endpoint::get_tx)), from a context
//!   the slab has just handed out; it is neither `Copy` nor `Clone`, and a post consumes it
//!   (a post that fails hands it back in an [`Unposted`], so nothing leaks silently). The
//!   [`TxHandle`] it wraps stays `Copy`: it is the slab's key and the `wr_id` the device reports
//!   back, and names the context without any access to its buffer.
//! - A [`RecvBuf`] is the one right to read a received buffer. Only the endpoint's receive poll
//!   makes one, once per completion of a buffer ([`Received`]); it is neither `Copy` nor
//!   `Clone`, and giving the buffer back (re-post, park) consumes it.
//!
//! Both are the old `u64` / `u32` in a `#[repr(transparent)]` wrapper: moving them is the same
//! code as copying the bare values was.

use crate::core::tx_ctx::TxHandle;
use crate::hal::Completion;
use crate::limits::MAX_REPOST_BATCH;
use crate::RpcError;

/// The one right to write send context [`handle`](Self::handle)'s buffer and post it (see the
/// module docs). Given back unposted with [`Endpoint::discard_tx`](super::endpoint::Endpoint::discard_tx).
#[must_use = "a send context is posted or given back (Endpoint::discard_tx); dropped, it leaks"]
#[derive(Debug, PartialEq, Eq)]
#[repr(transparent)]
pub(crate) struct TxToken(TxHandle);

impl TxToken {
    /// Only the endpoint mints tokens, from a context just taken from its slab.
    pub(super) const fn mint(h: TxHandle) -> Self {
        TxToken(h)
    }

    /// The context's handle: its key in the slab and its `wr_id` once posted.
    #[inline]
    pub(crate) const fn handle(&self) -> TxHandle {
        self.0
    }

    /// Consumes the token (a post, a give-back).
    pub(super) const fn spend(self) -> TxHandle {
        self.0
    }
}

/// A send that was not posted: the token comes back with the reason.
#[derive(Debug)]
#[must_use = "the token of an unposted send is given back (Endpoint::discard_tx) or posted again"]
pub(crate) struct Unposted {
    pub(crate) tx: TxToken,
    pub(crate) error: RpcError,
}

/// Up to [`MAX_REPOST_BATCH`] sends for one doorbell
/// ([`Endpoint::post_sends`](super::endpoint::Endpoint::post_sends)): `(context, length)`, each
/// pushed with its token, in post order.
#[derive(Debug)]
pub(crate) struct SendList {
    /// `items[..len]` are tokens this list holds (moved in by `push`).
    items: [(TxHandle, u32); MAX_REPOST_BATCH],
    len: usize,
}

impl Default for SendList {
    fn default() -> Self {
        SendList { items: [(TxHandle::from_u64(0), 0); MAX_REPOST_BATCH], len: 0 }
    }
}

impl SendList {
    /// Adds a send of the first `len` bytes of `tx`'s buffer. The list must not be full (its
    /// owners post it when it fills).
    #[track_caller]
    pub(crate) fn push(&mut self, tx: TxToken, len: u32) {
        assert!(self.len < MAX_REPOST_BATCH, "a full send list is posted before it takes more");
        self.items[self.len] = (tx.spend(), len);
        self.len += 1;
    }

    /// Sends in the list.
    pub(crate) fn len(&self) -> usize {
        self.len
    }

    pub(crate) fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Whether the list holds [`MAX_REPOST_BATCH`] sends.
    pub(crate) fn is_full(&self) -> bool {
        self.len == MAX_REPOST_BATCH
    }

    /// Takes the last send back out.
    pub(crate) fn pop(&mut self) -> Option<(TxToken, u32)> {
        self.len = self.len.checked_sub(1)?;
        let (h, len) = self.items[self.len];
        Some((TxToken::mint(h), len))
    }

    /// Takes every send back out, in post order (after a failed post: nothing was posted).
    pub(crate) fn drain(&mut self) -> impl Iterator<Item = (TxToken, u32)> + '_ {
        let n = std::mem::take(&mut self.len);
        self.items[..n].iter().map(|&(h, len)| (TxToken::mint(h), len))
    }

    /// The sends, for the post (conn only: the tokens stay in the list).
    pub(super) fn items(&self) -> &[(TxHandle, u32)] {
        &self.items[..self.len]
    }

    /// The post took every send: the tokens are spent.
    pub(super) fn spent(&mut self) {
        self.len = 0;
    }
}

/// The one right to read a received buffer, from its completion until it is given back
/// ([`Endpoint::repost`](super::endpoint::Endpoint::repost),
/// [`Endpoint::park`](super::endpoint::Endpoint::park)); see the module docs.
#[must_use = "a received buffer is given back (Endpoint::repost or park); dropped, it leaks"]
#[derive(Debug, PartialEq, Eq)]
#[repr(transparent)]
pub(crate) struct RecvBuf(u32);

impl RecvBuf {
    /// Only the endpoint mints receive buffers, from a completion it polled.
    pub(super) const fn mint(buf: u32) -> Self {
        RecvBuf(buf)
    }

    /// The buffer's index (its `wr_id`).
    #[inline]
    pub(crate) const fn index(&self) -> u32 {
        self.0
    }

    /// Consumes the buffer (it is given back).
    pub(super) const fn spend(self) -> u32 {
        self.0
    }
}

/// The completions of one receive poll. Iterating (by value: once) yields each completion with
/// the [`RecvBuf`] it hands over if it names one of the endpoint's buffers (`None`: a drain
/// marker, or a bogus `wr_id`).
pub(crate) struct Received<'a> {
    pub(super) done: &'a [Completion],
    /// `wr_id`s below this name the endpoint's buffers (own or the shared pool's).
    pub(super) bufs: u64,
}

impl<'a> Received<'a> {
    /// Completions polled.
    pub(crate) fn len(&self) -> usize {
        self.done.len()
    }

    pub(crate) fn is_empty(&self) -> bool {
        self.done.is_empty()
    }
}

impl<'a> IntoIterator for Received<'a> {
    type Item = (&'a Completion, Option<RecvBuf>);
    type IntoIter = ReceivedIter<'a>;

    fn into_iter(self) -> ReceivedIter<'a> {
        ReceivedIter { done: self.done.iter(), bufs: self.bufs }
    }
}

/// See [`Received`].
pub(crate) struct ReceivedIter<'a> {
    done: std::slice::Iter<'a, Completion>,
    bufs: u64,
}

impl<'a> Iterator for ReceivedIter<'a> {
    type Item = (&'a Completion, Option<RecvBuf>);

    #[inline]
    fn next(&mut self) -> Option<Self::Item> {
        let c = self.done.next()?;
        // Each polled completion is yielded once, so each buffer it hands over is minted once.
        Some((c, (c.wr_id < self.bufs).then(|| RecvBuf::mint(c.wr_id as u32))))
    }

    fn size_hint(&self) -> (usize, Option<usize>) {
        self.done.size_hint()
    }
}
