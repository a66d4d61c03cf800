//! The polling core's NUMA node and process CPU time (pinning: `ubdirect_core::util`).

use std::time::Duration;

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
        assert!(ubdirect_core::util::rdtsc() > 0);
    }
}
