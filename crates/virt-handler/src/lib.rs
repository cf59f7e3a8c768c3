//! virt-handler: the node agent. In embedded mode this crate also holds the scheduler and
//! the pod runner that play kube-scheduler and kubelet for launcher pods.

pub mod images;
pub mod launcher_spec;
pub mod podrunner;
pub mod scheduler;
