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

/// Online CPUs from sysfs ("0-15,32-47").
pub fn online_cpus() -> Vec<usize> {
    let s = std::fs::read_to_string("/sys/devices/system/cpu/online").unwrap_or_default();
    let mut v = Vec::new();
    for part in s.trim().split(',').filter(|p| !p.is_empty()) {
        let (a, b) = part.split_once('-').unwrap_or((part, part));
        if let (Ok(a), Ok(b)) = (a.parse::<usize>(), b.parse::<usize>()) {
            v.extend(a..=b);
        }
    }
    v
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

/// When the calling thread is pinned to one CPU (it was spawned by the pinned polling thread),
/// let it run on every other CPU instead, so it never takes the polling core. Returns the CPU
/// it left, if any. Used by the mapped-file run's registration threads (feature `cuda`).
#[cfg(feature = "cuda")]
pub fn leave_single_cpu() -> Option<usize> {
    let size = std::mem::size_of::<libc::cpu_set_t>();
    // SAFETY: cpu_set_t is plain data; zeroed is the empty set.
    let mut set: libc::cpu_set_t = unsafe { std::mem::zeroed() };
    // SAFETY: pid 0 = calling thread; `set` is a valid cpu_set_t of the size passed.
    if unsafe { libc::sched_getaffinity(0, size, &mut set) } != 0 {
        return None;
    }
    // SAFETY: `set` is a valid cpu_set_t.
    if unsafe { libc::CPU_COUNT(&set) } != 1 {
        return None;
    }
    // SAFETY: every index is < CPU_SETSIZE, inside `set`.
    let only = (0..libc::CPU_SETSIZE as usize).find(|&c| unsafe { libc::CPU_ISSET(c, &set) })?;
    // SAFETY: sysconf has no preconditions.
    let n = unsafe { libc::sysconf(libc::_SC_NPROCESSORS_CONF) }.max(1) as usize;
    if n < 2 {
        return None;
    }
    // SAFETY: cpu_set_t is plain data; zeroed is the empty set.
    let mut others: libc::cpu_set_t = unsafe { std::mem::zeroed() };
    for c in (0..n.min(libc::CPU_SETSIZE as usize)).filter(|&c| c != only) {
        // SAFETY: c < CPU_SETSIZE, so the bit lies inside `others`.
        unsafe { libc::CPU_SET(c, &mut others) };
    }
    // SAFETY: pid 0 = calling thread; `others` is a valid cpu_set_t of the size passed.
    (unsafe { libc::sched_setaffinity(0, size, &others) } == 0).then_some(only)
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

    #[test]
    fn online_cpu_list_parses() {
        let cpus = online_cpus();
        assert!(!cpus.is_empty());
        assert!(cpus.windows(2).all(|w| w[0] < w[1]));
    }

    #[test]
    #[cfg(feature = "cuda")]
    fn a_thread_pinned_to_one_cpu_moves_off_it() {
        // SAFETY: sysconf has no preconditions.
        if unsafe { libc::sysconf(libc::_SC_NPROCESSORS_ONLN) } < 2 {
            return;
        }
        std::thread::spawn(|| {
            // SAFETY: sched_getcpu has no preconditions.
            let cpu = unsafe { libc::sched_getcpu() } as usize;
            ubdirect_core::util::pin_to_core(cpu).unwrap();
            assert_eq!(leave_single_cpu(), Some(cpu));
            for _ in 0..1000 {
                // SAFETY: as above.
                assert_ne!(unsafe { libc::sched_getcpu() } as usize, cpu);
                std::thread::yield_now();
            }
        })
        .join()
        .unwrap();
    }
}
