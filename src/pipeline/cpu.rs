//! Pinning the polling thread to a core, the core's NUMA node, and process CPU time.

use std::time::Duration;

/// Pin the calling thread to `core` (sched_setaffinity).
pub fn pin_to_core(core: usize) -> Result<(), String> {
    let ncpu = std::thread::available_parallelism()
        .map(|n| n.get())
        .unwrap_or(1);
    if core >= libc::CPU_SETSIZE as usize {
        return Err(format!("--core {core} is beyond CPU_SETSIZE"));
    }
    // SAFETY: cpu_set_t is plain data; zeroed is the empty set.
    let mut set: libc::cpu_set_t = unsafe { std::mem::zeroed() };
    // SAFETY: `core` < CPU_SETSIZE (checked above), so the bit lies inside `set`.
    unsafe { libc::CPU_SET(core, &mut set) };
    // SAFETY: pid 0 = calling thread; `set` is a valid cpu_set_t of the size passed.
    let rc = unsafe { libc::sched_setaffinity(0, std::mem::size_of::<libc::cpu_set_t>(), &set) };
    if rc != 0 {
        let e = std::io::Error::last_os_error();
        return Err(format!("cannot pin to core {core}: {e} (this process may use {ncpu} CPUs; pick one listed by `taskset -p $$`)"));
    }
    Ok(())
}

/// The NUMA node a CPU belongs to (sysfs), if known.
pub fn numa_node_of_cpu(core: usize) -> Option<u32> {
    let dir = std::fs::read_dir(format!("/sys/devices/system/cpu/cpu{core}")).ok()?;
    dir.filter_map(|e| e.ok())
        .filter_map(|e| {
            e.file_name()
                .to_str()
                .and_then(|n| n.strip_prefix("node"))
                .and_then(|n| n.parse().ok())
        })
        .next()
}

/// User + system CPU time of the whole process (all threads, io-wq workers included).
pub fn process_cpu_time() -> Duration {
    // SAFETY: rusage is plain data, filled by getrusage.
    let mut ru: libc::rusage = unsafe { std::mem::zeroed() };
    // SAFETY: RUSAGE_SELF with a valid out pointer.
    unsafe { libc::getrusage(libc::RUSAGE_SELF, &mut ru) };
    let tv = |t: libc::timeval| Duration::new(t.tv_sec as u64, (t.tv_usec as u32) * 1000);
    tv(ru.ru_utime) + tv(ru.ru_stime)
}

/// A cycle counter for the completion-handling cost (TSC on x86_64, nanoseconds elsewhere).
#[inline]
pub fn cycles() -> u64 {
    #[cfg(target_arch = "x86_64")]
    {
        // SAFETY: RDTSC has no preconditions on x86_64.
        unsafe { core::arch::x86_64::_rdtsc() }
    }
    #[cfg(not(target_arch = "x86_64"))]
    {
        use std::sync::OnceLock;
        static T0: OnceLock<std::time::Instant> = OnceLock::new();
        T0.get_or_init(std::time::Instant::now).elapsed().as_nanos() as u64
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cpu_time_grows_with_work() {
        let a = process_cpu_time();
        let mut x = 0u64;
        let t = std::time::Instant::now();
        while t.elapsed() < Duration::from_millis(30) {
            x = std::hint::black_box(x.wrapping_add(1));
        }
        assert!(process_cpu_time() > a);
        assert!(cycles() > 0);
    }

    #[test]
    fn pin_to_an_impossible_core_fails() {
        assert!(pin_to_core(100_000).is_err());
    }
}
