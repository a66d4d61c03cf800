//! Pinning the calling thread to one CPU.

/// Pin the calling thread to `core` (sched_setaffinity). The error names the core and what to
/// check.
pub fn pin_to_core(core: usize) -> Result<(), String> {
    if core >= libc::CPU_SETSIZE as usize {
        return Err(format!(
            "core {core} is beyond CPU_SETSIZE ({})",
            libc::CPU_SETSIZE
        ));
    }
    // SAFETY: cpu_set_t is plain data; zeroed is the empty set.
    let mut set: libc::cpu_set_t = unsafe { std::mem::zeroed() };
    // SAFETY: `core` < CPU_SETSIZE (checked above), so the bit lies inside `set`.
    unsafe { libc::CPU_SET(core, &mut set) };
    // SAFETY: pid 0 = calling thread; `set` is a valid cpu_set_t of the size passed.
    let rc = unsafe { libc::sched_setaffinity(0, std::mem::size_of::<libc::cpu_set_t>(), &set) };
    if rc != 0 {
        let e = std::io::Error::last_os_error();
        let ncpu = std::thread::available_parallelism().map_or(1, |n| n.get());
        return Err(format!(
            "cannot pin to core {core}: {e} (does the CPU exist and is it in this cpuset? this \
             process may use {ncpu} CPUs: `taskset -p $$` lists them)"
        ));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pin_to_an_impossible_core_fails() {
        let e = pin_to_core(100_000).unwrap_err();
        assert!(e.contains("core 100000"), "{e}");
    }

    #[test]
    fn pin_to_a_cpu_we_run_on_works() {
        // SAFETY: sched_getcpu has no preconditions.
        let cpu = unsafe { libc::sched_getcpu() };
        assert!(cpu >= 0);
        pin_to_core(cpu as usize).unwrap();
    }
}
