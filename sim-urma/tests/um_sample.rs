//! `c/um_sample.c`, written only against `include/urma_api.h`, compiled with the system `cc` and
//! run on the built library as two processes over the shared-memory and the UDP wire, in UM and in
//! RM mode: connectionless jettys (one jetty sending to two targets in one WR list, `wr->tjetty`
//! per send, WRITE and READ, receive records naming the sender, a reply to the sender), the
//! refusals around them (bind, no target, a target of the other mode) and, in RM, a SEND posted
//! before its target has a receive, which RM must deliver (UM drops it).

mod common;

use common::*;

fn two_processes(wire: &str, tag: &str, mode: &str) {
    let dir = lib_dir(tag);
    let exe = build_c(&dir, "um_sample", &["um_sample.c"]);
    server_and_client(&exe, &dir, wire, &[mode], &[mode], mode);
}

#[test]
fn um_jettys_send_to_two_targets_and_name_the_sender_on_the_shm_wire() {
    two_processes("shm,engine=threaded", "um-shm", "um");
}

#[test]
fn um_jettys_send_to_two_targets_and_name_the_sender_on_the_udp_wire() {
    two_processes("udp://127.0.0.1:0,engine=threaded", "um-udp", "um");
}

#[test]
fn rm_jettys_deliver_a_send_posted_before_its_receive_on_the_shm_wire() {
    two_processes("shm,engine=threaded", "rm-shm", "rm");
}

#[test]
fn rm_jettys_deliver_a_send_posted_before_its_receive_on_the_udp_wire() {
    two_processes("udp://127.0.0.1:0,engine=threaded", "rm-udp", "rm");
}
