//! End-to-end test harness (filled in by the next commit).
