//! `--pin` pins the client (this thread) and, if given, the server; every other thread the
//! benchmark starts — the server's workers and control threads, the HAL-level server thread —
//! must not inherit the client's CPU. Threads inherit their creator's mask, so the mask the
//! process started with is saved before anything is pinned and restored around the code that
//! spawns them.

use std::sync::OnceLock;

static ORIGINAL: OnceLock<Mask> = OnceLock::new();

struct Mask(libc::cpu_set_t);

impl Mask {
    fn current() -> std::io::Result<Mask> {
        // SAFETY: cpu_set_t is plain data; all-zero is a valid empty set.
        let mut set: libc::cpu_set_t = unsafe { std::mem::zeroed() };
        // SAFETY: pid 0 is the calling thread; `set` is a writable cpu_set_t of the size passed.
        let rc = unsafe { libc::sched_getaffinity(0, std::mem::size_of::<libc::cpu_set_t>(), &mut set) };
        if rc != 0 {
            return Err(std::io::Error::last_os_error());
        }
        Ok(Mask(set))
    }

    fn apply(&self) -> std::io::Result<()> {
        // SAFETY: pid 0 is the calling thread; `self.0` is a valid cpu_set_t of the size passed.
        let rc = unsafe { libc::sched_setaffinity(0, std::mem::size_of::<libc::cpu_set_t>(), &self.0) };
        if rc != 0 {
            return Err(std::io::Error::last_os_error());
        }
        Ok(())
    }
}

/// Saves the calling thread's mask as the process's unpinned mask. Call once, first thing.
pub fn save_original() {
    if let Ok(m) = Mask::current() {
        let _ = ORIGINAL.set(m);
    }
}

/// Gives the calling thread the mask the process started with (for a thread spawned after the
/// client was pinned that has no `--pin` CPU of its own).
fn unpin_current_thread() {
    if let Some(m) = ORIGINAL.get() {
        let _ = m.apply();
    }
}

/// First thing in a server thread the benchmark spawns: pins it to `--pin`'s server CPU, or
/// gives it the process's original mask.
pub fn place_server_thread(cpu: Option<usize>) -> Result<(), String> {
    match cpu {
        Some(cpu) => bypass::pin_current_thread(cpu).map_err(|e| format!("--pin: CPU {cpu}: {e}")),
        None => {
            unpin_current_thread();
            Ok(())
        }
    }
}

/// Runs `f` with the calling thread unpinned, so that the threads `f` spawns start unpinned,
/// then gives the thread back its mask.
pub fn unpinned<T>(f: impl FnOnce() -> T) -> T {
    let (Some(original), Ok(now)) = (ORIGINAL.get(), Mask::current()) else {
        return f();
    };
    let _ = original.apply();
    let out = f();
    let _ = now.apply();
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cpus_of_current_thread() -> usize {
        // SAFETY: CPU_COUNT reads a valid cpu_set_t.
        unsafe { libc::CPU_COUNT(&Mask::current().unwrap().0) as usize }
    }

    #[test]
    fn threads_spawned_inside_unpinned_do_not_inherit_the_pin() {
        std::thread::spawn(|| {
            save_original();
            let all = cpus_of_current_thread();
            bypass::pin_current_thread(0).unwrap();
            assert_eq!(cpus_of_current_thread(), 1);
            let inherited = unpinned(|| std::thread::spawn(cpus_of_current_thread).join().unwrap());
            assert_eq!(inherited, all, "a thread spawned in unpinned() has the original mask");
            assert_eq!(cpus_of_current_thread(), 1, "the caller keeps its pin");
            let pinned = std::thread::spawn(cpus_of_current_thread).join().unwrap();
            assert_eq!(pinned, 1, "outside unpinned() threads inherit the pin (what the fix avoids)");
        })
        .join()
        .unwrap();
    }
}
