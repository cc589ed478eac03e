//! The function ids the stack's test servers register, one set for every binary: what each
//! does is the same wherever it is registered ([`super::rig::Rig`] registers all but the last
//! few, which a binary registers itself).

use bypass::FunctionId;

/// Function `method` of the tests' service.
pub const fn fid(method: u32) -> FunctionId {
    match FunctionId::new(0x10, 0x1, true, method) {
        Some(f) => f,
        None => panic!("bad function id"),
    }
}

/// Echoes its arguments.
pub const ECHO: FunctionId = fid(1);
/// Hands the request to the test without replying; the call stays outstanding until the test
/// answers or drops it.
pub const HOLD: FunctionId = fid(2);
/// Replies with the largest response the client accepts (bytes 0, 1, 2, ... mod 256).
pub const BIG: FunctionId = fid(3);
/// Hands the request to another thread and returns only once that thread says it has replied
/// (a handler offloading to a pool and waiting for it).
pub const OFFLOAD: FunctionId = fid(4);
/// Panics while it still holds the request.
pub const PANIC: FunctionId = fid(5);
/// Echoes, then panics (the reply is already on its way).
pub const PANIC_AFTER_REPLY: FunctionId = fid(6);
/// Replies with `reply_with` whose fill closure panics.
pub const PANIC_IN_FILL: FunctionId = fid(7);
/// Hands the request to the test (like HOLD), then panics.
pub const PANIC_AFTER_MOVE: FunctionId = fid(8);
/// Answers with something about the connection (its context, 8 bytes little-endian).
pub const CONTEXT: FunctionId = fid(10);
/// Answers with the descriptor of a region the server exposes for one-sided I/O.
pub const REGION: FunctionId = fid(11);
/// Registered by no test server.
pub const MISSING: FunctionId = fid(99);
