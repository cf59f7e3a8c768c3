//! Guest memory: size, hotplug room (`maxGuest`) and huge-page backing.
//!
//! Sizes are rendered in MiB, so both must be whole MiB. When `maxGuest` is above
//! `guest`, `maxmem` leaves room for a virtio-mem device (upstream's memory hotplug device)
//! backed by `maxGuest - guest` of memory, which plugs `hotpluggedBytes` of it into the
//! guest; a running domain changes that with `qom-set … requested-size`. The backend is
//! reserved address space, not allocated memory: the guest touches only what is plugged.
//! Huge pages come from a `memory-backend-file` on the hugetlbfs mount, which the machine
//! then uses as its RAM (`-machine memory-backend=`, see the machine area); the hotplug
//! backend then comes from the same mount.

use super::{Args, ArgvError, absolute, escape};
use crate::spec::LauncherSpec;

const MIB: u64 = 1024 * 1024;
const BACKEND_ID: &str = "guest-ram";
const HOTPLUG_BACKEND_ID: &str = "guest-ram-hotplug";
/// The id of the virtio-mem device that plugs memory into a running guest.
pub const HOTPLUG_MEMORY_DEVICE: &str = "virtio-mem0";
/// Granularity of memory hotplug (upstream's alignment): 2 MiB, 1 GiB with 1 GiB huge pages.
pub fn hotplug_block_bytes(spec: &LauncherSpec) -> u64 {
    match &spec.memory.hugepages {
        Some(h) if h.page_size_bytes >= 1024 * MIB => 1024 * MIB,
        _ => 2 * MIB,
    }
}

/// The memory a virtio-mem device can plug into the guest (zero without memory hotplug).
pub fn hotplug_capacity_bytes(spec: &LauncherSpec) -> u64 {
    spec.memory
        .max_guest_bytes
        .map_or(0, |max| max.saturating_sub(spec.memory.guest_bytes))
}

/// Refuses a hotplug request the domain's virtio-mem device cannot plug.
pub fn check_hotplugged(spec: &LauncherSpec) -> Result<(), ArgvError> {
    let wanted = spec.memory.hotplugged_bytes;
    let capacity = hotplug_capacity_bytes(spec);
    let block = hotplug_block_bytes(spec);
    if wanted > capacity {
        return Err(ArgvError::Memory(format!(
            "{wanted} bytes of hotplugged memory exceed the {capacity} bytes between guest and maxGuest"
        )));
    }
    if !wanted.is_multiple_of(block) {
        return Err(ArgvError::Memory(format!(
            "hotplugged memory {wanted} is not a multiple of the {block}-byte hotplug block"
        )));
    }
    Ok(())
}

/// The id of the RAM backend object, when the spec needs one.
pub(super) fn backend_id(spec: &LauncherSpec) -> Option<&'static str> {
    spec.memory.hugepages.as_ref().map(|_| BACKEND_ID)
}

