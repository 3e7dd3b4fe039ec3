//! The controller process's own figures, in the standard `process_*` names
//! every Prometheus client exports: resident and virtual memory, CPU seconds,
//! open and maximum file descriptors, threads, start time. The operations
//! guide sizes the controller's memory by the fleet; these let an operator
//! check it. Read from /proc/self at each scrape by the `prometheus` crate's
//! `ProcessCollector` (Linux only; elsewhere there is nothing to export).

use super::family::Families;

/// Registers the process collector in the controller's registry.
pub(super) fn register(families: &mut Families) {
    #[cfg(target_os = "linux")]
    families.register_collector(
        "process_*",
        Box::new(prometheus::process_collector::ProcessCollector::for_self()),
    );
    #[cfg(not(target_os = "linux"))]
    let _ = families;
}

#[cfg(all(test, target_os = "linux"))]
mod tests {
    use super::super::Metrics;
    use super::super::text_parser::{parse, value};

    /// A scrape carries the process's memory, CPU, fds and threads, with
    /// plausible values for a running test binary.
    #[test]
    fn a_scrape_has_the_process_metrics() {
        let m = Metrics::new("test");
        let (_, body) = m.encode();
        let samples = parse(&String::from_utf8(body).expect("utf-8")).0;
        let rss = value(&samples, "process_resident_memory_bytes", &[]).unwrap_or(0.0);
        assert!(rss > 1_000_000.0, "resident memory {rss}");
        for name in [
            "process_cpu_seconds_total",
            "process_open_fds",
            "process_max_fds",
            "process_threads",
            "process_virtual_memory_bytes",
            "process_start_time_seconds",
        ] {
            assert!(value(&samples, name, &[]).is_some(), "{name} missing");
        }
        let threads = value(&samples, "process_threads", &[]).unwrap_or(0.0);
        assert!(threads >= 1.0, "threads {threads}");
    }
}
