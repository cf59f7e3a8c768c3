//! testkit (work in progress).
