//! virt-controller (work in progress).