pub(super) fn push(spec: &LauncherSpec, args: &mut Args) -> Result<(), ArgvError> {
    let memory = &spec.memory;
    let guest = memory.guest_bytes;
    if guest == 0 || !guest.is_multiple_of(MIB) {
        return Err(ArgvError::Memory(format!(
            "guest memory {guest} is not a whole number of MiB"
        )));
    }
    let mut value = format!("size={}M", guest / MIB);
    match memory.max_guest_bytes {
        Some(max) if max < guest => {
            return Err(ArgvError::Memory(format!(
                "maxGuest {max} is below guest {guest}"
            )));
        }
        Some(max) if max > guest => {
            if !max.is_multiple_of(MIB) {
                return Err(ArgvError::Memory(format!(
                    "maxGuest {max} is not a whole number of MiB"
                )));
            }
            value.push_str(&format!(",maxmem={}M", max / MIB));
        }
        _ => {}
    }
    args.push_pair("-m", value);
    let capacity = hotplug_capacity_bytes(spec);
    if capacity > 0 {
        let block = hotplug_block_bytes(spec);
        if !capacity.is_multiple_of(block) {
            return Err(ArgvError::Memory(format!(
                "maxGuest minus guest ({capacity} bytes) is not a multiple of the {block}-byte hotplug block"
            )));
        }
        check_hotplugged(spec)?;
        let backend = match &memory.hugepages {
            Some(huge) => format!(
                "memory-backend-file,id={HOTPLUG_BACKEND_ID},size={}M,mem-path={},share=off",
                capacity / MIB,
                escape(&huge.mount_path)
            ),
            None => format!(
                "memory-backend-ram,id={HOTPLUG_BACKEND_ID},size={}M",
                capacity / MIB
            ),
        };
        args.push_pair("-object", backend);
        args.push_pair(
            "-device",
            format!(
                "virtio-mem-pci,id={HOTPLUG_MEMORY_DEVICE},memdev={HOTPLUG_BACKEND_ID},block-size={block},requested-size={}",
                memory.hotplugged_bytes
            ),
        );
    } else if memory.hotplugged_bytes > 0 {
        return Err(ArgvError::Memory(
            "hotplugged memory needs maxGuest above guest".into(),
        ));
    }
    if let Some(huge) = &memory.hugepages {
        let page = huge.page_size_bytes;
        if page == 0 || !page.is_power_of_two() || !guest.is_multiple_of(page) {
            return Err(ArgvError::Memory(format!(
                "guest memory {guest} is not a multiple of the huge page size {page}"
            )));
        }
        absolute("hugepages mount", &huge.mount_path)?;
        args.push_pair(
            "-object",
            format!(
                "memory-backend-file,id={BACKEND_ID},size={}M,mem-path={},prealloc=on,share=off",
                guest / MIB,
                escape(&huge.mount_path)
            ),
        );
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::super::{qemu_argv, tests::minimal_spec};
    use super::*;
    use crate::spec::Hugepages;

    #[test]
    fn max_guest_below_guest_is_refused() {
        let mut spec = minimal_spec();
        spec.memory.max_guest_bytes = Some(spec.memory.guest_bytes - MIB);
        assert!(matches!(qemu_argv(&spec), Err(ArgvError::Memory(m)) if m.contains("below")));
    }

    #[test]
    fn max_guest_above_guest_adds_a_virtio_mem_device_plugging_the_hotplugged_memory() {
        let mut spec = minimal_spec();
        spec.memory.guest_bytes = 1024 * MIB;
        spec.memory.max_guest_bytes = Some(4096 * MIB);
        spec.memory.hotplugged_bytes = 128 * MIB;
        let argv = qemu_argv(&spec).unwrap();
        assert!(
            argv.contains(&"size=1024M,maxmem=4096M".to_owned()),
            "{argv:?}"
        );
        assert!(
            argv.contains(&"memory-backend-ram,id=guest-ram-hotplug,size=3072M".to_owned()),
            "{argv:?}"
        );
        assert!(
            argv.contains(
                &"virtio-mem-pci,id=virtio-mem0,memdev=guest-ram-hotplug,block-size=2097152,requested-size=134217728"
                    .to_owned()
            ),
            "{argv:?}"
        );
    }

    #[test]
    fn hotplugged_memory_beyond_max_guest_or_off_the_block_is_refused() {
        let mut spec = minimal_spec();
        spec.memory.guest_bytes = 1024 * MIB;
        spec.memory.max_guest_bytes = Some(2048 * MIB);
        spec.memory.hotplugged_bytes = 2048 * MIB;
        assert!(matches!(qemu_argv(&spec), Err(ArgvError::Memory(m)) if m.contains("exceed")));
        spec.memory.hotplugged_bytes = MIB;
        assert!(matches!(qemu_argv(&spec), Err(ArgvError::Memory(m)) if m.contains("block")));
        spec.memory.max_guest_bytes = None;
        assert!(matches!(qemu_argv(&spec), Err(ArgvError::Memory(m)) if m.contains("maxGuest")));
    }

    #[test]
    fn max_guest_equal_to_guest_adds_no_hotplug_slots() {
        let mut spec = minimal_spec();
        spec.memory.max_guest_bytes = Some(spec.memory.guest_bytes);
        let argv = qemu_argv(&spec).unwrap();
        assert!(argv.contains(&"size=128M".to_owned()), "{argv:?}");
    }

    #[test]
    fn memory_that_is_not_whole_mebibytes_is_refused() {
        let mut spec = minimal_spec();
        spec.memory.guest_bytes = 128 * MIB + 512;
        assert!(matches!(qemu_argv(&spec), Err(ArgvError::Memory(_))));
    }

    #[test]
    fn huge_pages_must_divide_guest_memory() {
        let mut spec = minimal_spec();
        spec.memory.guest_bytes = 1000 * MIB;
        spec.memory.hugepages = Some(Hugepages {
            page_size_bytes: 1024 * MIB,
            mount_path: "/dev/hugepages1G".into(),
        });
        assert!(matches!(qemu_argv(&spec), Err(ArgvError::Memory(_))));
    }
}
