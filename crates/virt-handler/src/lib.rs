//! virt-handler (work in progress).
