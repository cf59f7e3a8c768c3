//! virt-api (work in progress).
