//! The `bypass-conns` binary end to end: short runs print one row per count in which every call
//! worked and the channels added one thread (the process's control loop) whatever their number;
//! a bad count exits with status 2 and one error line.

use std::process::Command;

fn conns(args: &[&str]) -> std::process::Output {
    Command::new(env!("CARGO_BIN_EXE_bypass-conns")).args(args).output().expect("run bypass-conns")
}

#[test]
fn every_call_works_and_channels_cost_no_thread() {
    let o = conns(&["1", "30"]);
    let (out, err) = (String::from_utf8_lossy(&o.stdout), String::from_utf8_lossy(&o.stderr));
    assert!(o.status.success(), "bypass-conns failed: {err}\n{out}");
    let rows: Vec<Vec<&str>> = out
        .lines()
        .map(|l| l.split_whitespace().collect::<Vec<_>>())
        .filter(|c| c.first().is_some_and(|n| n.parse::<usize>().is_ok()))
        .collect();
    assert_eq!(rows.len(), 2, "one row per count:\n{out}");
    for (row, n) in rows.iter().zip(["1", "30"]) {
        assert_eq!(row[0], n, "{out}");
        assert_eq!(row[2], "1", "{n} channels add one thread (the control loop):\n{out}");
        assert!(row.contains(&format!("{n}/{n}").as_str()), "every call works:\n{out}");
    }
}

#[test]
fn a_bad_count_is_refused() {
    let o = conns(&["0"]);
    assert_eq!(o.status.code(), Some(2));
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(err.contains("`0` is not a connection count"), "{err}");
    assert!(!err.contains("panicked"), "{err}");
}
