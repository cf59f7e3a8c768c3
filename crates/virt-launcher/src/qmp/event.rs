//! QMP events as the launcher cares about them.

use serde_json::Value;

/// One asynchronous QMP event.
#[derive(Debug, Clone, PartialEq)]
pub struct QmpEvent {
    /// The event name, e.g. `SHUTDOWN`.
    pub name: String,
    /// The event's `data` (`null` when absent).
    pub data: Value,
    /// QEMU's timestamp in microseconds since the epoch.
    pub timestamp_micros: u64,
}

/// The events the launcher reacts to, decoded.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum QmpEventKind {
    /// QEMU is shutting the machine down; `guest` tells whether the guest asked for it,
    /// `reason` is QEMU's (`guest-shutdown`, `host-qmp-quit`, `host-signal` …).
    Shutdown {
        /// The guest initiated it (ACPI S5, `poweroff`).
        guest: bool,
        /// QEMU's shutdown cause.
        reason: String,
    },
    /// The ACPI power button was pressed (`system_powerdown`).
    Powerdown,
    /// The vCPUs stopped.
    Stop,
    /// The vCPUs resumed.
    Resume,
    /// The machine reset.
    Reset {
        /// The guest initiated it.
        guest: bool,
    },
    /// A device is gone after `device_del`.
    DeviceDeleted {
        /// The device id, when it had one.
        device: Option<String>,
    },
    /// The guest reported a panic (pvpanic).
    GuestPanicked,
    /// A memory device (virtio-mem) now plugs `size` bytes into the guest.
    MemoryDeviceSizeChange {
        /// The device id, when it had one.
        device: Option<String>,
        /// Bytes plugged now.
        size: u64,
    },
    /// The guest opened or closed a virtio-serial port (`VSERPORT_CHANGE`).
    SerialPortChange {
        /// The port's device id.
        id: String,
        /// Whether the guest has it open now.
        open: bool,
    },
    /// Any other event.
    Other,
}

impl QmpEvent {
    /// Parses an event message; `None` when `message` is not an event.
    pub(crate) fn from_message(message: &Value) -> Option<Self> {
        let name = message.get("event")?.as_str()?.to_owned();
        let ts = message.get("timestamp");
        let part = |key| {
            ts.and_then(|t| t.get(key))
                .and_then(Value::as_u64)
                .unwrap_or(0)
        };
        Some(Self {
            name,
            data: message.get("data").cloned().unwrap_or(Value::Null),
            timestamp_micros: part("seconds") * 1_000_000 + part("microseconds"),
        })
    }

    /// The decoded event.
    pub fn kind(&self) -> QmpEventKind {
        let flag = |key| self.data.get(key).and_then(Value::as_bool).unwrap_or(false);
        match self.name.as_str() {
            "SHUTDOWN" => QmpEventKind::Shutdown {
                guest: flag("guest"),
                reason: self
                    .data
                    .get("reason")
                    .and_then(Value::as_str)
                    .unwrap_or_default()
                    .to_owned(),
            },
            "POWERDOWN" => QmpEventKind::Powerdown,
            "STOP" => QmpEventKind::Stop,
            "RESUME" => QmpEventKind::Resume,
            "RESET" => QmpEventKind::Reset {
                guest: flag("guest"),
            },
            "DEVICE_DELETED" => QmpEventKind::DeviceDeleted {
                device: self
                    .data
                    .get("device")
                    .and_then(Value::as_str)
                    .map(str::to_owned),
            },
            "GUEST_PANICKED" => QmpEventKind::GuestPanicked,
            "MEMORY_DEVICE_SIZE_CHANGE" => QmpEventKind::MemoryDeviceSizeChange {
                device: self
                    .data
                    .get("id")
                    .and_then(Value::as_str)
                    .map(str::to_owned),
                size: self.data.get("size").and_then(Value::as_u64).unwrap_or(0),
            },
            "VSERPORT_CHANGE" => QmpEventKind::SerialPortChange {
                id: self
                    .data
                    .get("id")
                    .and_then(Value::as_str)
                    .unwrap_or_default()
                    .to_owned(),
                open: flag("open"),
            },
            _ => QmpEventKind::Other,
        }
    }
}
