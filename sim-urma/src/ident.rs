//! Names on the simulated NIC in URMA terms: EIDs from NIC addresses, jetty ids from queue
//! numbers, the first PSN both ends derive from a jetty id, and the segment token check.
//!
//! - **EID.** A NIC's EID is the GID its queues carry (`SimNic::endpoint`), so a peer that knows
//!   the EID (and the uasid that always travels with it) knows how to reach the NIC. On the UDP
//!   wire the EID is the IPv4-mapped address (`::ffff:a.b.c.d`, what `urma_u32_to_eid` builds,
//!   reserved bits zero) and the context's uasid is the NIC's UDP port; on the shared-memory and
//!   in-process wires it is the sim's own GID and the uasid the process's.
//! - **Jetty id.** `qpn | generation << 24`: the sim queue number (24 bits; the sim reuses numbers
//!   of destroyed queues with a generation of their own in bits 16..24) and 8 bits of a
//!   per-context counter, so an id is not reused by the next jetties and is never 0.
//! - **PSN.** A URMA peer learns only `{eid, uasid, id}` of a jetty, never a PSN; both ends derive
//!   the jetty's first PSN from those with [`psn_of`], and the library sets it on the sim queue.
//! - **Token.** The public `seg.token_id` is the sim's key XOR [`mix`] of the token value; an
//!   importer presents `token_id XOR mix(its token)`. `mix` is a bijection, so any token but the
//!   right one yields a key other than the segment's: the sim's key table refuses it (or it names
//!   another registration, whose range cannot contain this segment's addresses unless the same
//!   memory is registered twice), and the work request completes with REM_ACCESS_ABORT_ERR.

/// murmur3's finaliser: a bijection on `u32` that spreads every input bit.
pub(crate) const fn fmix(mut h: u32) -> u32 {
    h ^= h >> 16;
    h = h.wrapping_mul(0x85eb_ca6b);
    h ^= h >> 13;
    h = h.wrapping_mul(0xc2b2_ae35);
    h ^ (h >> 16)
}

/// The token mask of the segment token check.
pub(crate) const fn mix(token: u32) -> u32 {
    fmix(token ^ 0x5eed_07a1)
}

/// The first PSN of the jetty `{eid, uasid, id}` (24 bits).
pub(crate) fn psn_of(eid: &[u8; 16], uasid: u32, id: u32) -> u32 {
    let mut h = fmix(id ^ 0x0b5e_ed00);
    for c in eid.chunks_exact(4) {
        h = fmix(h ^ u32::from_le_bytes([c[0], c[1], c[2], c[3]]));
    }
    fmix(h ^ uasid) & 0x00ff_ffff
}

/// The EID and uasid of a NIC whose queues carry `gid` and `lid`, for a process whose uasid is
/// `uasid`. On the UDP wire the EID is the IPv4-mapped address alone (reserved bits zero, as
/// URPC's device lookup requires of an IPv4 EID) and the uasid is the NIC's UDP port: every
/// URMA exchange of a jetty or segment carries both (`urma_jetty_id_t`, `urma_ubva_t`).
pub(crate) fn eid_of(gid: [u8; 16], lid: u16, uasid: u32) -> ([u8; 16], u32) {
    if is_v4_mapped(&gid) {
        (gid, u32::from(lid))
    } else {
        (gid, uasid)
    }
}

/// The `gid` and `lid` a peer's `QueueInfo` needs, from an EID and uasid [`eid_of`] made (an
/// IPv4-mapped EID with the port in bytes 4..6, the form of earlier versions, is taken too).
pub(crate) fn endpoint_of(eid: &[u8; 16], uasid: u32) -> Result<([u8; 16], u16), String> {
    let mut gid = *eid;
    gid[4..6].fill(0);
    if !is_v4_mapped(&gid) {
        return Ok((*eid, 0));
    }
    let old = u16::from_be_bytes([eid[4], eid[5]]);
    if old != 0 {
        return Ok((gid, old));
    }
    match u16::try_from(uasid) {
        Ok(port) if port != 0 => Ok((gid, port)),
        _ => Err(format!(
            "uasid {uasid:#x} with the IPv4 EID ::ffff:{}.{}.{}.{}: on the UDP wire a jetty's uasid is its \
             device's UDP port (1..=65535); pass the peer's ctx->uasid along with its EID",
            eid[12], eid[13], eid[14], eid[15]
        )),
    }
}
/// `::ffff:a.b.c.d` with every other byte zero.
fn is_v4_mapped(g: &[u8; 16]) -> bool {
    g[..10].iter().all(|&b| b == 0) && g[10] == 0xff && g[11] == 0xff
}

/// Jetty id from a queue number and a generation.
pub(crate) fn jetty_id(qpn: u32, generation: u32) -> u32 {
    (qpn & 0x00ff_ffff) | (generation.max(1) & 0xff) << 24
}

/// The sim queue number inside a jetty id.
pub(crate) fn qpn_of(id: u32) -> u32 {
    id & 0x00ff_ffff
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn udp_eids_are_ipv4_mapped_and_the_port_rides_in_the_uasid() {
        let mut v4 = [0u8; 16];
        v4[10] = 0xff;
        v4[11] = 0xff;
        v4[12..].copy_from_slice(&[127, 0, 0, 1]);
        let (eid, uasid) = eid_of(v4, 7001, 42);
        assert_eq!((eid, uasid), (v4, 7001), "the EID is ::ffff:127.0.0.1 exactly");
        assert_eq!(endpoint_of(&eid, uasid), Ok((v4, 7001)));
        let mut old = v4;
        old[4..6].copy_from_slice(&7002u16.to_be_bytes());
        assert_eq!(endpoint_of(&old, 0), Ok((v4, 7002)), "the earlier form still resolves");
        assert!(endpoint_of(&v4, 0x1_0000).is_err() && endpoint_of(&v4, 0).is_err());
        let sim = *b"bsm\x03\x01\x02\x03\x04\0\0\0\x01\0\0\0\x02";
        assert_eq!(eid_of(sim, 0, 42), (sim, 42));
        assert_eq!(endpoint_of(&sim, 42), Ok((sim, 0)));
    }

    #[test]
    fn the_token_mask_is_a_bijection_on_a_sample_and_psns_differ() {
        let mut seen = std::collections::HashSet::new();
        for t in 0..100_000u32 {
            assert!(seen.insert(mix(t)), "mix({t}) collided");
        }
        assert_ne!(psn_of(&[1; 16], 5, jetty_id(3, 1)), psn_of(&[1; 16], 5, jetty_id(3, 2)));
        assert_eq!(qpn_of(jetty_id(0x1234, 9)), 0x1234);
        assert_eq!(qpn_of(jetty_id(0x07_1234, 300)), 0x07_1234, "a reused sim number keeps its generation");
        assert_ne!(jetty_id(0, 0), 0);
    }
}
