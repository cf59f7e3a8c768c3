//! virt-launcher (work in progress).
